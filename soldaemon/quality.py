"""``soldaemon bench --quality``: how often the completion is right, measured
on holes cut from real code, for this daemon and for the model alone.

Holes come from :func:`soldaemon.holes.cut_holes` (one-line holes at a random
column inside function bodies and blocks of 2-6 whole lines; never inside a
docstring), seeded. Every hole goes, in the same run, to these columns:

- ``sol``: the daemon's full pipeline, ``LocalEngine.complete`` -- windows,
  context, FIM template, stop rules, post-processing -- exactly what an
  editor gets (one column per ``--fim-orders`` entry when given);
- ``raw`` (with ``--baselines`` naming ``raw`` or ``generate``, as by
  default): the same model and runtime on a *plain* FIM prompt (the last
  ``max_prefix_tokens`` tokens of the prefix, the first ``max_suffix_tokens``
  of the suffix, no line alignment, no file path, no context), greedy,
  stopped only by a stop token (EOS, FIM tokens) or ``max_tokens``: what the
  model alone gives;
- ``raw+pp``: the ``raw`` text through the daemon's post-processing
  (no model run of its own, so no latency): what post-processing alone adds;
- ``sol +outline`` / ``sol -outline`` (``--ablate outline``): the daemon
  with the outline of what the prefix window left out
  (:func:`soldaemon.fim.scope_outline`) toggled from ``model.max_outline_tokens`` (default off);
- ``sol -healing`` (``--ablate healing``): the daemon without token
  healing (``completion.token_healing: false``);
- ``sol -anchor`` (``--ablate anchor``): the daemon with the middle
  starting at the cursor (``model.fim_anchor: cursor``) instead of at the
  cursor line's start;
- ``sol+ctx`` / ``sol+ctx[order]`` (``--context siblings``): the daemon
  with the other source files of the hole's directory as context chunks
  (:func:`sibling_context`), chosen by relevance to the cursor
  (:mod:`soldaemon.relevance`, ``model.context: relevance``) and, as the
  ablation, as sent (``model.context: order``: by file name, each from its
  start, until the budget is spent);
- ``llama.cpp`` (``--baselines`` naming it, as by default): llama.cpp's raw output through ``llama-cpp-python`` on the
  model's GGUF with the same plain prompt ids (when installed and the model
  has a GGUF).

Scores (see :func:`score`): exact match, first-line exact match, edit
similarity, and whether the file with the completion inserted still parses
(Python). Latency: end to end per hole, from the request to the final text,
on a cold KV cache (no reuse from the previous hole), p50 per column.
"""

from __future__ import annotations

import argparse
import ast
import json
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from .api import CancelToken, CompletionRequest, ContextChunk, Done
from .config import Config
from .errors import BadRequest
from .holes import Hole, cut_holes, default_corpus
from .relevance import ContextSelector

DEFAULT_HOLES = 40
DEFAULT_TOKENS = 48


# ---------------------------------------------------------------------------
# Scores


def normalize(text: str) -> str:
    """``text`` with trailing whitespace removed from every line and trailing
    blank lines dropped: what the editor shows does not differ by them."""
    return "\n".join(line.rstrip() for line in text.split("\n")).rstrip("\n")


def exact_match(pred: str, expected: str) -> bool:
    """The completion is the removed text (after :func:`normalize`)."""
    return normalize(pred) == normalize(expected)


def first_line_match(pred: str, expected: str) -> bool:
    """The completion's first line is the removed text's first line (after
    :func:`normalize`): what accepting one line would give."""
    return normalize(pred).split("\n", 1)[0] == normalize(expected).split("\n", 1)[0]


def levenshtein(a: str, b: str) -> int:
    """Edit distance (insertions, deletions, substitutions of characters)."""
    if len(a) < len(b):
        a, b = b, a
    prev = list(range(len(b) + 1))
    for i, ca in enumerate(a, 1):
        cur = [i]
        for j, cb in enumerate(b, 1):
            cur.append(min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (ca != cb)))
        prev = cur
    return prev[-1]


def edit_similarity(pred: str, expected: str) -> float:
    """1 - levenshtein / max(len) on the normalized texts, in [0, 1]; 1.0
    when both are empty."""
    a, b = normalize(pred), normalize(expected)
    if not a and not b:
        return 1.0
    return 1.0 - levenshtein(a, b) / max(len(a), len(b))


