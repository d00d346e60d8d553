"""Where a cold completion's time goes: the daemon against llama-server on the
same holes (issue 25, item 4's last question).

For each hole (the functional set's block holes, or --corpus holes):

- the daemon, cold, as ``bench --quality`` runs it (``model.draft`` off, and
  with the draft the config gives, when it gives one): prompt tokens, prompt
  building, prefill, TTFT, decode, total (``Timings``);
- llama-server (llama.vscode's flags, the same GGUF) on **the daemon's own
  prompt ids** (``/completion`` with the token list, ``n_predict`` 1, every
  slot erased first): its prefill time for the same tokens -- kernels and
  runtime like for like;
- llama-server on **llama.vscode's request** for the same cursor: its prompt
  tokens (its windows are lines: 256 before, 64 after), prefill and total.

    PYTHONPATH=. python scripts/cold_path.py --model qwen2.5-coder-1.5b --holes 4 --json out.json

Prints one row per hole and run, then medians. Timing figures depend on the
machine's load: run it on a quiet machine, or say "loaded" beside them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any


def daemon_row(engine: Any, hole: Any) -> dict[str, Any]:
    from soldaemon.api import CancelToken, CompletionRequest, Done

    uri = f"file:///{hole.path}"
    engine.pool.acquire(uri).truncate(0)
    req = CompletionRequest(id="c", uri=uri, prefix=hole.prefix, suffix=hole.suffix, language="python",
                            max_tokens=64, received_ns=time.perf_counter_ns())
    done = [ev for ev in engine.complete(req, CancelToken()) if isinstance(ev, Done)][0]
    engine.pool.acquire(uri).truncate(0)
    engine.forget_shown(uri)
    t = done.timings
    ids = engine.build_prompt(CompletionRequest(id="p", prefix=hole.prefix, suffix=hole.suffix,
                                                max_tokens=64))[0].ids
    return {"prompt_tokens": t.prompt_tokens, "prompt_ms": t.prompt_ms, "prefill_ms": t.prefill_ms,
            "ttft_ms": t.ttft_ms, "decode_ms": t.decode_ms, "total_ms": t.total_ms,
            "generated": t.generated_tokens, "drafted": t.draft_tokens, "accepted": t.accepted_tokens,
            "ids": ids}


def server_same_ids(server: Any, ids: list[int]) -> dict[str, Any]:
    server.erase_slots()
    t0 = time.perf_counter_ns()
    r = server.post("/completion", {"prompt": ids, "n_predict": 1, "cache_prompt": False, "top_k": 1})
    wall = (time.perf_counter_ns() - t0) / 1e6
    t = r.get("timings", {})
    return {"prompt_tokens": int(t.get("prompt_n", 0)), "prefill_ms": float(t.get("prompt_ms", 0.0)),
            "wall_ms": wall}


def server_vscode(server: Any, hole: Any) -> dict[str, Any]:
    from soldaemon.measure.quality.llama_vscode import LlamaVscodeClient

    server.erase_slots()
    answer = LlamaVscodeClient(server.infill, use_cache=False, speculative=False).complete(
        hole.prefix, hole.suffix, automatic=False)
    r = answer.response
    t = r.get("timings", {})
    return {"prompt_tokens": int(r.get("tokens_evaluated", 0)), "prefill_ms": float(t.get("prompt_ms", 0.0)),
            "decode_ms": float(t.get("predicted_ms", 0.0)), "generated": int(r.get("tokens_predicted", 0)),
            "total_ms": answer.wait_ms}


def main(argv: list[str] | None = None) -> int:
    from soldaemon.config import load_config
    from soldaemon.measure.functional import cached_holes, holes_cache_path
    from soldaemon.measure.quality.llama_server import LlamaServer
    from soldaemon.measure.quality.llama_server_build import build_server
    from soldaemon.runtime.engine.local import load_engine

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="qwen2.5-coder-1.5b")
    ap.add_argument("--draft", default="qwen2.5-coder-0.5b", help="the draft run's model.draft ('off': no such run)")
    ap.add_argument("--holes", type=int, default=4)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args(argv)
    say = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    holes = [fh.hole for fh in cached_holes(max(args.holes * 3, 12), args.seed, holes_cache_path(), say=say)
             if fh.hole.kind == "block"][: args.holes]
    config = load_config(None)
    base = {"model.path": None, "model.name": args.model, "model.draft": "off"}
    if args.threads:
        base["device.threads"] = args.threads
    runs = [("daemon", config.with_overrides(base, source="cold_path"))]
    if args.draft != "off":
        runs.append((f"daemon+{args.draft}", config.with_overrides({**base, "model.draft": args.draft},
                                                                   source="cold_path")))
    rows: dict[str, list[dict[str, Any]]] = {}
    engine = None
    for name, cfg in runs:
        engine = load_engine(cfg)
        rows[name] = [daemon_row(engine, h) for h in holes]
        say(f"{name}: {engine.info()['precision']['summary']}")
    assert engine is not None
    binary = build_server(log=say)
    gguf = Path(engine.loaded.gguf_path)
    threads = int(engine.info()["threads"])
    with LlamaServer(binary, gguf, threads, small_model="0.5b" in gguf.name.lower(), cold=True) as server:
        rows["llama-server, the daemon's ids"] = [server_same_ids(server, r["ids"]) for r in rows["daemon"]]
        rows["llama-server, llama.vscode's request"] = [server_vscode(server, h) for h in holes]
    for r in rows["daemon"] + rows.get(f"daemon+{args.draft}", []):
        r.pop("ids")
    print(f"{len(holes)} block holes; {binary.describe()}; threads {threads}")
    for name, rs in rows.items():
        keys = [k for k in rs[0] if isinstance(rs[0][k], (int, float))]
        med = {k: statistics.median(float(r[k]) for r in rs) for k in keys}
        print(f"{name:<40} " + "  ".join(f"{k} {v:.0f}" for k, v in med.items()))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"binary": binary.describe(), "threads": threads,
                                                   "holes": [f"{h.path}:{h.line}" for h in holes],
                                                   "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
