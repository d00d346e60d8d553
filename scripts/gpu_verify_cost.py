#!/usr/bin/env python3
"""What a verify forward costs against a decode step, and whether
speculation pays on block answers (issue 25, item 4), on any device (the
CPU included; the name groups it with the other runtime-path scripts).

1. Forward cost by rows: a 1-row step and T-row verifies (T = 2, 5, 9) at
   contexts of ``--contexts`` tokens, each the median of ``--repeats``,
   through the session (the path decode and speculation run), next to what
   the kernels alone predict: the linear layers and the head at T rows, and
   the attention at T rows, each timed alone.
2. Block answers: ``--holes`` block holes from the standard-library corpus,
   ``--tokens`` greedy tokens each (no stop rule, so both runs decode the
   same number), with prompt-lookup speculation (DraftLength sizing, the
   daemon's default) and without; decoded tokens/s of each, their ratio,
   and whether the tokens are identical (they must be: greedy).

    python scripts/gpu_verify_cost.py --device cpu --json out.json
    python scripts/gpu_verify_cost.py --model DIR --device cpu --threads 2

Prints the machine (CPU model, AVX-512 flags, load) beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from soldaemon.api import CompletionRequest  # noqa: E402
from soldaemon.measure.bench import bench_sol  # noqa: E402
from soldaemon.config import Config  # noqa: E402
from soldaemon.measure.holes import cut_holes, default_corpus  # noqa: E402
from soldaemon.runtime.engine.local import SCRATCH_URI, LocalEngine, load_engine  # noqa: E402
try:                        # absent before issue 27: the attention share is then not measured
    from soldaemon.runtime.forward.layer import causal_mask, group_mask, grouped_attention  # noqa: E402
except ImportError:
    grouped_attention = None
from soldaemon.runtime.forward.timing import synchronize  # noqa: E402


def _median_ms(device: torch.device, fn: Any, repeats: int) -> float:
    fn()                                                   # warm
    samples = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples)


def forward_costs(engine: LocalEngine, context: int, rows: tuple[int, ...], repeats: int) -> dict[str, Any]:
    """ms of a T-row forward after ``context`` tokens, through the session,
    and the kernels' share of it."""
    b, session = engine.backend, engine.pool.acquire(SCRATCH_URI)
    gen = torch.Generator().manual_seed(context)
    ids = torch.randint(100, min(b.vocab_size, 30000), (context + max(rows),), generator=gen).tolist()
    session.truncate(0)
    session.prefill(ids[:context])
    out: dict[str, Any] = {"context": context}
    for t in rows:
        def run(t: int = t) -> None:
            if t == 1:
                session.decode_step(ids[context])
            else:
                session.verify(ids[context:context + t])
            session.truncate(context)
        out[f"forward_{t}_ms"] = round(_median_ms(b.device, run, repeats), 3)
    # the kernels alone: every linear layer of every layer and the head, at T rows
    lin = b.short_linear
    D = b.norm.shape[0]
    inner = b.layers[0].wgu.shape[0] // 2                  # the MLP's width (gate rows)
    for t in rows:
        x = torch.randn(t, D, dtype=b.dtype, device=b.device)
        xo = torch.randn(t, b.n_heads * b.head_dim, dtype=b.dtype, device=b.device)
        xd = torch.randn(t, inner, dtype=b.dtype, device=b.device)

        def kernels(x: torch.Tensor = x, xo: torch.Tensor = xo, xd: torch.Tensor = xd) -> None:
            for lw in b.layers:                            # as the layer runs them: shared prepared inputs
                lin(x, lw.wqkv, lw.bqkv, lw.sqkv)         # q, k and v: one packed product
                lin(xo, lw.wo, lw.bo, lw.so)
                lin(x, lw.wgu, None, lw.sgu)              # gate and up: one packed product
                lin(xd, lw.wd, None, lw.sd)
            b.head_logits(x)
        out[f"kernels_{t}_ms"] = round(_median_ms(b.device, kernels, repeats), 3)
        if grouped_attention is None:
            out[f"attention_{t}_ms"] = 0.0
            continue
        H, KV, hd = b.n_heads, b.n_kv, b.head_dim
        end = context + t
        q = torch.randn(H, t, hd, dtype=b.dtype, device=b.device)
        k = b.k_cache[0, :, :end]
        mask = None if t == 1 else group_mask(causal_mask(context, t, end, b.device), H // KV)

        def attention(q: torch.Tensor = q, k: torch.Tensor = k, mask: Any = mask) -> None:
            for _ in b.layers:
                grouped_attention(q, k, k, b.scale, mask)
        out[f"attention_{t}_ms"] = round(_median_ms(b.device, attention, repeats), 3)
    top = max(rows)
    out[f"verify{top}_vs_step"] = round(out[f"forward_{top}_ms"] / out["forward_1_ms"], 3)
    out[f"kernels{top}_vs_step"] = round((out[f"kernels_{top}_ms"] + out[f"attention_{top}_ms"])
                                         / (out["kernels_1_ms"] + out["attention_1_ms"]), 3)
    session.truncate(0)
    return out


def block_speculation(engine: LocalEngine, holes: int, tokens: int, seed: int) -> dict[str, Any]:
    """Decoded tokens/s with and without prompt-lookup speculation on block holes."""
    picked = cut_holes(default_corpus(), holes, seed=seed, kinds=("block",))
    prompts = [engine.build_prompt(CompletionRequest(id="b", prefix=h.prefix, suffix=h.suffix))[0].ids
               for h in picked]
    rates: dict[str, list[float]] = {"plain": [], "speculative": []}
    same = 0
    accept: list[float] = []
    for ids in prompts:
        toks = {}
        for name in ("plain", "speculative"):
            _, ms_per_token, out, acc = bench_sol(engine, ids, tokens, speculative=name == "speculative")
            rates[name].append(1e3 / ms_per_token)
            toks[name] = out
            if name == "speculative":
                accept.append(acc)
        same += toks["plain"] == toks["speculative"]
    plain, spec = statistics.median(rates["plain"]), statistics.median(rates["speculative"])
    total = {k: sum(v) / len(v) for k, v in rates.items()}
    return {"holes": len(prompts), "tokens": tokens, "plain_tok_s_p50": round(plain, 2),
            "speculative_tok_s_p50": round(spec, 2), "speedup_p50": round(spec / plain, 3),
            "speedup_mean": round(total["speculative"] / total["plain"], 3),
            "acceptance_mean": round(statistics.mean(accept), 3) if accept else None,
            "identical_tokens": f"{same}/{len(prompts)}",
            "forward_ms_by_tokens": {t: round(c, 2) for t, c in (engine.part.draft_length.costs_ms.items()
                                                                 if engine.part.draft_length else [])}}


def machine() -> dict[str, Any]:
    flags: set[str] = set()
    model = platform.processor()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                flags |= {f for f in line.split() if f.startswith("avx512")}
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    return {"cpu": model, "avx512": sorted(flags), "cores": os.cpu_count(), "threads": torch.get_num_threads(),
            "load_1min": round(os.getloadavg()[0], 2), "torch": torch.__version__}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model dir or .gguf (default: the embedded model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--contexts", type=int, nargs="*", default=[256, 1024])
    p.add_argument("--rows", type=int, nargs="*", default=[1, 2, 5, 9])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--holes", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", dest="json_out")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    overrides: dict[str, Any] = {"device.device": args.device, "completion.speculative": True}
    if args.model:
        overrides["model.path"] = args.model
    engine = load_engine(Config.default().with_overrides(overrides, source="gpu_verify_cost"), progress=False)
    try:
        info = engine.info()
        result: dict[str, Any] = {"machine": machine(), "model": info["model"], "dtype": info["dtype"],
                                  "plan": engine.backend.plan.describe() if hasattr(engine.backend, "plan") else None}
        print(f"{result['machine']}\nmodel {result['model']} ({result['dtype']}), plan {result['plan']}")
        result["costs"] = [forward_costs(engine, c, tuple(args.rows), args.repeats) for c in args.contexts]
        for row in result["costs"]:
            print(row)
        if args.holes:
            result["block_speculation"] = block_speculation(engine, args.holes, args.tokens, args.seed)
            print(result["block_speculation"])
        result["machine_after"] = machine()["load_1min"]
        if args.json_out:
            Path(args.json_out).write_text(json.dumps(result, indent=1))
    finally:
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
