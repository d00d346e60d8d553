"""KV folding's quality and bytes, measured: greedy output with folding
against without, and what a parked session stores at each context length.

Measurement, not product: nothing on the daemon's path imports this. Run
``python -m soldaemon_bench.kvfold [--holes N] [--thresholds ...]`` (the
agreement table behind the default threshold, docs/memory.md) or with
``--context N ...`` for the bytes table.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Sequence

from soldaemon.runtime.kv.fold import BLOCK, block_scores, fold, kv_bytes_per_token, unfold


def measure_agreement(engine: Any, holes: Sequence[Any], thresholds: Sequence[float], *,
                      tokens: int = 12, progress: Any = None) -> dict[float, dict[str, float]]:
    """For each hole: prefill its FIM prompt, decode ``tokens`` greedy
    tokens unfolded (the reference), then — as when the document is parked
    and comes back — fold the session's KV at each threshold (scored by the
    last decode step's queries, as the pool does), dequantize it, recompute
    the prompt's last token over it and decode again. Returns per threshold:
    ``agree`` (share of holes with identical tokens), ``fold_ratio`` (mean
    share of the KV stored folded) and ``holes``.

    ``engine``: a LocalEngine on a lean backend (its backend records queries
    here)."""
    from soldaemon.api import CompletionRequest
    from soldaemon.runtime.kv.session import KVSession

    backend = engine.backend
    backend.record_queries()
    session = KVSession(backend, cache=backend.new_cache())
    stats = {t: {"agree": 0.0, "fold_ratio": 0.0, "holes": 0.0} for t in thresholds}
    for h in holes:
        prompt, _ = engine.build_prompt(CompletionRequest(id="q", prefix=h.prefix, suffix=h.suffix,
                                                          max_tokens=tokens))
        ids = list(prompt.ids)
        ref = _greedy(session, ids, tokens)
        k, v = session.cache
        n = len(session.tokens)
        held = list(session.tokens)
        saved_k, saved_v = k[:, :, :n].clone(), v[:, :, :n].clone()
        scores = block_scores(k, backend.last_q, n, backend.scale)
        for t in thresholds:
            f = fold(k, v, n, scores, t)
            unfold(f, k, v)
            session.tokens = list(held)
            session.truncate(len(held))        # drops the cached logits: the last prompt token is recomputed
            got = _greedy(session, ids, tokens)
            s = stats[t]
            s["agree"] += float(got == ref)
            s["fold_ratio"] += f.folded_block_bytes() / max(1, f.trimmed_bytes())
            s["holes"] += 1
            k[:, :, :n] = saved_k
            v[:, :, :n] = saved_v
        session.truncate(0)
        if progress is not None:
            progress(f"hole {int(stats[thresholds[0]]['holes'])}/{len(holes)}: {len(ids)} prompt tokens, "
                     + " ".join(f"{t}:{int(stats[t]['agree'])}" for t in thresholds))
    for s in stats.values():
        if s["holes"]:
            s["agree"] /= s["holes"]
            s["fold_ratio"] /= s["holes"]
    backend.record_queries(False)
    return stats


def _greedy(session: Any, ids: list[int], n: int) -> list[int]:
    logits = session.prefill(ids).logits
    out: list[int] = []
    for _ in range(n):
        tok = int(logits.argmax())
        out.append(tok)
        logits = session.decode_step(tok)
    return out


def main(argv: list[str] | None = None) -> int:
    """python -m soldaemon_bench.kvfold [--holes N] [--thresholds ...]:
    the agreement table on the embedded model (the default threshold's
    evidence)."""
    import argparse

    from soldaemon.config import config_from_dict
    from soldaemon_bench.holes import cut_line_holes, default_corpus
    from soldaemon.weights.loader import load_model
    from soldaemon.runtime.engine.local import LocalEngine

    ap = argparse.ArgumentParser(description="KV folding: greedy agreement with unfolded output")
    ap.add_argument("--holes", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=12)
    ap.add_argument("--prefix-tokens", type=int, default=384)
    ap.add_argument("--thresholds", type=float, nargs="+", default=[0.01, 0.05, 0.1, 0.2, 0.5])
    ap.add_argument("--context", type=int, nargs="*", default=[],
                    help="instead: fold one session of this many tokens of real code; print the bytes")
    ap.add_argument("--max-context", type=int, default=16384, help="the full buffer the trimming saving is against")
    ap.add_argument("--repeats", type=int, default=3, help="with --context: fold/unfold timings, median of this many")
    args = ap.parse_args(argv)
    if args.context:
        try:
            return _bytes_table(args.context, args.thresholds, args.max_context, args.repeats)
        except ValueError as exc:     # a bad argument, found before or right after loading the model
            ap.error(str(exc))
    if args.holes < 1 or args.tokens < 1 or args.prefix_tokens < 1:
        ap.error(f"--holes, --tokens and --prefix-tokens must be >= 1, got {args.holes}, {args.tokens}, "
                 f"{args.prefix_tokens}")
    if not all(0.0 <= t <= 1.0 for t in args.thresholds):
        ap.error(f"--thresholds must be numbers in [0, 1], got {args.thresholds}")
    # room for the prompt (prefix + 64 suffix tokens), the completion and the greedy tokens
    config = config_from_dict({"model": {"max_prefix_tokens": args.prefix_tokens, "max_suffix_tokens": 64,
                                         "max_context": max(1024, args.prefix_tokens + 256 + args.tokens)},
                               "sol": {"kv_folding_entropy_threshold": 0.0}, "device": {"device": "cpu"}})
    engine = LocalEngine(load_model(None, device="cpu", dtype="auto", progress=False), config)
    holes = cut_line_holes(default_corpus(), args.holes, seed=5)
    t0 = time.perf_counter()
    stats = measure_agreement(engine, holes, args.thresholds, tokens=args.tokens,
                              progress=lambda line: print(line, file=sys.stderr, flush=True))
    print(f"{len(holes)} holes, {args.tokens} greedy tokens each, {time.perf_counter() - t0:.0f} s")
    print(f"{'threshold':>9} {'agree':>7} {'fold ratio':>10}")
    for t, s in stats.items():
        print(f"{t:>9} {s['agree']:>7.1%} {s['fold_ratio']:>10.1%}")
    return 0


def _bytes_table(contexts: list[int], thresholds: list[float], max_context: int, repeats: int = 3) -> int:
    """Prefill real code (standard-library sources) to each context length
    (one session, growing: each length's prefill continues the previous
    one), decode one token, fold at each threshold: bytes stored, measured,
    and the median over ``repeats`` of the time to score the blocks, fold
    and unfold (what a document switch pays)."""
    from soldaemon_bench.holes import default_corpus
    from soldaemon.weights.loader import load_model
    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.kv.session import KVSession

    contexts = sorted(set(contexts))
    if contexts[0] < BLOCK:
        raise ValueError(f"--context: each length must be >= {BLOCK} tokens (one block), got {contexts[0]}")
    if contexts[-1] > max_context:
        raise ValueError(f"--context {contexts[-1]} is longer than --max-context {max_context}: "
                         "the full buffer the saving is measured against must hold it")
    if repeats < 1:
        raise ValueError(f"--repeats must be >= 1, got {repeats}")
    if not thresholds or not all(0.0 <= t <= 1.0 for t in thresholds):
        raise ValueError(f"--thresholds must be numbers in [0, 1], got {thresholds}")
    loaded = load_model(None, device="cpu", dtype="auto", progress=False)
    limit = int(getattr(loaded.model.config, "max_position_embeddings", 0) or 0)
    if limit and contexts[-1] + 1 > limit:
        raise ValueError(f"--context {contexts[-1]}: the model was trained for {limit} positions")
    text = "".join(p.read_text(encoding="utf-8") for p in default_corpus())
    all_ids = loaded.tokenizer(text, add_special_tokens=False).input_ids
    if len(all_ids) < contexts[-1]:
        raise ValueError(f"--context {contexts[-1]}: the standard-library corpus has only {len(all_ids)} tokens")
    backend = LeanBackend(loaded.model, contexts[-1] + 8)
    backend.record_queries()
    session = KVSession(backend, chunk=512)
    mb = 2**20
    print(f"{'context':>7} {'threshold':>9} {'full buffer MB':>14} {'trimmed MB':>10} {'folded MB':>9} "
          f"{'saved by trim MB':>16} {'saved by fold MB':>16} {'fold ratio':>10} {'score ms':>8} "
          f"{'fold ms':>7} {'unfold ms':>9}", flush=True)
    t_start = time.perf_counter()
    for c in contexts:
        t0 = time.perf_counter()
        held = session.tokens[:-1] if session.tokens else []    # drop the previous length's decoded token
        session.truncate(len(held))
        logits = session.prefill(all_ids[:c]).logits
        session.decode_step(int(logits.argmax()))
        prefill_s = time.perf_counter() - t0
        k, v = session.cache
        n = len(session.tokens)
        per_tok = kv_bytes_per_token(k.shape[0], k.shape[1], k.shape[3], k.element_size())
        assert backend.last_q is not None
        saved_k, saved_v = k[:, :, :n].clone(), v[:, :, :n].clone()   # unfolding is lossy: restore after
        for t in thresholds:
            times: list[tuple[float, float, float]] = []
            for _ in range(repeats):
                t1 = time.perf_counter()
                scores = block_scores(k, backend.last_q, n, backend.scale)
                t2 = time.perf_counter()
                f = fold(k, v, n, scores, t)
                t3 = time.perf_counter()
                unfold(f, k, v)
                t4 = time.perf_counter()
                times.append(((t2 - t1) * 1e3, (t3 - t2) * 1e3, (t4 - t3) * 1e3))
                k[:, :, :n] = saved_k
                v[:, :, :n] = saved_v
            score_ms, fold_ms, unfold_ms = (sorted(x)[len(x) // 2] for x in zip(*times))
            full = per_tok * max_context
            print(f"{c:>7} {t:>9} {full / mb:>14.1f} {f.trimmed_bytes() / mb:>10.1f} {f.nbytes() / mb:>9.1f} "
                  f"{(full - f.trimmed_bytes()) / mb:>16.1f} {(f.trimmed_bytes() - f.nbytes()) / mb:>16.1f} "
                  f"{f.folded_block_bytes() / f.trimmed_bytes():>10.1%} {score_ms:>8.0f} {fold_ms:>7.0f} "
                  f"{unfold_ms:>9.0f}", flush=True)
        del saved_k, saved_v
        print(f"  (context {c}: {n} tokens held; prefill continued from the previous length + 1 decode step: "
              f"{prefill_s:.0f} s, {time.perf_counter() - t_start:.0f} s so far; {per_tok} KV bytes per token, "
              f"{loaded.dtype}; times: median of {repeats})", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
