"""``soldaemon bench``: this runtime against transformers ``generate()`` on
the same model, the same prompts, in the same run.

For each hole cut from real source (see :mod:`.holes`), the same FIM prompt
ids go to:

- ``generate``: plain transformers ``model.generate()``, greedy, its own
  dynamic KV cache (on a separate full copy of the model when
  ``sol.memory_budget`` offloads layers: see :func:`baseline_model`);
- ``sol-exact``: this runtime's prefill + decode steps (static KV cache, lean
  step) dense in the baseline's dtype, on the baseline's weights, greedy,
  speculation off — must give ``generate``'s tokens;
- ``sol``: the engine with its kernel plan (``model.precision``: the kernels
  measured fastest on this machine, e.g. int8 products);
- ``sol+spec``: ``sol`` with prompt-lookup speculation.

All three produce exactly ``--tokens`` tokens (stop tokens ignored) from a cold
cache, so time per token compares like with like; the greedy tokens must agree
(reported). TTFT is arrival → first token sampled. Then the full pipeline
(``complete``: windowing, stop rules, post-processing) runs on the same holes
for end-to-end latency and a first-line exact-match rate.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.config import Config
from soldaemon_bench.baselines import baseline_model, bench_generate
from soldaemon_bench.header import engine_label, with_windows
from soldaemon_bench.holes import cut_line_holes, default_corpus


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--holes", type=int, help="number of holes (default 6; --quality: 40)")
    p.add_argument("--tokens", type=int, help="tokens generated per hole (default 24; --quality: at most 48)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--corpus", nargs="*", help="source files (default: modules of Python's standard library); "
                   "--quality also reads JavaScript and takes npm:NAME@VERSION, an npm package's own JavaScript")
    p.add_argument("--max-prefix-tokens", type=int,
                   help="the prompt's prefix window in tokens (default: the served model's, as the daemon serves it: "
                        "model.max_prefix_tokens auto, the 0.5B 768, the 1.5B 1024)")
    p.add_argument("--max-suffix-tokens", type=int,
                   help="the prompt's suffix window in tokens (default: the served model's, 256)")
    p.add_argument("--json", dest="json_out", help="write the raw results here")
    p.add_argument("--trace", action="store_true",
                   help="replay keystrokes typing real lines (one request per keystroke) instead")
    p.add_argument("--lines", type=int, default=4, help="--trace: lines typed (default 4)")
    p.add_argument("--baselines", nargs="*", default=["generate", "llama.cpp", "llama.vscode"],
                   help="baselines to run. llama.vscode: llama.cpp's own llama-server (built for this CPU and "
                        "cached on first use) with llama.vscode's documented flags, sent llama.vscode's /infill "
                        "requests (--trace: with its completion cache and speculative FIM). llama.cpp (or "
                        "model-alone): the model alone through llama-cpp-python, shown as 'model alone "
                        "(llama-cpp-python)' (--quality: the plain prompt to its end token; --trace: the daemon's "
                        "windows, PSM, the middle at the cursor, stopped at a newline); --trace also: "
                        "llama.cpp-line (the cursor line after the middle token), llama.cpp-spm (SPM prompts), "
                        "generate, remote; --quality also: raw/generate (this runtime's model alone)")
    p.add_argument("--baseline-every", type=int, default=3,
                   help="--trace: run generate() on every Nth keystroke only (it recomputes the whole prompt)")
    p.add_argument("--interrupt", action="store_true",
                   help="--trace: the user types on as soon as ghost text appears (each request superseded)")
    p.add_argument("--pace-ms", type=float, default=150.0,
                   help="--trace: keys arrive at least this far apart for the daemon and llama.vscode, whose "
                        "background work runs between keys (default 150: a fast typist, ~80 words a minute; "
                        "0: the next key the moment the answer is done; ignored with --interrupt)")
    p.add_argument("--compare-spec", action="store_true",
                   help="--trace: also run this engine with speculation off (decode tokens/s with vs without)")
    p.add_argument("--jumps", action="store_true",
                   help="--trace: after each line, jump to other functions and type there (with and without a pause)")
    p.add_argument("--png", help="--trace/--quality: write the plot here")
    p.add_argument("--quality", action="store_true",
                   help="score completions on holes cut from real code (daemon vs the model alone vs llama.vscode) "
                        "instead")
    p.add_argument("--fim-orders", nargs="*", choices=("psm", "spm"),
                   help="--quality: one daemon column per FIM order (default: the configured order)")
    p.add_argument("--precisions", nargs="*",
                   help="--quality: a column sol[P] per model.precision P (auto float32 bfloat16 float16 int8), "
                        "each with the plan that precision gets on this machine")
    p.add_argument("--ablate", nargs="*", choices=("outline", "healing", "anchor", "speculation", "second_choice",
                                                   "candidates", "blocked_copy"),
                   help="--quality: also run the daemon (with --models: the first model) with these parts toggled "
                        "(outline: toggled from the served model's model.max_outline_tokens -- by default off for the 0.5B, on "
                        "for the 1.5B; healing: off; anchor: the middle starts at the "
                        "cursor; speculation: off, for decode tok/s with and without on the same holes; second_choice: off, "
                        "a first line that repeats the line below dropped, not decoded again; candidates: toggled from the served "
                        "model's completion.candidates -- the greedy answer alone for the 1.5B, which ranks 4 block "
                        "candidates by default, 4 for the 0.5B; blocked_copy: a second engine loaded with "
                        "model.blocked_copy toggled, for one weight layout against the blocked one in one run)")
    p.add_argument("--baselines-only", action="store_true",
                   help="--quality: only the --baselines columns (e.g. to add llama.vscode to an earlier run's holes)")
    p.add_argument("--models", nargs="*",
                   help="--quality: a column per embedded model (qwen2.5-coder-0.5b qwen2.5-coder-1.5b) or "
                        "target+draft pair (qwen2.5-coder-1.5b+qwen2.5-coder-0.5b); the model-alone and llama.vscode "
                        "columns then run each target's own GGUF")
    p.add_argument("--functional", action="store_true",
                   help="--quality: holes their own project's tests can judge (pass@1 beside exact match): cut "
                        "from more-itertools (its PyPI sdist's tests) and standard-library modules (CPython's "
                        "tests), each checked to matter (bench/soldaemon_bench/functional.py)")
    p.add_argument("--hole-kinds", nargs="+", choices=("line", "block"),
                   help="--quality: the kinds of hole to cut, taken in turn (default: line block)")
    p.add_argument("--hole-ids", nargs="+", metavar="FILE:LINE",
                   help="--quality: run only these of the holes cut (as a run's JSON names them: path:line), "
                        "e.g. to rerun the ones a change touches")
    p.add_argument("--context", choices=("none", "siblings"), default="none",
                   help="--quality: siblings: also run the daemon with the other source files of each hole's "
                        "directory as context chunks, chosen by relevance and (ablation) as sent")


@dataclass
class Row:
    ttft_ms: list[float] = field(default_factory=list)
    ms_per_token: list[float] = field(default_factory=list)
    tokens: list[list[int]] = field(default_factory=list)
    accept: list[float] = field(default_factory=list)

    def p50(self, name: str) -> float:
        values = getattr(self, name)
        return statistics.median(values) if values else float("nan")


def exact_session(engine: Any, model: Any | None) -> Any:
    """A session on the reference math: the lean runtime dense in ``model``'s
    dtype over ``model``'s own tensors (the generate() baseline's copy when
    the engine released its module), or the engine's session when the engine
    already runs the reference plan (or its backend is the HF fallback)."""
    from soldaemon.runtime.engine.local import SCRATCH_URI
    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.kv.session import KVSession

    backend = engine.backend
    if not isinstance(backend, LeanBackend) or (not backend.released and backend.reference):
        return engine.pool.acquire(SCRATCH_URI)
    if model is None:
        return None
    return KVSession(LeanBackend(model, backend.n_ctx))


def bench_sol(engine: Any, ids: list[int], n: int, speculative: bool,
              session: Any = None) -> tuple[float, float, list[int], float]:
    """One cold generation of ``n`` tokens on ``session`` (default: the
    engine's own): TTFT ms, ms per token, tokens, acceptance."""
    from soldaemon.policy.draft import PromptLookup
    from soldaemon.runtime.decode.generate import generate
    from soldaemon.runtime.decode.sampling import Greedy
    from soldaemon.runtime.engine.local import SCRATCH_URI

    session = session or engine.pool.acquire(SCRATCH_URI)
    session.truncate(0)  # cold: no reuse from the previous hole
    t0 = time.perf_counter_ns()
    toks: list[int] = []
    stats = None
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=frozenset(), max_tokens=n,
                       drafter=PromptLookup() if speculative else None,
                       draft_k=engine.config.completion.draft_tokens,
                       draft_length=engine.part.draft_length if speculative else None):
        toks.extend(ev.tokens)
        stats = ev.stats
    t1 = time.perf_counter_ns()
    assert stats is not None
    ttft = (stats.first_token_ns - t0) / 1e6
    acc = stats.accepted_tokens / stats.draft_tokens if stats.draft_tokens else 0.0
    return ttft, (t1 - stats.first_token_ns) / 1e6 / (n - 1), toks, acc