def parses(prefix: str, completion: str, suffix: str) -> bool:
    """Whether ``prefix + completion + suffix`` is valid Python."""
    try:
        ast.parse(prefix + completion + suffix)
    except (SyntaxError, ValueError):
        return False
    return True


@dataclass(frozen=True)
class Score:
    exact: bool
    first_line: bool
    edit_sim: float
    parses: bool | None     # None: not Python


def score(hole: Hole, pred: str, *, python: bool = True) -> Score:
    return Score(exact_match(pred, hole.expected), first_line_match(pred, hole.expected),
                 edit_similarity(pred, hole.expected), parses(hole.prefix, pred, hole.suffix) if python else None)


# ---------------------------------------------------------------------------
# Columns


@dataclass
class Column:
    """One way of completing, scored over all holes."""

    name: str
    texts: list[str] = field(default_factory=list)
    scores: list[Score] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    generated_tokens: list[int] = field(default_factory=list)
    ttft_ms: list[float] = field(default_factory=list)      # request → first token (nan: no model run)

    def add(self, hole: Hole, text: str, ms: float, prompt_tokens: int, generated: int,
            ttft: float = float("nan"), *, python: bool) -> None:
        self.texts.append(text)
        self.scores.append(score(hole, text, python=python))
        self.e2e_ms.append(ms)
        self.prompt_tokens.append(prompt_tokens)
        self.generated_tokens.append(generated)
        self.ttft_ms.append(ttft)

    def summary(self, kinds: list[str], only: str | None = None) -> dict[str, float]:
        """Rates in percent (edit similarity too) over the holes of kind
        ``only`` (all holes when None); e2e p50 in ms."""
        idx = [i for i, k in enumerate(kinds) if only is None or k == only]
        if not idx:
            return {}
        sc = [self.scores[i] for i in idx]
        parsed = [s.parses for s in sc if s.parses is not None]
        return {
            "n": len(idx),
            "exact": 100.0 * sum(s.exact for s in sc) / len(sc),
            "first_line": 100.0 * sum(s.first_line for s in sc) / len(sc),
            "edit_sim": 100.0 * statistics.mean(s.edit_sim for s in sc),
            "parses": 100.0 * sum(parsed) / len(parsed) if parsed else float("nan"),
            "e2e_p50_ms": statistics.median(self.e2e_ms[i] for i in idx),  # nan for raw+pp
            "ttft_p50_ms": statistics.median(self.ttft_ms[i] for i in idx),
            "prompt_tokens_p50": statistics.median(self.prompt_tokens[i] for i in idx),
            "generated_p50": statistics.median(self.generated_tokens[i] for i in idx),
        }


def plain_prompt(engine: Any, hole: Hole) -> list[int]:
    """The plain FIM prompt of the ``raw`` and ``llama.cpp`` columns: the
    last ``max_prefix_tokens`` tokens of the prefix and the first
    ``max_suffix_tokens`` of the suffix, in the family's PSM layout (cut
    anywhere, even mid-line; no path, no context)."""
    from .fim import build_prompt, encode_text

    mc = engine.config.model
    tok = engine.tokenizer
    # a generous character cut first, so a huge file is not tokenized whole
    pre = encode_text(tok, hole.prefix[-12 * mc.max_prefix_tokens:])[-mc.max_prefix_tokens:]
    suf = encode_text(tok, hole.suffix[: 12 * mc.max_suffix_tokens])[: mc.max_suffix_tokens]
    return build_prompt(engine.template, pre, suf)


def sibling_context(hole: Hole, max_files: int = 32, max_chars: int = 200_000) -> tuple[ContextChunk, ...]:
    """The other source files of ``hole``'s directory (same extension, by
    name, at most ``max_files``, each cut at ``max_chars``), as the context
    chunks an editor with those files open would send."""
    path = Path(hole.file or hole.path)
    files = sorted(p for p in path.parent.glob(f"*{path.suffix}") if p.name != path.name and p.is_file())
    return tuple(ContextChunk(f"file://{p}", p.read_text(encoding="utf-8", errors="replace")[:max_chars])
                 for p in files[:max_files])


