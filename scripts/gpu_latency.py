#!/usr/bin/env python3
"""Check and time the GPU latency path (issue 4) on a CUDA machine.

For the same holes cut from real source and the same prompt ids:

- ``generate``: plain transformers ``generate()`` (the baseline);
- ``sol-eager``: this runtime's decode steps, eager (CUDA graphs off);
- ``sol-graphs``: the same replayed from CUDA graphs (captured at warm-up).

It checks that the greedy tokens are identical across the three, reports TTFT
and ms/token p50 per path and the ratios to ``generate``, the graph capture
count/time and any fallback, then replays a short keystroke trace through the
engine (graphs on). Prints a table; ``--json`` writes everything.

    python scripts/gpu_latency.py --json "$OUT/gpu_latency.json"

On a CPU (``--device cpu``, used by the test suite with a tiny model) graphs
are unavailable: the script says so and times the eager path only.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soldaemon.bench import bench_generate, bench_sol  # noqa: E402
from soldaemon.config import load_config  # noqa: E402
from soldaemon.holes import cut_line_holes, default_corpus  # noqa: E402
from soldaemon.runtime.engine import load_engine  # noqa: E402
from soldaemon.trace import make_trace, run_sol  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model dir or .gguf (default: the embedded model)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--holes", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--lines", type=int, default=2, help="keystroke trace: lines typed")
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)

    overrides: dict[str, Any] = {"device.device": args.device, "model.max_prefix_tokens": 384,
                                 "model.max_suffix_tokens": 128}
    if args.model:
        overrides["model.path"] = args.model
    config = load_config(None).with_overrides(overrides, source="gpu_latency")
    t0 = time.perf_counter()
    engine = load_engine(config, progress=False)
    load_s = time.perf_counter() - t0
    info = engine.info()
    graphs = engine.graphs
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"model {info['model']} on {info['device']} ({info['dtype']}), {gpu or platform.processor() or 'CPU'}; "
          f"load + warm-up {load_s:.1f} s; CUDA graphs: {info['cuda_graphs'] or 'unavailable (not CUDA)'}")

    holes = cut_line_holes(default_corpus(), args.holes, seed=0)
    rows: dict[str, dict[str, list[float]]] = {k: {"ttft_ms": [], "ms_per_token": []}
                                               for k in ("generate", "sol-eager", "sol-graphs")}
    same = {"sol-eager": 0, "sol-graphs": 0}
    for hole in holes:
        ids = engine.build_prompt(engine_request(hole))[0].ids
        ttft, mpt, ref = bench_generate(engine.loaded.model, ids, args.tokens)
        rows["generate"]["ttft_ms"].append(ttft)
        rows["generate"]["ms_per_token"].append(mpt)
        for name in ("sol-eager", "sol-graphs"):
            if name == "sol-graphs" and graphs is None:
                continue
            setattr(engine.backend, "graphs", graphs if name == "sol-graphs" else None)
            ttft, mpt, toks, _ = bench_sol(engine, ids, args.tokens, speculative=False)
            rows[name]["ttft_ms"].append(ttft)
            rows[name]["ms_per_token"].append(mpt)
            same[name] += toks == ref
        setattr(engine.backend, "graphs", graphs)
    base = rows["generate"]
    print(f"\n{len(holes)} holes, {args.tokens} tokens each, greedy, cold cache")
    print(f"{'path':<11} {'TTFT p50':>9} {'ms/tok p50':>11} {'vs generate':>12} {'same tokens':>12}")
    summary: dict[str, Any] = {}
    for name, r in rows.items():
        if not r["ttft_ms"]:
            print(f"{name:<11} {'-':>9} {'-':>11} {'-':>12} {'(unavailable)':>12}")
            continue
        t, m = statistics.median(r["ttft_ms"]), statistics.median(r["ms_per_token"])
        ratio = m / statistics.median(base["ms_per_token"])
        eq = f"{same[name]}/{len(holes)}" if name in same else "ref"
        print(f"{name:<11} {t:>9.1f} {m:>11.2f} {ratio:>11.2f}x {eq:>12}")
        summary[name] = {"ttft_p50_ms": t, "ms_per_token_p50": m, "vs_generate": ratio,
                         "same_tokens": same.get(name)}

    trace = make_trace(default_corpus(), args.lines, 0)
    say = lambda msg: print("  " + msg, file=sys.stderr, flush=True)  # noqa: E731
    every, computed = run_sol(engine, trace, say)
    print(f"\nkeystroke trace: {len(trace)} keystrokes, TTFT p50 {every.pct('ttft_ms', .5):.1f} ms, "
          f"p95 {every.pct('ttft_ms', .95):.1f} ms; model-computed p50 {computed.pct('ttft_ms', .5):.1f} ms, "
          f"p95 {computed.pct('ttft_ms', .95):.1f} ms; type-through {every.type_through}")
    print(f"graphs: {graphs.info() if graphs is not None else 'unavailable'}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "info": info, "gpu": gpu, "load_s": load_s, "rows": rows, "summary": summary,
            "graphs": graphs.info() if graphs is not None else None,
            "trace": {"keystrokes": len(trace), "ttft_p50": every.pct("ttft_ms", .5),
                      "ttft_p95": every.pct("ttft_ms", .95), "model_ttft_p50": computed.pct("ttft_ms", .5),
                      "model_ttft_p95": computed.pct("ttft_ms", .95), "type_through": every.type_through},
        }, indent=1))
        print(f"wrote {args.json_out}")
    return 0


def engine_request(hole: Any) -> Any:
    from soldaemon.api import CompletionRequest

    return CompletionRequest(id="h", prefix=hole.prefix, suffix=hole.suffix)


if __name__ == "__main__":
    sys.exit(main())
