#!/usr/bin/env python3
"""Sol's weight residency on a GPU: what offloading costs, measured.

Prints (and writes as JSON) the host→device copy bandwidth and, with 100%,
75% and 50% of the decoder layers resident (the rest in pinned host memory,
prefetched ``--depth`` layers ahead on a side stream): TTFT of a
``--prompt-tokens`` prefill, time per decoded token, prefetch hit rate,
fallbacks, and the cost the planner predicts from the bandwidth next to the
cost measured. Greedy tokens must be identical in every row, and KV parked
trimmed-only must come back bit for bit (exit status 1 otherwise). Then what
parking a document's KV costs on the device (KV folding): the prompt's KV
trimmed only, and quantized at threshold 0.1 — score, park and restore ms.

    python scripts/gpu_memory.py                      # embedded model, CUDA
    python scripts/gpu_memory.py --device cpu --model DIR --prompt-tokens 64 --tokens 4   # dry run

On a CPU (``--device cpu``) the same mechanism runs with the staging slots
and a copier thread standing in for GPU memory and the side stream: a dry
run of the script, not a GPU figure.
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import sys
import textwrap
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soldaemon.weights.loader import load_model  # noqa: E402
from soldaemon.runtime.forward.backend import LeanBackend  # noqa: E402
from soldaemon.runtime.forward.precision import choose_kernels  # noqa: E402
from soldaemon.runtime.kv.fold import block_scores, fold, unfold  # noqa: E402
from soldaemon.runtime.memory.prefetch import PrefetchStats  # noqa: E402
from soldaemon.runtime.memory.weightstore import WeightStore, measure_copy_bandwidth  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _budget(store: WeightStore, resident_layers: int) -> int | None:
    """Bytes that keep the first ``resident_layers`` layers resident."""
    if resident_layers >= store.n_layers:
        return None
    per_layer = sorted((sum(u.info.nbytes for u in store.units if u.info.layer == i) for i in range(store.n_layers)))
    ring = (store.prefetch_depth + 2) * store.slot_bytes
    return store.fixed_bytes + ring + sum(per_layer[:resident_layers]) + 1


def _run(backend: LeanBackend, ids: torch.Tensor, n: int) -> tuple[float, float, list[int]]:
    """(TTFT ms, ms per decoded token, greedy tokens)."""
    dev = backend.device
    _sync(dev)
    t0 = time.perf_counter()
    logits = backend.forward(ids, 0, precise=True)
    tok = int(logits[0].argmax())                     # host sync
    ttft = (time.perf_counter() - t0) * 1e3
    toks = [tok]
    t1 = time.perf_counter()
    for s in range(n - 1):
        logits = backend.forward(torch.tensor([tok], device=dev), len(ids) + s)
        tok = int(logits[0].argmax())
        toks.append(tok)
    per_token = (time.perf_counter() - t1) * 1e3 / max(1, n - 1)
    return ttft, per_token, toks


def _kv_park_costs(backend: LeanBackend, ids: torch.Tensor, repeats: int) -> list[dict]:
    """KV folding on this device: the prompt's KV (prefilled with queries
    recorded) parked at threshold 0 (trimmed only) and 0.1 (low-attention
    blocks int8), then written back; ms, the median of ``repeats``, with a
    device sync around each step. The KV is restored after each repeat."""
    dev = backend.device
    backend.record_queries()
    backend.forward(ids, 0, precise=True)
    assert backend.last_q is not None
    k, v = backend.cache
    n = len(ids)
    saved_k, saved_v = k[:, :, :n].clone(), v[:, :, :n].clone()
    out = []
    exact = True
    for threshold in (0.0, 0.1):
        times = []
        # one untimed round first: the first call of each kernel (module load,
        # library handles) is not what parking costs (the H200 run's 2 repeats
        # reported a first-use 147 ms score as their upper "median")
        for rep in range(max(1, repeats) + 1):
            _sync(dev)
            t0 = time.perf_counter()
            scores = block_scores(k, backend.last_q, n, backend.scale) if threshold > 0 else None
            _sync(dev)
            t1 = time.perf_counter()
            f = fold(k, v, n, scores, threshold)
            _sync(dev)
            t2 = time.perf_counter()
            unfold(f, k, v)
            _sync(dev)
            t3 = time.perf_counter()
            if rep:
                times.append(((t1 - t0) * 1e3, (t2 - t1) * 1e3, (t3 - t2) * 1e3))
            if threshold == 0:     # trimming only is exact: the KV comes back bit for bit
                exact = exact and torch.equal(k[:, :, :n], saved_k) and torch.equal(v[:, :, :n], saved_v)
            k[:, :, :n] = saved_k
            v[:, :, :n] = saved_v
        score_ms, park_ms, restore_ms = (statistics.median(x) for x in zip(*times))
        out.append({"threshold": threshold, "tokens": n, "trimmed_mb": round(f.trimmed_bytes() / 2**20, 2),
                    "stored_mb": round(f.nbytes() / 2**20, 2),
                    "share_quantized": round(f.folded_block_bytes() / max(1, f.trimmed_bytes()), 4),
                    "score_ms": round(score_ms, 3), "park_ms": round(park_ms, 3),
                    "restore_ms": round(restore_ms, 3), "exact": exact if threshold == 0 else None})
    backend.record_queries(False)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (dry run)")
    ap.add_argument("--model", default=None, help="model directory or .gguf (default: the embedded model)")
    ap.add_argument("--prompt-tokens", type=int, default=512)
    ap.add_argument("--tokens", type=int, default=32, help="tokens decoded per row")
    ap.add_argument("--depth", type=int, default=2, help="prefetch_depth")
    ap.add_argument("--fallback-timeout-ms", type=float, default=50.0)
    ap.add_argument("--repeats", type=int, default=2, help="timed runs per row (best kept)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--pcts", type=int, nargs="+", default=[100, 75, 50],
                    help="shares of layers resident, one row each (the first row is the reference)")
    args = ap.parse_args(argv)

    loaded = load_model(args.model, device=args.device, dtype="stored", progress=False)
    dev = loaded.device
    source = inspect.getsource(textwrap) * 4
    ids_list = loaded.tokenizer(source, add_special_tokens=False).input_ids[:args.prompt_tokens]
    ids = torch.tensor(ids_list, dtype=torch.long, device=dev)
    plan, _table = choose_kernels(loaded, "auto", progress=False)    # the daemon's own plan for this device
    backend = LeanBackend(loaded.model, len(ids_list) + args.tokens + 8, plan=plan, release=True)
    store = WeightStore(backend.layers, backend.fixed_weights(), dev, prefetch_depth=args.depth,
                        fallback_timeout_ms=args.fallback_timeout_ms)
    backend.read_through(store)
    bw = measure_copy_bandwidth(dev)
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    print(f"device: {gpu}   model: {loaded.name} ({loaded.dtype})   layers: {store.n_layers}   "
          f"copy bandwidth: {bw:.2f} GB/s   prefetch_depth: {args.depth}")

    _run(backend, ids, args.tokens)                    # warm-up at full size: allocator, page faults, kernels
    # the reference: every layer resident (what predictions add copies to)
    runs = [_run(backend, ids, args.tokens) for _ in range(args.repeats)]
    base = {"ttft": min(r[0] for r in runs), "tok": min(r[1] for r in runs)}
    ref_tokens = runs[0][2]
    rows = []
    for pct in args.pcts:
        k = round(store.n_layers * pct / 100)
        budget = _budget(store, k)
        residency = store.make_plan(budget, 0, bandwidth_gbs=bw, first_layers=k)
        store.apply_plan(residency)
        _run(backend, ids[:16], 2)                     # warm: kernels, slots, the copier
        store.stats = PrefetchStats()                  # count the timed runs only
        alloc0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else None
        best = None
        for _ in range(args.repeats):
            r = _run(backend, ids, args.tokens)
            best = r if best is None or r[0] + r[1] < best[0] + best[1] else best
        assert best is not None
        ttft, per_tok, toks = best
        # predicted: copies of the offloaded layers at the measured bandwidth,
        # overlapped with the all-resident compute when prefetching
        copy_prefill = copy_decode = store.offloaded_copy_bytes() / (bw * 1e9) * 1e3

        def predict(compute: float, copy: float) -> float:
            return max(compute, copy) if args.depth > 0 else compute + copy

        s = store.stats
        row = {
            "resident_pct": pct, "resident_layers": store.n_layers - store.offloaded_layers, "offloaded_layers": store.offloaded_layers,
            "budget_mb": None if budget is None else round(budget / 2**20, 1),
            "device_mb": round(store.device_bytes() / 2**20, 1),
            "cuda_allocated_mb": None if alloc0 is None else round(alloc0 / 2**20, 1),
            "ttft_ms": round(ttft, 2), "ms_per_token": round(per_tok, 3),
            "predicted_ttft_ms": round(predict(base["ttft"], copy_prefill), 2),
            "predicted_ms_per_token": round(predict(base["tok"], copy_decode), 3),
            "copy_ms_per_token": round(copy_decode, 3),
            "prefetch_hit_rate": None if s.hit_rate is None else round(s.hit_rate, 4),
            "fallbacks": s.fallbacks, "stall_ms": round(s.stall_ms, 2),
            "same_tokens": toks == ref_tokens,
        }
        rows.append(row)

    print(f"{'resident':>9} {'layers':>7} {'device MB':>10} {'TTFT ms':>9} {'pred.':>9} {'ms/tok':>8} "
          f"{'pred.':>8} {'hit rate':>9} {'fallbk':>7} {'same':>5}")
    for row in rows:
        hit = "-" if row["prefetch_hit_rate"] is None else f"{row['prefetch_hit_rate']:.3f}"
        print(f"{row['resident_pct']:>8}% {row['resident_layers']:>3}/{store.n_layers:<3} {row['device_mb']:>10} "
              f"{row['ttft_ms']:>9.1f} {row['predicted_ttft_ms']:>9.1f} {row['ms_per_token']:>8.2f} "
              f"{row['predicted_ms_per_token']:>8.2f} {hit:>9} {row['fallbacks']:>7} {str(row['same_tokens']):>5}")
    print(f"all-resident reference (before the rows): TTFT {base['ttft']:.1f} ms, {base['tok']:.2f} ms/token")
    print("predicted = max(all-resident time, offloaded bytes / measured bandwidth) with prefetch "
          "(their sum without); resident = share of decoder layers on the device")
    kv = _kv_park_costs(backend, ids, args.repeats)
    print(f"KV parking ({kv[0]['tokens']} tokens, {loaded.dtype}): "
          + "; ".join(f"{'trimmed only' if r['threshold'] == 0 else 'quantized at ' + str(r['threshold'])}: "
                      f"{r['trimmed_mb']} -> {r['stored_mb']} MB, score {r['score_ms']:.2f} + park "
                      f"{r['park_ms']:.2f} + restore {r['restore_ms']:.2f} ms" for r in kv))
    result = {"device": "cpu" if dev.type == "cpu" else gpu, "model": loaded.name, "dtype": str(loaded.dtype),
              "layers": store.n_layers, "copy_bandwidth_gbs": round(bw, 3), "prefetch_depth": args.depth,
              "prompt_tokens": len(ids_list), "tokens": args.tokens,
              "reference": {"ttft_ms": round(base["ttft"], 2), "ms_per_token": round(base["tok"], 3)}, "rows": rows,
              "kv_park": kv}
    failures = [f"tokens with {row['resident_pct']}% of the layers resident differ from all-resident"
                for row in rows if not row["same_tokens"]]
    if kv[0]["exact"] is False:
        failures.append("KV parked trimmed-only did not come back bit for bit")
    result["failures"] = failures
    for f in failures:
        print(f"FAIL: {f}")
    print("gpu_memory: " + ("FAILED" if failures else "all checks passed"))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    store.close()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