def run_sol(engine: Any, hole: Hole, uri: str, max_tokens: int,
            context: tuple[ContextChunk, ...] = ()) -> tuple[str, float, int, int, float]:
    """The daemon's full pipeline on a cold cache. Returns (text, e2e ms,
    prompt tokens, generated tokens, TTFT ms)."""
    engine.pool.acquire(uri).truncate(0)
    req = CompletionRequest(id="q", uri=uri, prefix=hole.prefix, suffix=hole.suffix, language="python",
                            max_tokens=max_tokens, received_ns=time.perf_counter_ns(), context=context)
    done = [ev for ev in engine.complete(req, CancelToken()) if isinstance(ev, Done)][0]
    engine.pool.acquire(uri).truncate(0)  # no type-through or reuse into the next column/hole
    engine._shown.pop(uri, None)
    t = done.timings
    return done.items[0] if done.items else "", t.total_ms, t.prompt_tokens, t.generated_tokens, t.ttft_ms


def run_raw(engine: Any, hole: Hole, max_tokens: int) -> tuple[str, float, int, int, float]:
    """The model alone: plain prompt, greedy, this runtime, stop tokens only."""
    from .runtime.generate import generate
    from .runtime.sampling import Greedy

    t0 = time.perf_counter_ns()
    ids = plain_prompt(engine, hole)
    session = engine.pool.acquire("quality:raw")
    session.truncate(0)
    toks: list[int] = []
    first = 0
    for ev in generate(session, ids, sampler=Greedy(), stop_ids=engine.template.stop_ids, max_tokens=max_tokens):
        toks.extend(ev.tokens)
        first = first or time.perf_counter_ns()
    text = engine.tokenizer.decode(toks, skip_special_tokens=True)
    end = time.perf_counter_ns()
    session.truncate(0)
    return text, (end - t0) / 1e6, len(ids), len(toks), ((first or end) - t0) / 1e6


def postprocessed(engine: Any, hole: Hole, text: str) -> str:
    """``text`` through the daemon's post-processing, as ``complete`` would
    cut it (the stop rules end generation exactly where post-processing
    would cut, so this is what the daemon's pipeline gives on that prompt)."""
    from .postprocess import decide_multiline, postprocess

    multiline = decide_multiline(hole.prefix, hole.suffix, "auto")
    max_lines = engine.config.completion.max_lines if multiline else 1
    return postprocess(text, prefix=hole.prefix, suffix=hole.suffix, multiline=multiline, max_lines=max_lines)


# What ``--ablate`` can leave out; all but ``outline`` are config overrides.
CONFIG_ABLATIONS: dict[str, dict[str, Any]] = {
    "healing": {"completion.token_healing": False},
    "anchor": {"model.fim_anchor": "cursor"},
}
ABLATIONS = ("outline", *CONFIG_ABLATIONS)
OUTLINE_TOKENS = 128  # the outline budget ``--ablate outline`` tries when model.max_outline_tokens is off


def toggled_outline(config: Config) -> Config:
    """``config`` with the outline of what the prefix window left out
    toggled (``--ablate outline``): off when ``model.max_outline_tokens`` is
    on, :data:`OUTLINE_TOKENS` when off."""
    tokens = 0 if config.model.max_outline_tokens > 0 else OUTLINE_TOKENS
    return config.with_overrides({"model.max_outline_tokens": tokens}, source="bench")


class LlamaCpp:
    """llama.cpp through llama-cpp-python on the model's GGUF (what
    ``bench --trace`` compares with), greedy, stop tokens only."""

    def __init__(self, engine: Any, threads: int) -> None:
        from llama_cpp import Llama

        self.engine = engine
        self.llm = Llama(model_path=str(engine.loaded.gguf_path), n_ctx=engine.backend.n_ctx,
                         n_threads=threads, verbose=False)

    def __call__(self, hole: Hole, max_tokens: int) -> tuple[str, float, int, int, float]:
        t0 = time.perf_counter_ns()
        ids = plain_prompt(self.engine, hole)
        self.llm.reset()  # cold, like the other columns
        toks: list[int] = []
        first = 0
        for t in self.llm.generate(ids, temp=0.0, top_k=1):
            first = first or time.perf_counter_ns()      # the first token sampled (even a stop token)
            if t in self.engine.template.stop_ids or len(toks) >= max_tokens:
                break
            toks.append(int(t))
        end = time.perf_counter_ns()
        text = self.engine.tokenizer.decode(toks, skip_special_tokens=True)
        return text, (end - t0) / 1e6, len(ids), len(toks), ((first or end) - t0) / 1e6


