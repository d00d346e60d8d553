"""KV folding: a parked session's KV stored compactly.

The active session's static KV buffer is the compute buffer and stays full
precision. A session parked in the :class:`~.session.SessionPool` LRU is
*folded*: cut to the tokens it holds (trimming), and each full block of
:data:`BLOCK` tokens, per layer and KV head, whose attention share is under
``sol.kv_folding_entropy_threshold`` is stored as int8 (keys with a scale
per channel, values with a scale per token, as KIVI does); blocks that
carry attention stay in the model's dtype, and so does the partial last
block. Acquiring the session again dequantizes into the compute buffer.
Without scores (the backend records no queries: the memory scheduler turns
that off while memory is not short, ``sol.kv_folding_free_below``) a parked
session is only trimmed, a plain copy.

A block's score is the attention mass the session's last query (per layer,
averaged over the query heads of a KV head) puts on it, divided by the
largest block's mass for that layer and head: 1.0 for the most attended
block, near 0 for blocks nobody looks at. Threshold 0 folds nothing;
threshold 1 folds every block but the most attended one.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from typing import Any, Sequence

import torch

BLOCK = 64  # tokens per block


@dataclass
class FoldedKV:
    """One parked session's KV: positions 0 … n-1 of every layer."""

    n: int                      # tokens held
    fold: torch.Tensor          # bool [L, KV, nb]: block stored as int8 (nb = n // BLOCK full blocks)
    k_full: torch.Tensor        # [kept, BLOCK, hd] model dtype, kept blocks in (layer, head, block) order
    v_full: torch.Tensor        # [kept, BLOCK, hd]
    k_q: torch.Tensor           # int8 [folded, BLOCK, hd]
    k_scale: torch.Tensor       # float32 [folded, 1, hd]: per channel
    v_q: torch.Tensor           # int8 [folded, BLOCK, hd]
    v_scale: torch.Tensor       # float32 [folded, BLOCK, 1]: per token
    k_tail: torch.Tensor        # [L, KV, n - nb*BLOCK, hd] model dtype (the partial last block)
    v_tail: torch.Tensor

    def nbytes(self) -> int:
        """Bytes actually stored (measured from the tensors)."""
        return sum(t.numel() * t.element_size() for t in (
            self.fold, self.k_full, self.v_full, self.k_q, self.k_scale, self.v_q, self.v_scale,
            self.k_tail, self.v_tail))

    def trimmed_bytes(self) -> int:
        """Bytes the same n tokens take unfolded (trimmed, full precision)."""
        L, KV, _ = self.fold.shape
        hd = self.k_tail.shape[-1]
        return 2 * L * KV * self.n * hd * self.k_tail.element_size()

    def folded_block_bytes(self) -> int:
        """Unfolded bytes of the blocks stored as int8."""
        hd = self.k_tail.shape[-1]
        return 2 * int(self.fold.sum()) * BLOCK * hd * self.k_tail.element_size()


