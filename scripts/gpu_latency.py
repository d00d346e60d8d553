#!/usr/bin/env python3
"""Check and time the GPU latency path (issues 4 and 18) on a CUDA machine.

For the same holes cut from real source and the same prompt ids:

- ``generate``: plain transformers ``generate()`` (the baseline);
- ``model-compiled`` (``--compiled``): transformers' forward alone over a
  static cache, its decode step under ``torch.compile`` (gpt-fast's recipe:
  inductor, ``reduce-overhead``, so CUDA graphs too): the GPU anchor to beat;
  its compile time is reported apart;
- ``sol-eager``: this runtime's decode steps, eager (CUDA graphs off);
- ``sol-graphs``: the same replayed from CUDA graphs (captured at warm-up).

Checks (the exit status is 1 when one fails, with the reasons printed and
in the JSON's ``failures``):

- graphs against eager steps directly, in the precision the device decodes
  in (:mod:`soldaemon_bench.graphcheck`: teacher-forced logits within the
  stated tolerance, argmax agreement; in float32 also identical free-running
  tokens), over ``--check-steps`` steps on every hole, and the eager steps
  against transformers' own forward of the same tokens, same tolerance;
- in float32, the eager tokens equal ``generate()``'s (in half precision
  the two are different kernels: reported, not judged);
- idle release → restore → graph re-capture gives the same tokens as before.

Reports TTFT and ms/token p50 per path, decode ms/token against the
memory-bandwidth floor (bytes a decode step reads ÷ the measured read
bandwidth), a cold prefill of ``--prefill-tokens``, graph capture count and
time, idle release/restore ms, and a keystroke trace's TTFT on the reuse
path. ``--json`` writes everything.

    python scripts/gpu_latency.py --model DIR --json "$OUT/gpu_latency.json"

On a CPU (``--device cpu``, the test suite's tiny model) ``--emulate-graphs``
runs the graph path through :class:`~soldaemon.runtime.forward.cudagraph.EmulatedGraph`
(the same static step and output-buffer contract, no capture).
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

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]   # the daemon and its benchmarks, from this checkout

from soldaemon.config import Config  # noqa: E402
from soldaemon.runtime.engine.local import SCRATCH_URI, LocalEngine, load_engine  # noqa: E402
from soldaemon.runtime.forward.cudagraph import GraphDecoder  # noqa: E402
from soldaemon.runtime.forward.layer import ATTENTION_LOG  # noqa: E402
from soldaemon.runtime.forward.timing import synchronize  # noqa: E402
from soldaemon_bench.bench import baseline_model, bench_generate, bench_sol  # noqa: E402
from soldaemon_bench.graphcheck import compare_graphs, float32_anchor, transformers_reference  # noqa: E402
from soldaemon_bench.holes import cut_line_holes, default_corpus  # noqa: E402
from soldaemon_bench.trace import make_trace, run_sol  # noqa: E402


def measure_read_bandwidth(device: torch.device, nbytes: int, reps: int = 5) -> float:
    """GB/s a reduction reads the device's memory at (best of ``reps``):
    the bandwidth a memory-bound decode step can reach at most."""
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    best = float("inf")
    for _ in range(reps + 1):                          # the first run warms the kernel
        synchronize(device)
        t0 = time.perf_counter()
        float(x.sum())
        best = min(best, time.perf_counter() - t0)
    del x
    return nbytes / best / 1e9


def decode_bytes(backend: Any, context: int) -> int:
    """Bytes one decode step reads: every weight the backend holds (its one
    packed copy) but an untied embedding table, of which a step reads one
    row, and the KV of ``context`` positions."""
    n = backend.weight_bytes()
    if backend.embed_w is not backend.head_w:
        n -= sum(t.untyped_storage().nbytes() for t in (backend.embed_w, backend.embed_s) if t is not None)
    n_layers, kv, _, hd = backend.k_cache.shape      # [layers, kv_heads, n_ctx, head_dim]
    return n + 2 * n_layers * kv * hd * context * backend.k_cache.element_size()


def cold_prefill_ms(engine: LocalEngine, n: int, repeats: int = 3) -> float:
    """ms of one ``n``-token prompt from an empty cache to its first sampled
    token (model-dtype weights, as a prompt is computed); the median."""
    text = "".join(p.read_text(errors="replace") for p in default_corpus()[:4])
    ids = engine.tokenizer(text, add_special_tokens=False).input_ids[:n]
    if len(ids) < n:
        raise ValueError(f"the corpus gives only {len(ids)} tokens")
    dev = engine.backend.device
    x = torch.tensor(ids, dtype=torch.long, device=dev)
    samples = []
    for _ in range(repeats + 1):                       # the first run warms the kernels
        synchronize(dev)
        t0 = time.perf_counter()
        int(engine.backend.forward(x, 0, precise=True)[0].argmax())
        samples.append((time.perf_counter() - t0) * 1e3)
    engine.pool.acquire(SCRATCH_URI).truncate(0)       # the cache no longer holds what the session thinks
    return statistics.median(samples[1:])


def idle_release_check(engine: LocalEngine, ids: list[int], n: int, before: list[int]) -> dict[str, Any]:
    """Release every layer as after ``sol.idle_release_s`` idle, restore
    (layer 0 first), decode again: ms of each, bytes freed, graph captures
    after the restore, and whether the tokens are those of ``before``."""
    memory = engine.memory
    if memory is None:
        return {"skipped": "no memory scheduler (not the lean backend)"}
    dev = engine.backend.device
    graphs = engine.graphs
    captures0 = graphs.captures if graphs is not None else 0
    synchronize(dev)
    t0 = time.perf_counter()
    memory.on_timer = True              # as the timer would (on CUDA the default waits for memory pressure)
    freed = memory.release_if_idle(now=time.monotonic() + memory.idle_release_s + 1)
    synchronize(dev)
    release_ms = (time.perf_counter() - t0) * 1e3
    t1 = time.perf_counter()
    with memory.gen_lock:
        memory.restore()
    synchronize(dev)
    restore_ms = (time.perf_counter() - t1) * 1e3
    # the graphs went stale with the weights: captured again outside any request
    t2 = time.perf_counter()
    memory.recapture_graphs()
    synchronize(dev)
    recapture_ms = (time.perf_counter() - t2) * 1e3
    _, _, after, _ = bench_sol(engine, ids, n, speculative=False)
    return {"freed_mb": round(freed / 2**20, 1), "release_ms": round(release_ms, 2),
            "restore_ms": round(restore_ms, 2), "recapture_ms": round(recapture_ms, 2),
            "recaptures": (graphs.captures - captures0) if graphs is not None else None,
            "same_tokens": after == before}


def bench_compiled(model: Any, prompts: list[list[int]], n: int, backend: str) -> dict[str, Any]:
    """The model alone, compiled: transformers' forward over a StaticCache,
    the prompt eager, each decode step one call of the forward compiled
    with ``backend`` (inductor: ``mode="reduce-overhead"``, CUDA graphs
    included), greedy, ``n`` tokens per prompt. The first prompt compiles
    (``compile_s``) and is not timed. TTFT and ms/token p50 over the
    others, and the tokens of each prompt."""
    from transformers import StaticCache

    dev = model.device
    length = max(len(p) for p in prompts) + n + 1
    try:
        cache = StaticCache(config=model.config, max_cache_len=length)
    except TypeError:                                  # transformers 4.x: the batch, device and dtype named
        cache = StaticCache(config=model.config, max_batch_size=1, max_cache_len=length, device=dev,
                            dtype=model.dtype)
    kwargs: dict[str, Any] = {"mode": "reduce-overhead"} if backend == "inductor" else {}
    step = torch.compile(model.forward, backend=backend, fullgraph=True, **kwargs)
    ttft: list[float] = []
    mpt: list[float] = []
    tokens: list[list[int]] = []
    compile_s = 0.0
    for i, ids in enumerate([prompts[0], *prompts]):
        with torch.inference_mode():                   # the cache's tensors are inference tensors
            cache.reset()
        synchronize(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            x = torch.tensor([ids], device=dev)
            out = model(input_ids=x, past_key_values=cache, use_cache=True,
                        cache_position=torch.arange(len(ids), device=dev), logits_to_keep=1)
            tok = out.logits[:, -1].argmax(-1, keepdim=True)           # [1, 1]
            got = [int(tok)]
            t1 = time.perf_counter()
            for j in range(n - 1):
                pos = torch.tensor([len(ids) + j], device=dev)
                logits = step(input_ids=tok, past_key_values=cache, cache_position=pos, use_cache=True).logits
                tok = logits[:, -1].argmax(-1, keepdim=True).clone()   # out of the graph's buffer
                got.append(int(tok))
        synchronize(dev)
        t2 = time.perf_counter()
        if i == 0:
            compile_s = t2 - t0
            continue
        ttft.append((t1 - t0) * 1e3)
        mpt.append((t2 - t1) * 1e3 / max(1, n - 1))
        tokens.append(got)
    return {"backend": backend, "compile_s": round(compile_s, 2), "ttft_ms": ttft, "ms_per_token": mpt,
            "tokens": tokens}


def graph_path_failures(graphs: GraphDecoder | None) -> list[str]:
    """Why the graph path cannot be said to have run: off, given up, or
    never replayed (a step and a verify)."""
    if graphs is None:
        return ["the graph path is off (no GraphDecoder: device.cuda_graphs or the backend)"]
    out = []
    if not graphs.enabled:
        out.append(f"graphs were given up: {graphs.failure}")
    if graphs.replays == 0:
        out.append("no decode step was replayed from a graph")
    if graphs.verify_rows and graphs.verify_replays == 0:
        out.append("no verify forward was replayed from a graph")
    return out


def _timed(device: torch.device, fn: Any, repeats: int) -> tuple[float, Any]:
    """Median ms of ``fn()`` (each timed to the end of its device work) and its last result."""
    samples, out = [], None
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        out = fn()
        synchronize(device)
        samples.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(samples), out


def attention_rows(engine: LocalEngine, graphs: GraphDecoder | None, positions: list[int],
                   repeats: int = 5, rows: int = 9) -> list[dict[str, Any]]:
    """At each position (its bucket: up to 4096 and beyond): a decode step
    and a ``rows``-row verify, eager and through graphs, over the same
    cache; ms of each and the graph logits against the eager ones (max
    |diff|, argmax agreement)."""
    backend, session = engine.backend, engine.pool.acquire(SCRATCH_URI)
    text = "".join(p.read_text(errors="replace") for p in default_corpus())
    ids = engine.tokenizer(text, add_special_tokens=False).input_ids
    out = []
    kept = backend.graphs
    try:
        for pos in positions:
            if pos + rows + 1 >= backend.n_ctx:
                out.append({"position": pos, "bucket": None, "failures": [f"does not fit n_ctx {backend.n_ctx}"]})
                continue
            seq = (ids * (pos // max(1, len(ids)) + 2))[:pos + rows]
            session.truncate(0)
            backend.graphs = None
            session.prefill(seq[:pos])
            row: dict[str, Any] = {"position": pos, "failures": []}
            results: dict[str, torch.Tensor] = {}
            for name, g in (("eager", None), ("graphs", graphs)):
                if name == "graphs" and g is None:
                    continue
                backend.graphs = g

                def one() -> torch.Tensor:
                    logits = session.decode_step(seq[pos])
                    session.truncate(pos)
                    return logits

                def verify() -> torch.Tensor:
                    logits = session.verify(seq[pos:pos + rows])
                    session.truncate(pos)
                    return logits
                row[f"{name}_step_ms"], results[f"{name}_step"] = _timed(backend.device, one, repeats)
                row[f"{name}_verify{rows}_ms"], results[f"{name}_verify"] = _timed(backend.device, verify, repeats)
            if graphs is not None:
                row["bucket"] = graphs.bucket(pos)
                for what in ("step", "verify"):
                    e, g = results[f"eager_{what}"].reshape(-1, backend.vocab_size), results[f"graphs_{what}"].reshape(-1, backend.vocab_size)
                    diff = float((g - e).abs().max())
                    agree = float((g.argmax(-1) == e.argmax(-1)).float().mean())
                    row[f"{what}_max_abs_diff"], row[f"{what}_agreement"] = round(diff, 5), agree
                    scale = float(e.abs().max())
                    tol = 1e-3 if backend.dtype == torch.float32 else 0.1
                    if diff > tol * max(1.0, scale):
                        row["failures"].append(f"{what}: graph logits differ from eager by {diff:.4g} "
                                               f"(max |eager| {scale:.4g})")
                row["step_graphs_vs_eager"] = round(row["graphs_step_ms"] / row["eager_step_ms"], 3)
            else:
                row["bucket"] = None
            row["eager_verify_vs_step"] = round(row[f"eager_verify{rows}_ms"] / row["eager_step_ms"], 3)
            out.append(row)
    finally:
        backend.graphs = kept
        session.truncate(0)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="model dir or .gguf (default: the embedded model)")
    p.add_argument("--device", default="cuda")
    p.add_argument("--holes", type=int, default=8)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--check-steps", type=int, default=64, help="graph-vs-eager steps per hole")
    p.add_argument("--prefill-tokens", type=int, default=1024, help="cold prefill length (0: skip)")
    p.add_argument("--lines", type=int, default=2, help="keystroke trace: lines typed")
    p.add_argument("--emulate-graphs", action="store_true", help="off CUDA: run the graph path emulated")
    p.add_argument("--require-graphs", action="store_true",
                   help="fail when the graph path is off or no graph (step and verify) was replayed")
    p.add_argument("--attention-positions", type=int, nargs="*", default=[255, 1000, 4000],
                   help="positions of the attention rows (graph vs eager step and 9-row verify)")
    p.add_argument("--bandwidth-mb", type=int, default=None,
                   help="buffer for the read-bandwidth measure (default 2048 on CUDA, 128 on a CPU)")
    p.add_argument("--precision", default="auto",
                   help="model.precision (default auto: the plan timed on this machine; a test pins float32)")
    p.add_argument("--compiled", action="store_true",
                   help="also time the model alone, compiled (gpt-fast's recipe) beside generate()")
    p.add_argument("--compile-backend", default=None,
                   help="torch.compile backend for --compiled (default inductor on CUDA, eager elsewhere: "
                        "a CPU dry run checks the path without compiling)")
    p.add_argument("--json", dest="json_out")
    return p.parse_args(argv)


def check_config(argv: list[str] | None = None) -> Config:
    """The check's own explicit config for these arguments."""
    args = parse_args(argv)
    far = max(args.attention_positions, default=0)
    # the farthest attention row's bucket is a full power of two (4000: the 4096 bucket)
    need = max(args.prefill_tokens, (1 << far.bit_length()) if far else 0) + 64
    overrides: dict[str, Any] = {"device.device": args.device, "model.max_prefix_tokens": 384,
                                 "model.max_suffix_tokens": 128, "model.max_context": max(2048, need),
                                 "device.cuda_graphs": True, "model.precision": args.precision}
    if args.model:
        overrides["model.path"] = args.model
    # its own explicit config: a user's config file (device.cuda_graphs: false,
    # another model) must not change what the check measures
    return Config.default().with_overrides(overrides, source="gpu_latency")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = check_config(argv)
    t0 = time.perf_counter()
    engine = load_engine(config, progress=False)
    load_s = time.perf_counter() - t0
    backend = engine.backend
    if engine.graphs is None and args.emulate_graphs:
        backend.graphs = GraphDecoder(backend, emulate=True)
    graphs = engine.graphs
    info = engine.info()
    dev = backend.device
    gpu = torch.cuda.get_device_name(dev) if dev.type == "cuda" else None
    print(f"model {info['model']} on {info['device']} ({info['dtype']}), {gpu or platform.processor() or 'CPU'}; "
          f"load + warm-up {load_s:.1f} s; CUDA graphs: {info['cuda_graphs'] or 'unavailable (not CUDA)'}"
          + (" (emulated)" if graphs is not None and graphs.emulated else ""))
    print(f"kernel plan: {backend.plan.describe()}")
    failures: list[str] = []

    # generate()'s model: the engine's module, or a separate full copy when the engine released it
    baseline, baseline_note = baseline_model(engine, config)
    if baseline_note:
        print(baseline_note)
    holes = cut_line_holes(default_corpus(), args.holes, seed=0)
    prompts = [engine.build_prompt(engine_request(hole))[0].ids for hole in holes]
    rows: dict[str, dict[str, list[float]]] = {k: {"ttft_ms": [], "ms_per_token": []}
                                               for k in ("generate", "sol-eager", "sol-graphs")}
    same = {"sol-eager": 0, "sol-graphs": 0}
    first_tokens: list[int] = []
    for ids in prompts:
        ref: list[int] | None = None
        if baseline is not None:
            ttft, mpt, ref = bench_generate(baseline, ids, args.tokens)
            rows["generate"]["ttft_ms"].append(ttft)
            rows["generate"]["ms_per_token"].append(mpt)
        for name in ("sol-eager", "sol-graphs"):
            if name == "sol-graphs" and graphs is None:
                continue
            backend.graphs = graphs if name == "sol-graphs" else None
            ttft, mpt, toks, _ = bench_sol(engine, ids, args.tokens, speculative=False)
            rows[name]["ttft_ms"].append(ttft)
            rows[name]["ms_per_token"].append(mpt)
            same[name] += toks == ref
            if name == "sol-graphs" and not first_tokens:
                first_tokens = toks
        backend.graphs = graphs
    compiled: dict[str, Any] | None = None
    if args.compiled and baseline is not None:
        compile_backend = args.compile_backend or ("inductor" if dev.type == "cuda" else "eager")
        try:
            compiled = bench_compiled(baseline, prompts, args.tokens, compile_backend)
            rows["model-compiled"] = {"ttft_ms": compiled["ttft_ms"], "ms_per_token": compiled["ms_per_token"]}
            print(f"model alone, compiled ({compile_backend}): compiled in {compiled['compile_s']} s")
        except Exception as exc:  # the anchor is reported, never the check's failure
            compiled = {"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]}
            print(f"model alone, compiled: unavailable ({compiled['error']})")
    plan = backend.plan
    dense = not plan.storage.startswith("int8") and not plan.head_storage.startswith("int8")
    exact = all(k == "float32" for k in (plan.storage, plan.prefill, plan.short, plan.head_storage, plan.head))
    if exact and baseline is not None and same["sol-eager"] < len(prompts):
        failures.append(f"float32 eager tokens differ from generate() on {len(prompts) - same['sol-eager']} holes")

    base = rows["generate"]
    print(f"\n{len(holes)} holes, {args.tokens} tokens each, greedy, cold cache")
    print(f"{'path':<11} {'TTFT p50':>9} {'ms/tok p50':>11} {'vs generate':>12} {'same tokens':>12}")
    summary: dict[str, Any] = {}
    for name, r in rows.items():
        if not r["ttft_ms"]:
            print(f"{name:<11} {'-':>9} {'-':>11} {'-':>12} {'(unavailable)':>12}")
            continue
        t, m = statistics.median(r["ttft_ms"]), statistics.median(r["ms_per_token"])
        ratio = m / statistics.median(base["ms_per_token"]) if base["ms_per_token"] else float("nan")
        eq = f"{same[name]}/{len(holes)}" if name in same else "ref"
        print(f"{name:<11} {t:>9.1f} {m:>11.2f} {ratio:>11.2f}x {eq:>12}")
        summary[name] = {"ttft_p50_ms": t, "ms_per_token_p50": m, "vs_generate": ratio,
                         "same_tokens": same.get(name)}

    check = None
    if graphs is not None:
        # a quantized plan differs from the dense module by its rounding: compared only when dense
        reference = transformers_reference(baseline) if baseline is not None and dense else None
        # in half precision, every path against a float32 copy too (graphcheck's module doc)
        anchor = (float32_anchor(baseline) if baseline is not None and dense and backend.dtype != torch.float32
                  else None)
        check = compare_graphs(backend, graphs, prompts, args.check_steps, reference=reference, anchor=anchor)
        del anchor
        engine.pool.acquire(SCRATCH_URI).truncate(0)   # the comparison wrote the session's cache
        failures += [f"graphs vs eager: {f}" for f in check.failures()]
        print(f"\ngraphs vs eager ({check.dtype}, {check.documents} holes x {check.steps // max(1, check.documents)} "
              f"steps): max |logit diff| {check.max_abs_diff:.4g} (strain {check.strain:.2f} of the tolerance "
              f"{check.tolerance}), argmax agreement {check.agreement:.3f}, free-running identical "
              f"{check.free_equal}/{check.documents} (first divergence {check.first_divergence}); eager vs "
              f"transformers' forward: max |logit diff| {check.ref_max_abs_diff:.4g} (strain {check.ref_strain:.2f}), "
              f"argmax agreement {check.ref_agree}/{check.ref_steps}")
        for path, dev_ in check.anchor.items():
            print(f"  {path} vs the float32 anchor: max|logit diff| mean {dev_.mean_err:.4g}, max {dev_.max_err:.4g}; "
                  f"argmax on decisive steps {dev_.decisive_agree}/{dev_.decisive_steps}")

    read_gbs = measure_read_bandwidth(dev, (args.bandwidth_mb or (2048 if dev.type == "cuda" else 128)) << 20)
    step_bytes = decode_bytes(backend, int(statistics.median(len(i) for i in prompts)) + args.tokens // 2)
    floor_ms = step_bytes / (read_gbs * 1e9) * 1e3
    decode = {"read_bandwidth_gbs": round(read_gbs, 1), "bytes_per_token": step_bytes,
              "floor_ms": round(floor_ms, 4)}
    for name in ("sol-eager", "sol-graphs", "model-compiled"):
        if name in summary:
            decode[f"{name}_vs_floor"] = round(summary[name]["ms_per_token_p50"] / floor_ms, 2)
    if "sol-eager" in summary and "sol-graphs" in summary:
        decode["graphs_vs_eager"] = round(summary["sol-graphs"]["ms_per_token_p50"]
                                          / summary["sol-eager"]["ms_per_token_p50"], 3)
    if "model-compiled" in summary and "sol-graphs" in summary:
        decode["graphs_vs_compiled"] = round(summary["sol-graphs"]["ms_per_token_p50"]
                                             / summary["model-compiled"]["ms_per_token_p50"], 3)
    print(f"decode floor: {step_bytes / 1e6:.1f} MB per token at {read_gbs:.0f} GB/s = {floor_ms:.3f} ms; {decode}")

    attention = attention_rows(engine, graphs, args.attention_positions) if args.attention_positions else []
    for row in attention:
        print(f"attention at {row['position']} (bucket {row['bucket']}): {row}")
        failures += [f"attention at {row['position']}: {f}" for f in row["failures"]]
    prefill_ms = cold_prefill_ms(engine, args.prefill_tokens) if args.prefill_tokens else None
    if prefill_ms is not None:
        print(f"cold prefill of {args.prefill_tokens} tokens: {prefill_ms:.1f} ms")
    idle = idle_release_check(engine, prompts[0], args.tokens, first_tokens) if first_tokens else {}
    if idle and idle.get("same_tokens") is False:
        failures.append("tokens after idle release + restore differ from before")
    if idle and graphs is not None and not idle.get("recaptures"):
        failures.append("no graph was captured again after the restore")
    print(f"idle release / restore: {idle}")

    trace = make_trace(default_corpus(), args.lines, 0)
    say = lambda msg: print("  " + msg, file=sys.stderr, flush=True)  # noqa: E731
    every, computed = run_sol(engine, trace, say)
    print(f"\nkeystroke trace: {len(trace)} keystrokes, TTFT p50 {every.pct('ttft_ms', .5):.1f} ms, "
          f"p95 {every.pct('ttft_ms', .95):.1f} ms; model-computed p50 {computed.pct('ttft_ms', .5):.1f} ms, "
          f"p95 {computed.pct('ttft_ms', .95):.1f} ms; type-through {every.type_through}")
    # the reuse path: keystrokes the model computed on top of a reused cache
    reuse = sorted(t for t, c, n in zip(computed.ttft_ms, computed.computed_tokens, computed.prompt_tokens)
                   if c < n // 2)
    reuse_p50 = statistics.median(reuse) if reuse else None
    print(f"keystroke TTFT on the reuse path: p50 {reuse_p50} ms over {len(reuse)} keystrokes")
    print(f"graphs: {graphs.info() if graphs is not None else 'unavailable'}")
    if args.require_graphs:
        failures += graph_path_failures(graphs)
    for f in failures:
        print(f"FAIL: {f}")
    print("gpu_latency: " + ("FAILED" if failures else "all checks passed"))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "info": info, "gpu": gpu, "load_s": load_s, "plan": plan.to_dict(), "baseline": baseline_note,
            "rows": rows, "summary": summary, "compiled": compiled,
            "graphs": graphs.info() if graphs is not None else None,
            "graph_check": check.to_dict() if check is not None else None,
            "decode": decode, "prefill": {"tokens": args.prefill_tokens, "ms": prefill_ms},
            "idle_release": idle, "attention": attention, "attention_kernels": ATTENTION_LOG.summary(),
            "attention_cudnn": ATTENTION_LOG.cudnn.summary() if ATTENTION_LOG.cudnn is not None else None,
            "trace": {"keystrokes": len(trace), "ttft_p50": every.pct("ttft_ms", .5),
                      "ttft_p95": every.pct("ttft_ms", .95), "model_ttft_p50": computed.pct("ttft_ms", .5),
                      "model_ttft_p95": computed.pct("ttft_ms", .95), "model_keystrokes": len(computed.ttft_ms),
                      "reuse_ttft_p50": reuse_p50, "reuse_keystrokes": len(reuse),
                      "type_through": every.type_through},
            "failures": failures,
        }, indent=1, default=str))
        print(f"wrote {args.json_out}")
    engine.close()
    return 1 if failures else 0


def engine_request(hole: Any) -> Any:
    from soldaemon.api import CompletionRequest

    return CompletionRequest(id="h", prefix=hole.prefix, suffix=hole.suffix)


if __name__ == "__main__":
    sys.exit(main())