def llama_cpp_column(engine: Any, threads: int, say: Callable[[str], None]) -> LlamaCpp | None:
    if engine.loaded.gguf_path is None:
        say("llama.cpp: the model has no GGUF; column skipped")
        return None
    try:
        return LlamaCpp(engine, threads)
    except ImportError:
        say("llama.cpp: llama-cpp-python is not installed; column skipped")
        return None


# ---------------------------------------------------------------------------
# Report


_METRICS = (("exact", "exact match"), ("first_line", "first-line EM"), ("edit_sim", "edit sim"),
            ("parses", "parses"))


def table(columns: list[Column], kinds: list[str]) -> list[str]:
    """A markdown table: one row per column, overall scores, EM per hole
    kind, latency."""
    present = [k for k in ("line", "block") if k in kinds]
    head = ["column", "exact match %", "first-line EM %", "edit sim %", "parses %"]
    head += [f"EM {k} ({kinds.count(k)}) %" for k in present]
    head += ["e2e p50 ms", "TTFT p50 ms", "prompt tok p50", "gen tok p50"]
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for c in columns:
        s = c.summary(kinds)
        cells = [c.name] + [f"{s[m]:.1f}" for m, _ in _METRICS]
        cells += [f"{c.summary(kinds, k)['exact']:.1f}" for k in present]
        cells += [f"{s['e2e_p50_ms']:.0f}", f"{s['ttft_p50_ms']:.0f}", f"{s['prompt_tokens_p50']:.0f}",
                  f"{s['generated_p50']:.0f}"]
        out.append("| " + " | ".join(cells) + " |")
    return out