@torch.inference_mode()
def block_scores(k_cache: torch.Tensor, last_q: torch.Tensor, n: int, scale: float) -> torch.Tensor:
    """Relative attention mass per full block: [L, KV, n // BLOCK] in [0, 1].

    k_cache: [L, KV, n_ctx, hd]; last_q: [L, H, hd] (the last token's query
    per layer, after RoPE); positions 0 … n-1 are scored."""
    L, KV, _, hd = k_cache.shape
    H = last_q.shape[1]
    nb = n // BLOCK
    keys = k_cache[:, :, :n].float()                              # [L, KV, n, hd]
    q = last_q.float().view(L, KV, H // KV, hd)                   # [L, KV, G, hd]
    att = torch.softmax(q @ keys.transpose(-1, -2) * scale, -1)   # [L, KV, G, n]
    mass = att[..., :nb * BLOCK].reshape(L, KV, -1, nb, BLOCK).sum(-1).mean(2)  # [L, KV, nb]
    top = torch.maximum(mass.amax(-1, keepdim=True), att[..., nb * BLOCK:].sum(-1).mean(2, keepdim=True))
    return mass / top.clamp_min(1e-30)


@torch.inference_mode()
def fold(k_cache: torch.Tensor, v_cache: torch.Tensor, n: int, scores: torch.Tensor | None,
         threshold: float) -> FoldedKV:
    """Fold positions 0 … n-1 of a [L, KV, n_ctx, hd] cache pair: blocks with
    ``scores < threshold`` to int8, the rest copied. ``scores`` None (no
    query known): nothing folded, only trimmed.

    Runs on every document switch, so each byte is touched as few times as
    possible: the blocks are views of the cache, a boolean gather is the
    only copy of each block, and the int8 conversion works in place on the
    gathered copy."""
    L, KV, _, hd = k_cache.shape
    nb = n // BLOCK
    cut = nb * BLOCK
    kb = k_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)            # views, no copy
    vb = v_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    if scores is None or threshold <= 0:
        mask = torch.zeros(L, KV, nb, dtype=torch.bool, device=k_cache.device)
    else:
        mask = scores < threshold
    if not bool(mask.any()):                                        # trimming only: one plain copy
        k_full = kb.clone(memory_format=torch.contiguous_format).view(L * KV * nb, BLOCK, hd)
        v_full = vb.clone(memory_format=torch.contiguous_format).view(L * KV * nb, BLOCK, hd)
    else:
        keep = ~mask
        k_full, v_full = kb[keep], vb[keep]                         # a boolean gather is a copy
    k_q, k_scale = _quantize(kb[mask], 1)                           # scale per channel: [folded, 1, hd]
    v_q, v_scale = _quantize(vb[mask], 2)                           # scale per token: [folded, BLOCK, 1]
    return FoldedKV(
        n=n, fold=mask,
        k_full=k_full, v_full=v_full,
        k_q=k_q, k_scale=k_scale, v_q=v_q, v_scale=v_scale,
        k_tail=k_cache[:, :, cut:n].clone(), v_tail=v_cache[:, :, cut:n].clone(),
    )


def _quantize(x: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 of x [folded, BLOCK, hd] (a copy, overwritten here)
    with one float32 scale per slice along ``dim``: (int8 x, scale)."""
    x = x.float()                                                   # no copy when x is float32 already
    lo, hi = torch.aminmax(x, dim=dim, keepdim=True)                # faster here than abs().amax()
    scale = torch.maximum(hi, lo.neg_()).div_(127).clamp_min_(1e-12)
    return x.div_(scale).round_().to(torch.int8), scale


@torch.inference_mode()
def unfold(f: FoldedKV, k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    """Write ``f`` back into positions 0 … f.n-1 of a [L, KV, n_ctx, hd]
    cache pair (int8 blocks dequantized to the cache's dtype)."""
    L, KV, nb = f.fold.shape
    hd = k_cache.shape[-1]
    cut = nb * BLOCK
    kb = k_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    vb = v_cache[:, :, :cut].view(L, KV, nb, BLOCK, hd)
    if not f.k_q.shape[0]:                                          # trimmed only: one plain copy
        kb.copy_(f.k_full.view(L, KV, nb, BLOCK, hd))
        vb.copy_(f.v_full.view(L, KV, nb, BLOCK, hd))
    else:
        keep = ~f.fold
        kb[keep] = f.k_full
        vb[keep] = f.v_full
        kb[f.fold] = f.k_q.to(torch.float32).mul_(f.k_scale).to(k_cache.dtype)
        vb[f.fold] = f.v_q.to(torch.float32).mul_(f.v_scale).to(v_cache.dtype)
    k_cache[:, :, cut:f.n] = f.k_tail
    v_cache[:, :, cut:f.n] = f.v_tail


def kv_bytes_per_token(layers: int, kv_heads: int, head_dim: int, element_size: int) -> int:
    """Full-precision K+V bytes of one token over all layers."""
    return 2 * layers * kv_heads * head_dim * element_size


# --------------------------------------------------------------------------
# Quality, measured: greedy output with folding against without
# --------------------------------------------------------------------------


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
    from ..api import CompletionRequest
    from .session import KVSession

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
    """python -m soldaemon.runtime.kvfold [--holes N] [--thresholds ...]:
    the agreement table on the embedded model (the default threshold's
    evidence)."""
    import argparse

    from ..config import config_from_dict
    from ..holes import cut_line_holes, default_corpus
    from ..model.loader import load_model
    from .engine import LocalEngine

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
    from ..holes import default_corpus
    from ..model.loader import load_model
    from .backend import LeanBackend
    from .session import KVSession

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
