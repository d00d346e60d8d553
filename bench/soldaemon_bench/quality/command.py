"""``soldaemon bench --quality``: the run."""

from __future__ import annotations

import argparse
import dataclasses
import platform
import sys
import time
from pathlib import Path
from typing import Any

from soldaemon.config import Config
from soldaemon.errors import BadRequest
from soldaemon.pipeline.relevance import ContextSelector
from soldaemon_bench.header import engine_label, with_windows
from soldaemon_bench.corpus import resolve_corpus
from soldaemon_bench.holes import cut_holes
from soldaemon_bench.quality.columns import (ABLATIONS, CONFIG_ABLATIONS, LLAMA_VSCODE, LOAD_ABLATIONS, MODEL_ALONE,
                                             LlamaCpp, LlamaVscode, ablation, llama_cpp_column, llama_vscode_column,
                                             make_precision_engines, model_configs, model_label, postprocessed, run_raw,
                                             run_sol, sibling_context, sol_variants, toggled_outline)
from soldaemon_bench.quality.report import agreement, plot, ratios, table, write_json
from soldaemon_bench.quality.scores import Column


DEFAULT_HOLES = 40


DEFAULT_TOKENS = 48


def run(args: argparse.Namespace, config: Config) -> int:
    from soldaemon.runtime.engine.local import load_engine

    n_holes = DEFAULT_HOLES if args.holes is None else args.holes
    max_tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    if n_holes < 1 or max_tokens < 1:
        raise BadRequest(f"--holes and --tokens must be >= 1 (got {n_holes}, {max_tokens})")
    config = with_windows(config, args)
    if args.corpus and getattr(args, "functional", False):
        raise BadRequest("--functional cuts its holes from more-itertools and the standard library, whose tests "
                         "it runs; --corpus is for runs judged by exact match")
    files = resolve_corpus(args.corpus)
    say = lambda msg: print("  " + msg, file=sys.stderr, flush=True)  # noqa: E731
    functional = None
    if getattr(args, "functional", False):
        from soldaemon_bench.functional import cached_holes, holes_cache_path

        hole_kinds = tuple(getattr(args, "hole_kinds", None) or ("line", "block"))
        functional = cached_holes(n_holes, args.seed, holes_cache_path(hole_kinds), kinds=hole_kinds, say=say)
        holes = [fh.hole for fh in functional]
        files = sorted({Path(h.file) for h in holes})
    else:
        holes = cut_holes(files, n_holes, args.seed, kinds=tuple(getattr(args, "hole_kinds", None)
                                                                  or ("line", "block")))
    if not holes:
        raise BadRequest("--corpus: no holes could be cut (no parsable Python or JavaScript with function bodies)")
    holes, functional = _chosen(holes, functional, getattr(args, "hole_ids", None))
    models = model_configs(config, list(getattr(args, "models", None) or []))
    sol_configs = ([] if getattr(args, "baselines_only", False) or models
                   else sol_variants(config, getattr(args, "fim_orders", None)))
    ablate = list(getattr(args, "ablate", None) or [])
    for a in ablate:
        if a not in ABLATIONS:
            raise BadRequest(f"--ablate: unknown part {a!r} (expected: {', '.join(ABLATIONS)})")
    by_model = [(Column(label), target, load_engine(cfg)) for label, target, cfg in models]
    for col, _target, eng in by_model:
        choice = eng.info()["model_choice"] or {}
        say(f"{col.name}: {eng.info()['precision']['summary']}; draft: {choice.get('draft') or 'none'} "
            f"({choice.get('draft_reason')})")
    engine = by_model[0][2] if by_model else load_engine(config)
    precision_engines = make_precision_engines(engine, config, getattr(args, "precisions", None) or [], say)
    # load-time ablations (the blocked copy): an engine of their own, beside the precision columns
    base = (models[0][0], models[0][2]) if models else ("sol", config)
    for part in (a for a in ablate if a in LOAD_ABLATIONS):
        sign, cfg = ablation(part, base[1])
        eng = load_engine(cfg)
        name = f"{base[0]} {sign}{part}"
        say(f"{name}: {eng.info()['precision']['summary']}; steps on the blocked copy: "
            f"{eng.info()['precision'].get('steps_on_blocked_copy')}")
        precision_engines.append((name, eng))
    baselines = args.baselines or []
    want_raw = "raw" in baselines or "generate" in baselines  # generate: the model alone, as in the speed bench
    threads = engine.info()["threads"]
    want_alone = "model-alone" in baselines or "llama.cpp" in baselines   # llama.cpp: the old name
    llama = llama_cpp_column(engine, threads, say) if want_alone else None
    # with --models: the model alone and llama.vscode on each target model's own GGUF
    targets = _per_target(by_model)
    llamas: list[tuple[Column, LlamaCpp]] = []
    if llama is not None and by_model:
        llamas = [(Column(f"{MODEL_ALONE}[{model_label(t)}]"), llama if e is engine else LlamaCpp(e, llama.threads))
                  for t, e in targets]
        llama = None
    vscodes: list[tuple[Column, LlamaVscode]] = []
    if "llama.vscode" in baselines:
        for t, e in targets or [("", engine)]:
            runner = llama_vscode_column(e, threads, say)
            if runner is not None:
                vscodes.append((Column(f"{LLAMA_VSCODE}[{model_label(t)}]" if t else LLAMA_VSCODE), runner))
    try:
        return _run_holes(args, config, engine, holes, files, functional, max_tokens, say, sol_configs, by_model,
                          precision_engines, want_raw, llama, llamas, vscodes, ablate)
    finally:
        for _col, runner in vscodes:
            runner.close()