def plot(columns: list[Column], kinds: list[str], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import textwrap

    import matplotlib.pyplot as plt

    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.5), gridspec_kw={"width_ratios": [3, 1]})
    width = 0.8 / max(1, len(columns))
    for j, c in enumerate(columns):
        s = c.summary(kinds)
        xs = [i + j * width for i in range(len(_METRICS))]
        bars = ax.bar(xs, [s[m] for m, _ in _METRICS], width, label=c.name)
        ax.bar_label(bars, fmt="%.0f", fontsize=7)
        ax2.bar([j], [s["e2e_p50_ms"]], 0.6, label=c.name, color=bars.patches[0].get_facecolor())
    ax.set_xticks([i + width * (len(columns) - 1) / 2 for i in range(len(_METRICS))], [m for _, m in _METRICS])
    ax.set_ylabel("% of holes (edit sim: mean %)")
    ax.set_ylim(0, 105)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    ax2.set_xticks(range(len(columns)), [c.name for c in columns], rotation=20, fontsize=8)
    ax2.set_ylabel("end-to-end p50 (ms)")
    ax2.grid(axis="y", alpha=0.3)
    fig.suptitle(textwrap.fill(title, 130), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


# ---------------------------------------------------------------------------
# The command


def _write_json(path: Path, info: dict[str, Any], seed: int, max_tokens: int, files: list[Path],
                holes: list[Hole], columns: list[Column]) -> None:
    kinds = [h.kind for h in holes]
    path.write_text(json.dumps({
        "info": info, "seed": seed, "max_tokens": max_tokens, "files": [f.name for f in files],
        "summary": {c.name: {"all": c.summary(kinds), **{k: c.summary(kinds, k) for k in ("line", "block")}}
                    for c in columns},
        "holes": [{"path": h.path, "line": h.line, "kind": h.kind, "expected": h.expected,
                   "out": {c.name: {"text": c.texts[i], **asdict(c.scores[i]), "e2e_ms": c.e2e_ms[i],
                                    "ttft_ms": c.ttft_ms[i], "prompt_tokens": c.prompt_tokens[i]}
                           for c in columns}}
                  for i, h in enumerate(holes)],
    }, indent=1))


def _precision_engines(engine: Any, config: Config, precisions: list[str],
                       say: Callable[[str], None]) -> list[tuple[str, Any]]:
    """One engine per ``--precisions`` entry, each with the plan that
    ``model.precision`` would give it on this machine (from the main
    engine's timing table), all over one more loaded copy of the module
    (not released: they share it)."""
    if not precisions:
        return []
    from .model.loader import load_model
    from .runtime.engine import LocalEngine
    from .runtime.kernel_plan import PRECISIONS, choose_plan

    table = getattr(engine, "kernel_timings", None)
    if table is None:
        raise BadRequest("--precisions needs the lean backend and its kernel plan (this model runs the "
                         "transformers fallback)")
    for p in precisions:
        if p not in PRECISIONS:
            raise BadRequest(f"--precisions: {p!r} is not a precision (expected: {', '.join(PRECISIONS)})")
    loaded = load_model(str(engine.loaded.directory), device=config.device.device, dtype="stored", progress=False)
    out = []
    for p in precisions:
        plan = choose_plan(table, p)
        say(f"sol[{p}]: {plan.describe()}")
        eng = LocalEngine(loaded, config, plan=plan, timings=table, release=False)
        eng.warmup()
        out.append((p, eng))
    return out


def agreement(columns: list[Column]) -> list[str]:
    """Lines: how many completions of each ``sol[...]`` column are identical
    to ``sol[float32]``'s (when both ran)."""
    ref = next((c for c in columns if c.name == "sol[float32]"), None)
    if ref is None:
        return []
    out = [""]
    for c in columns:
        if c is not ref and c.name.startswith("sol"):
            same = sum(a == b for a, b in zip(c.texts, ref.texts))
            out.append(f"{c.name}: {same}/{len(ref.texts)} completions identical to sol[float32]")
    return out


def _sol_configs(config: Config, orders: list[str] | None) -> list[tuple[str, Config]]:
    if not orders:
        return [("sol", config)]
    out = []
    for order in orders:
        if order not in ("psm", "spm"):
            raise BadRequest(f"--fim-orders: {order!r} is not a FIM order (expected psm or spm)")
        out.append((f"sol[{order}]", config.with_overrides({"model.fim_order": order}, source="bench")))
    return out


def run(args: argparse.Namespace, config: Config) -> int:
    from .runtime.engine import load_engine

    n_holes = DEFAULT_HOLES if args.holes is None else args.holes
    max_tokens = DEFAULT_TOKENS if args.tokens is None else args.tokens
    if n_holes < 1 or max_tokens < 1:
        raise BadRequest(f"--holes and --tokens must be >= 1 (got {n_holes}, {max_tokens})")
    overrides: dict[str, Any] = {}
    if args.max_prefix_tokens is not None:
        overrides["model.max_prefix_tokens"] = args.max_prefix_tokens
    if args.max_suffix_tokens is not None:
        overrides["model.max_suffix_tokens"] = args.max_suffix_tokens
    if overrides:
        config = config.with_overrides(overrides, source="bench")
    files = [Path(p) for p in args.corpus] if args.corpus else default_corpus()
    for f in files:
        if not f.is_file():
            raise BadRequest(f"--corpus: {f} is not a file")
    holes = cut_holes(files, n_holes, args.seed)
    if not holes:
        raise BadRequest("--corpus: no holes could be cut (no parsable Python with function bodies)")
    sol_configs = [] if getattr(args, "baselines_only", False) else _sol_configs(config, getattr(args, "fim_orders", None))
    ablate = list(getattr(args, "ablate", None) or [])
    for a in ablate:
        if a not in ABLATIONS:
            raise BadRequest(f"--ablate: unknown part {a!r} (expected: {', '.join(ABLATIONS)})")
    say = lambda msg: print("  " + msg, file=sys.stderr, flush=True)  # noqa: E731
    engine = load_engine(config)
    precision_engines = _precision_engines(engine, config, getattr(args, "precisions", None) or [], say)
    baselines = args.baselines or []
    want_raw = "raw" in baselines or "generate" in baselines  # generate: the model alone, as in the speed bench
    llama = llama_cpp_column(engine, engine.info()["threads"], say) if "llama.cpp" in baselines else None
    raw = Column("raw") if want_raw else None
    raw_pp = Column("raw+pp") if want_raw else None
    outline_config = toggled_outline(sol_configs[0][1]) if "outline" in ablate and sol_configs else None
    sign = "-" if sol_configs and sol_configs[0][1].model.max_outline_tokens > 0 else "+"
    no_outline = Column(f"{sol_configs[0][0]} {sign}outline") if outline_config is not None else None
    # the config ablations: (column, the first sol config with the part off)
    without = [(Column(f"{sol_configs[0][0]} -{a}"),
                sol_configs[0][1].with_overrides(CONFIG_ABLATIONS[a], source="bench"))
               for a in ABLATIONS if a in ablate and a in CONFIG_ABLATIONS and sol_configs]
    siblings = getattr(args, "context", "none") == "siblings" and bool(sol_configs)
    ctx_rel = Column(f"{sol_configs[0][0]}+ctx") if siblings else None
    ctx_order = Column(f"{sol_configs[0][0]}+ctx[order]") if siblings else None
    by_precision = [(Column(f"sol[{p}]"), eng) for p, eng in precision_engines]
    columns = ([Column(name) for name, _ in sol_configs] + [col for col, _ in by_precision]
               + ([no_outline] if no_outline else [])
               + [col for col, _ in without]
               + ([ctx_rel, ctx_order] if ctx_rel and ctx_order else [])
               + ([raw, raw_pp] if raw and raw_pp else []) + ([Column("llama.cpp")] if llama else []))
    kinds = [h.kind for h in holes]
    t_start = time.time()
    for i, hole in enumerate(holes):
        uri = f"file:///{hole.path}"
        for (name, cfg), col in zip(sol_configs, columns):
            engine.config = cfg
            col.add(hole, *run_sol(engine, hole, uri, max_tokens), python=True)
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
            selector = engine.context_selector
            engine.context_selector = ContextSelector(max_chars=4 * sol_configs[0][1].model.max_context_tokens)
            ctx_rel.add(hole, *run_sol(engine, hole, uri, max_tokens, chunks), python=True)
            engine.context_selector = None          # model.context: order -- the chunks as sent
            ctx_order.add(hole, *run_sol(engine, hole, uri, max_tokens, chunks), python=True)
            engine.context_selector = selector
        engine.config = config
        if raw is not None and raw_pp is not None:
            text, ms, n_prompt, n_gen, ttft = run_raw(engine, hole, max_tokens)
            raw.add(hole, text, ms, n_prompt, n_gen, ttft, python=True)
            # no latency of its own: computed from the raw text after the run
            raw_pp.add(hole, postprocessed(engine, hole, text), float("nan"), n_prompt, n_gen, python=True)
        if llama is not None:
            columns[-1].add(hole, *llama(hole, max_tokens), python=True)
        if args.json_out:  # after every hole: a long run that is stopped still leaves its results
            _write_json(Path(args.json_out), engine.info(), args.seed, max_tokens, files, holes[: i + 1], columns)
        say(f"hole {i + 1}/{len(holes)} {hole.kind} {hole.path}:{hole.line} "
            + " ".join(f"{c.name}={'✓' if c.scores[-1].exact else '·'}" for c in columns)
            + f"  ({time.time() - t_start:.0f} s)")
    info = engine.info()
    mc = config.model
    head = (f"soldaemon bench --quality — {info['model']} ({info['dtype']}, {info['backend']}) on {info['device']}, "
            f"{info['threads']} threads, {platform.processor() or platform.machine()}; {len(holes)} holes "
            f"({kinds.count('line')} line, {kinds.count('block')} block) from {len(files)} files, seed {args.seed}; "
            f"max_tokens {max_tokens}; prefix/suffix budget {mc.max_prefix_tokens}/{mc.max_suffix_tokens} tokens")
    lines = [head, ""] + table(columns, kinds) + agreement(columns)
    print("\n".join(lines))
    if args.png:
        plot(columns, kinds, Path(args.png), head)
        print(f"wrote {args.png}")
    if args.json_out:
        _write_json(Path(args.json_out), info, args.seed, max_tokens, files, holes, columns)
    return 0