def run(args: argparse.Namespace, config: Config) -> int:
    import torch

    from soldaemon.runtime.engine.local import SCRATCH_URI, load_engine

    if args.trace:
        from soldaemon_bench import trace

        return trace.run(args, config)
    if args.quality:
        from soldaemon_bench import quality

        return quality.run(args, config)
    args.holes = 6 if args.holes is None else args.holes
    args.tokens = 24 if args.tokens is None else args.tokens

    config = with_windows(config, args)
    files = [Path(p) for p in args.corpus] if args.corpus else default_corpus()
    holes = cut_line_holes(files, args.holes, args.seed)
    engine = load_engine(config)
    model, baseline_note = baseline_model(engine, config)
    if baseline_note:
        print(baseline_note, file=sys.stderr, flush=True)
    exact = exact_session(engine, model)
    names = (["generate"] if model is not None else []) + (["sol-exact"] if exact is not None else []) \
        + ["sol", "sol+spec"]
    rows = {name: Row() for name in names}
    e2e_ms: list[float] = []
    e2e_ttft: list[float] = []
    matched = 0
    prompts = [engine.build_prompt(CompletionRequest(id="b", prefix=h.prefix, suffix=h.suffix))[0].ids
               for h in holes]
    # warm every path once (allocator, kernels) before timing
    if model is not None:
        bench_generate(model, prompts[0][:64], 4)
    bench_sol(engine, prompts[0][:64], 4, True)
    for i, (hole, ids) in enumerate(zip(holes, prompts)):
        for name in rows:
            if name == "generate":
                ttft, mpt, toks = bench_generate(model, ids, args.tokens)
                acc = 0.0
            else:
                ttft, mpt, toks, acc = bench_sol(engine, ids, args.tokens, name == "sol+spec",
                                                 session=exact if name == "sol-exact" else None)
            r = rows[name]
            r.ttft_ms.append(ttft)
            r.ms_per_token.append(mpt)
            r.tokens.append(toks)
            r.accept.append(acc)
        engine.pool.acquire(SCRATCH_URI).truncate(0)
        req = CompletionRequest(id=f"h{i}", prefix=hole.prefix, suffix=hole.suffix, language="python",
                                max_tokens=args.tokens)
        done = [ev for ev in engine.complete(req, CancelToken()) if isinstance(ev, Done)][0]
        e2e_ms.append(done.timings.total_ms)
        e2e_ttft.append(done.timings.ttft_ms)
        matched += int(done.items[0].strip() == hole.expected.strip())
        print(f"  hole {i + 1}/{len(holes)} {hole.path}:{hole.line} prompt {len(ids)} tok  "
              f"→ {done.items[0]!r}", file=sys.stderr, flush=True)
    # the reference for token agreement: generate(), or sol-exact when generate() was skipped
    ref_name = next(n for n in ("generate", "sol-exact", "sol") if n in rows)
    ref = rows[ref_name]
    same: int | None = (sum(a == b for a, b in zip(ref.tokens, rows["sol-exact"].tokens))
                        if "generate" in rows and "sol-exact" in rows else None)
    same_half = sum(a == b == c for a, b, c in zip(ref.tokens, rows["sol"].tokens, rows["sol+spec"].tokens))
    lines = [
        f"soldaemon bench — {engine_label(engine.info())}, {torch.get_num_threads()} threads, "
        f"{platform.processor() or platform.machine()}",
        f"{len(holes)} holes from {len(files)} files (seed {args.seed}), prompts "
        f"{min(map(len, prompts))}–{max(map(len, prompts))} tokens, {args.tokens} tokens each, cold cache",
    ]
    if baseline_note:
        lines.append(baseline_note)
    ttft_vs = "TTFT vs gen" if ref_name == "generate" else "TTFT vs exact"
    lines += [
        "",
        f"{'path':<10} {'TTFT p50 ms':>12} {'ms/token p50':>13} {'vs ' + ref_name:>12} {ttft_vs:>12} {'accept':>7}",
    ]
    for name, r in rows.items():
        lines.append(
            f"{name:<10} {r.p50('ttft_ms'):>12.1f} {r.p50('ms_per_token'):>13.1f} "
            f"{r.p50('ms_per_token') / ref.p50('ms_per_token'):>11.2f}x "
            f"{r.p50('ttft_ms') / ref.p50('ttft_ms'):>11.2f}x "
            f"{(statistics.mean(r.accept) if name == 'sol+spec' else float('nan')):>7.2f}"
        )
    lines += [
        "",
        (f"greedy tokens: sol-exact = generate on {same}/{len(holes)} holes; " if same is not None else
         "greedy tokens: no generate() baseline (above); ")
        + f"sol = sol+spec = {ref_name} on {same_half}/{len(holes)} (sol runs its kernel plan: "
          f"{engine.info()['precision'].get('summary', 'transformers fallback')})",
        f"full pipeline (complete): end-to-end p50 {statistics.median(e2e_ms):.0f} ms, TTFT p50 "
        f"{statistics.median(e2e_ttft):.0f} ms, rest-of-line exact match {matched}/{len(holes)}",
    ]
    print("\n".join(lines))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({
            "info": engine.info(), "holes": len(holes), "tokens": args.tokens,
            "rows": {k: asdict(v) for k, v in rows.items()}, "e2e_ms": e2e_ms, "e2e_ttft_ms": e2e_ttft,
            "exact": matched, "identical": same, "baseline": baseline_note or "generate on the engine's model",
            "offloaded_layers": engine.diagnosis()["offloaded_layers"],
        }, indent=1))
    return 0
