"""Resident memory of the daemon's engine: after load, after N completions
on holes cut from real code, and once idle (the free C heap handed back, as
the worker does after a second without requests); psutil, anonymous vs
file-backed from /proc/self/smaps_rollup where Linux has it. After each
completion the heap is handed back as the worker does (the heap keeper:
when resident memory grew 64 MB since the last hand-back), unless
``--no-heap-keeper``.

    python scripts/rss.py [--completions 500] [--precision auto] [--blocked-copy true|false]
                          [--heap-after-each | --no-heap-keeper | --heap-growth-mb MB] [--json FILE]

Loads the engine exactly as ``soldaemon serve`` does (load_engine, warm-up),
then completes holes from the standard library: each hole twice in a row
(cold, then the same place again: reuse) and, every few holes, a keystroke
typed along the completion (type-through or a short extension), through
``LocalEngine.complete`` like the websocket worker. Prints one JSON line.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]   # the daemon and its benchmarks, from this checkout


def _mem() -> dict[str, float]:
    import psutil

    out = {"rss_mb": round(psutil.Process().memory_info().rss / 2**20, 1)}
    try:
        for line in Path("/proc/self/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Anonymous", "Rss"):
                out[f"smaps_{key.lower()}_mb"] = round(int(rest.split()[0]) / 1024, 1)
    except OSError:
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--completions", type=int, default=500)
    ap.add_argument("--precision", default="auto")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--blocked-copy", choices=("true", "false"), help="model.blocked_copy (default: the config's)")
    ap.add_argument("--heap-after-each", action="store_true",
                    help="hand the free heap back after every completion (what the daemon does after 1 s idle): "
                         "the cost of a request that follows an idle pause")
    ap.add_argument("--heap-growth-mb", type=int, help="the heap keeper's bound (default: the worker's)")
    ap.add_argument("--no-heap-keeper", action="store_true",
                    help="no hand-back between completions (the worker before the heap keeper)")
    args = ap.parse_args(argv)
    from soldaemon.api import CancelToken, CompletionRequest, Done
    from soldaemon.config import config_from_dict
    from soldaemon_bench.holes import cut_line_holes, default_corpus
    from soldaemon.runtime.engine.local import load_engine
    from soldaemon.runtime.memory.heap import HeapKeeper, return_free_heap

    before = _mem()
    t0 = time.perf_counter()
    # (no precision key when auto: the same script measures a checkout from before model.precision)
    model: dict[str, object] = {} if args.precision == "auto" else {"precision": args.precision}
    if args.blocked_copy is not None:
        model["blocked_copy"] = args.blocked_copy == "true"
    engine = load_engine(config_from_dict({"model": model}), progress=False)
    gc.collect()
    loaded = _mem()
    keeper = HeapKeeper() if args.heap_growth_mb is None else HeapKeeper(args.heap_growth_mb << 20)
    kept, keep_ms = 0, 0.0

    def keep() -> None:
        nonlocal kept, keep_ms
        t = time.perf_counter()
        kept += keeper.after_request()
        keep_ms += (time.perf_counter() - t) * 1e3
    holes = cut_line_holes(default_corpus(), max(1, args.completions // 3 + 1), seed=7)
    done_n = 0
    t1 = time.perf_counter()
    i = 0
    while done_n < args.completions:
        h = holes[i % len(holes)]
        uri = f"file:///{h.path}"
        reqs = [h.prefix, h.prefix]                       # cold, then the same place again
        for j, prefix in enumerate(reqs):
            req = CompletionRequest(id=f"r{done_n}", uri=uri, prefix=prefix, suffix=h.suffix, language="python",
                                    max_tokens=args.max_tokens)
            done = [e for e in engine.complete(req, CancelToken()) if isinstance(e, Done)][0]
            done_n += 1
            if args.heap_after_each:
                return_free_heap()
            elif not args.no_heap_keeper:
                keep()
            if j == 1 and done.items and done.items[0][:1] and done_n < args.completions:
                typed = CompletionRequest(id=f"t{done_n}", uri=uri, prefix=prefix + done.items[0][:1],
                                          suffix=h.suffix, language="python", max_tokens=args.max_tokens)
                list(engine.complete(typed, CancelToken()))
                done_n += 1
                if not args.no_heap_keeper and not args.heap_after_each:
                    keep()
        i += 1
    gc.collect()
    after = _mem()
    return_free_heap()          # the worker does this after HEAP_IDLE_S without requests
    idle = _mem()
    plan = engine.info().get("precision") or {}
    result = {"precision": args.precision, "plan": plan.get("summary"), "weight_mb":
              round((plan.get("weight_bytes") or 0) / 2**20, 1), "before_load": before, "after_load": loaded,
              "after_completions": after, "after_idle": idle, "heap_after_each": args.heap_after_each,
              "heap_keeper_returns": None if args.no_heap_keeper or args.heap_after_each else kept,
              "heap_keeper_ms": round(keep_ms, 1),
              "completions": done_n, "load_s": round(t1 - t0, 1),
              "completions_s": round(time.perf_counter() - t1, 1), "sessions": len(engine.pool),
              "kv_mb": round(engine.pool.kv_bytes() / 2**20, 1)}
    print(json.dumps(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