def _chosen(holes: list, functional: list | None, ids: list[str] | None) -> tuple[list, list | None]:
    """Only the holes ``--hole-ids`` names (``path:line``, as the JSON has them); every id must name one."""
    if not ids:
        return holes, functional
    have = {f"{h.path}:{h.line}": i for i, h in enumerate(holes)}
    missing = [i for i in ids if i not in have]
    if missing:
        raise BadRequest(f"--hole-ids: no such hole among the {len(holes)} cut: {', '.join(missing)} "
                         f"(ids are path:line, as in a run's JSON)")
    keep = sorted({have[i] for i in ids})
    return [holes[i] for i in keep], None if functional is None else [functional[i] for i in keep]


def _per_target(by_model: list[tuple[Column, str, Any]]) -> list[tuple[str, Any]]:
    """(target model, its first engine) per target of ``--models``, in order."""
    first: dict[str, Any] = {}
    for _col, target, eng in by_model:
        first.setdefault(target, eng)
    return list(first.items())


def _run_holes(args: argparse.Namespace, config: Config, engine: Any, holes: list, files: list[Path],
               functional: Any, max_tokens: int, say: Any, sol_configs: list, by_model: list,
               precision_engines: list, want_raw: bool, llama: LlamaCpp | None,
               llamas: list[tuple[Column, LlamaCpp]], vscodes: list[tuple[Column, LlamaVscode]],
               ablate: list[str]) -> int:
    """Every hole through every column; print the table (and ratios)."""
    # the model alone in this runtime, per model (raw[0.5b] beside sol[0.5b]) so each column's ends
    # are compared with its own model's raw answers
    labelled = [(f"[{model_label(t)}]", eng) for t, eng in _per_target(by_model)] or [("", engine)]
    raws = [(Column(f"raw{label}"), Column(f"raw+pp{label}"), eng) for label, eng in labelled] if want_raw else []
    own_config = engine.config        # the engine's own (with --models: the first model's), restored per hole
    # what the ablations take a part from: the first sol config, or with --models the first model
    first: tuple[str, Config] | None = (sol_configs[0] if sol_configs
                                        else (by_model[0][0].name, own_config) if by_model else None)
    outline_config = toggled_outline(first[1]) if "outline" in ablate and first else None
    sign = "-" if first and first[1].model.windows().outline > 0 else "+"
    no_outline = Column(f"{first[0]} {sign}outline") if outline_config is not None and first else None
    # the config ablations: (column, the first config with the part off)
    ablated = [(a, *ablation(a, first[1])) for a in ABLATIONS if a in ablate and a in CONFIG_ABLATIONS and first]
    without = [(Column(f"{first[0]} {sign}{a}"), config) for a, sign, config in ablated if first]
    siblings = getattr(args, "context", "none") == "siblings" and bool(sol_configs)
    ctx_rel = Column(f"{sol_configs[0][0]}+ctx") if siblings else None
    ctx_order = Column(f"{sol_configs[0][0]}+ctx[order]") if siblings else None
    by_precision = [(Column(name), eng) for name, eng in precision_engines]
    columns = ([Column(name) for name, _ in sol_configs] + [col for col, _t, _e in by_model]
               + [col for col, _ in by_precision]
               + ([no_outline] if no_outline else [])
               + [col for col, _ in without]
               + ([ctx_rel, ctx_order] if ctx_rel and ctx_order else [])
               + [col for raw, raw_pp, _e in raws for col in (raw, raw_pp)] + [col for col, _ in llamas]
               + [col for col, _ in vscodes] + ([Column(MODEL_ALONE)] if llama else []))
    kinds = [h.kind for h in holes]
    t_start = time.time()
    for i, hole in enumerate(holes):
        uri = f"file:///{hole.path}"
        for (name, cfg), col in zip(sol_configs, columns):
            engine.config = cfg
            col.add(hole, *run_sol(engine, hole, uri, max_tokens), python=True)
        for col, _target, eng in by_model:
            col.add(hole, *run_sol(eng, hole, uri, max_tokens), python=True)
        for col, eng in by_precision:
            col.add(hole, *run_sol(eng, hole, uri, max_tokens), python=True)
        if no_outline is not None and outline_config is not None:
            engine.config = outline_config
            no_outline.add(hole, *run_sol(engine, hole, uri, max_tokens), python=True)
        for col, cfg in without:
            engine.config = cfg
            col.add(hole, *run_sol(engine, hole, uri, max_tokens), python=True)
        if ctx_rel is not None and ctx_order is not None:
            engine.config = sol_configs[0][1]
            chunks = sibling_context(hole)
            documents = engine.pipeline.documents
            selector = documents.selector
            documents.selector = ContextSelector(max_chars=4 * sol_configs[0][1].model.max_context_tokens)
            ctx_rel.add(hole, *run_sol(engine, hole, uri, max_tokens, chunks), python=True)
            documents.selector = None          # the chunks as sent
            ctx_order.add(hole, *run_sol(engine, hole, uri, max_tokens, chunks), python=True)
            documents.selector = selector
        engine.config = own_config
        for raw, raw_pp, eng in raws:
            text, ms, n_prompt, n_gen, ttft = run_raw(eng, hole, max_tokens)
            raw.add(hole, text, ms, n_prompt, n_gen, ttft, python=True)
            # no latency of its own: computed from the raw text after the run
            raw_pp.add(hole, postprocessed(eng, hole, text), float("nan"), n_prompt, n_gen, python=True)
        if llama is not None:
            columns[-1].add(hole, *llama(hole, max_tokens), python=True)
        for col, runner in llamas:
            col.add(hole, *runner(hole, max_tokens), python=True)
        for col, vsc in vscodes:
            col.add(hole, *vsc(hole, max_tokens), python=True)
        if functional is not None:   # pass@1: CPython's own tests on the filled module
            from soldaemon_bench.functional import passes

            verdicts: dict[str, bool] = {}     # columns that wrote the same text: the tests run once
            for c in columns:
                text = c.texts[-1]
                if text not in verdicts:
                    verdicts[text] = passes(functional[i], text)
                c.scores[-1] = dataclasses.replace(c.scores[-1], passed=verdicts[text])
        if args.json_out:  # after every hole: a long run that is stopped still leaves its results
            write_json(Path(args.json_out), engine.info(), args.seed, max_tokens, files, holes[: i + 1], columns)
        say(f"hole {i + 1}/{len(holes)} {hole.kind} {hole.path}:{hole.line} "
            + " ".join(f"{c.name}={'✓' if c.scores[-1].exact else '·'}"
                       + ("" if c.scores[-1].passed is None else "P" if c.scores[-1].passed else "F") for c in columns)
            + f"  ({time.time() - t_start:.0f} s)")
    info = engine.info()
    w = engine.config.model.windows()     # as the (first) engine serves them: "auto" resolved
    head = (f"soldaemon bench --quality — {engine_label(info)}, "
            f"{info['threads']} threads, {platform.processor() or platform.machine()}; {len(holes)} holes "
            f"({kinds.count('line')} line, {kinds.count('block')} block) from {len(files)} files, seed {args.seed}; "
            f"max_tokens {max_tokens}; prefix/suffix/outline budget {w.prefix}/{w.suffix}/{w.outline} tokens")
    peers = "; ".join(f"{col.name}: {vsc.binary.describe()}" for col, vsc in vscodes)
    head += f"; {peers}" if peers else ""
    lines = [head, ""] + table(columns, kinds) + agreement(columns) + ratios(columns, kinds)
    print("\n".join(lines))
    if args.png:
        plot(columns, kinds, Path(args.png), head)
        print(f"wrote {args.png}")
    if args.json_out:
        write_json(Path(args.json_out), info, args.seed, max_tokens, files, holes, columns)
    return 0
