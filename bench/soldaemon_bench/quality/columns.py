"""The ways of completing a hole that ``bench --quality`` compares: the
daemon's pipeline, the model alone (this runtime, and llama-cpp-python),
llama.vscode (llama.cpp's ``llama-server`` behind llama.vscode's client),
and the ablations."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from soldaemon.api import CancelToken, CompletionRequest, ContextChunk, Done, document_window
from soldaemon.config import Config
from soldaemon.errors import BadRequest
from soldaemon_bench.holes import Hole


def plain_prompt(engine: Any, hole: Hole) -> list[int]:
    """The plain FIM prompt of the ``raw`` and ``llama.cpp`` columns: the
    last ``max_prefix_tokens`` tokens of the prefix and the first
    ``max_suffix_tokens`` of the suffix, in the family's PSM layout (cut
    anywhere, even mid-line; no path, no context)."""
    from soldaemon.fim import build_prompt, encode_text

    w = engine.config.model.windows()
    tok = engine.tokenizer
    # a generous character cut first, so a huge file is not tokenized whole
    pre = encode_text(tok, hole.prefix[-12 * w.prefix:])[-w.prefix:]
    suf = encode_text(tok, hole.suffix[: 12 * w.suffix])[: w.suffix]
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
            context: tuple[ContextChunk, ...] = ()) -> tuple[str, float, int, int, float, str]:
    """The daemon's full pipeline on a cold cache, sent what sol-lsp sends
    of the document (:func:`document_window`). Returns (text, e2e ms,
    prompt tokens, generated tokens, TTFT ms, why the answer ended)."""
    engine.pool.acquire(uri).truncate(0)
    text = hole.prefix + hole.suffix
    start, end = document_window(text, len(hole.prefix))
    req = CompletionRequest(id="q", uri=uri, prefix=text[start:len(hole.prefix)], suffix=text[len(hole.prefix):end],
                            language=hole.language,
                            max_tokens=max_tokens, received_ns=time.perf_counter_ns(), context=context)
    done = [ev for ev in engine.complete(req, CancelToken()) if isinstance(ev, Done)][0]
    engine.pool.acquire(uri).truncate(0)  # no type-through or reuse into the next column/hole
    engine.forget_shown(uri)
    t = done.timings
    return (done.items[0] if done.items else "", t.total_ms, t.prompt_tokens, t.generated_tokens, t.ttft_ms,
            done.ends[0] if done.ends else "")


def run_raw(engine: Any, hole: Hole, max_tokens: int) -> tuple[str, float, int, int, float]:
    """The model alone: plain prompt, greedy, this runtime, stop tokens only."""
    from soldaemon.runtime.decode.generate import generate
    from soldaemon.runtime.decode.sampling import Greedy

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
    from soldaemon.pipeline.ending import ending_for

    cc = engine.config.completion
    ending = ending_for(hole.prefix, hole.suffix, hole.language, "auto", cc.max_lines, cc.block_end)
    ending.may_stop(text)
    return ending.shown(text, "stop", ending.rule).text


# What ``--ablate`` can leave out; all but ``outline`` are config overrides.
CONFIG_ABLATIONS: dict[str, dict[str, Any]] = {
    "healing": {"completion.token_healing": False},
    "anchor": {"model.fim_anchor": "cursor"},
    "speculation": {"completion.speculative": False},   # decode tok/s with and without, same answers
    "second_choice": {"completion.second_choice": False},
    "candidates": {"completion.candidates": 1},          # toggled: see ablation
}


# What ``--ablate`` changes at load time: a second engine, loaded with the part toggled.
LOAD_ABLATIONS: dict[str, dict[str, Any]] = {
    "blocked_copy": {"model.blocked_copy": False},       # one layout (the plain one) for every forward
}


def ablation(part: str, config: Config) -> tuple[str, Config]:
    """The column's sign ("-" a part taken out, "+" one put in) and
    ``config`` with ``part`` (a key of :data:`CONFIG_ABLATIONS` or
    :data:`LOAD_ABLATIONS`) ablated. ``candidates`` is toggled from what
    the served model ranks: ``-candidates`` (the greedy answer alone) where
    it ranks several (the 1.5B by default), ``+candidates`` (4) where not;
    ``blocked_copy`` from ``model.blocked_copy``."""
    overrides, sign = {**CONFIG_ABLATIONS, **LOAD_ABLATIONS}[part], "-"
    if part == "candidates" and config.completion.candidate_count() <= 1:
        overrides, sign = {"completion.candidates": 4}, "+"
    if part == "blocked_copy" and not config.model.blocked_copy:
        overrides, sign = {"model.blocked_copy": True}, "+"
    return sign, config.with_overrides(overrides, source="bench")


ABLATIONS = ("outline", *CONFIG_ABLATIONS, *LOAD_ABLATIONS)


OUTLINE_TOKENS = 128  # the outline budget ``--ablate outline`` tries when model.max_outline_tokens is off


def toggled_outline(config: Config) -> Config:
    """``config`` with the outline of what the prefix window left out
    toggled (``--ablate outline``): off when ``model.max_outline_tokens`` is
    on, :data:`OUTLINE_TOKENS` when off."""
    tokens = 0 if config.model.windows().outline > 0 else OUTLINE_TOKENS
    return config.with_overrides({"model.max_outline_tokens": tokens}, source="bench")


MODEL_ALONE = "model alone (llama-cpp-python)"   # the LlamaCpp column's name
LLAMA_VSCODE = "llama.vscode"


class LlamaCpp:
    """The model alone through llama-cpp-python on the model's GGUF: the
    plain prompt ids, greedy, stopped only by a stop token or ``max_tokens``
    (no editor's stop rule: nobody runs llama.cpp this way in an editor; the
    peer as users run it is :class:`LlamaVscode`). Shown as
    :data:`MODEL_ALONE`."""

    def __init__(self, engine: Any, threads: int) -> None:
        from llama_cpp import Llama

        self.engine = engine
        self.threads = threads
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
        say(f"{MODEL_ALONE}: the model has no GGUF; column skipped")
        return None
    try:
        return LlamaCpp(engine, threads)
    except ImportError:
        say(f"{MODEL_ALONE}: llama-cpp-python is not installed; column skipped")
        return None


class LlamaVscode:
    """llama.vscode as its users run it: llama.cpp's own ``llama-server``
    (built for this CPU, :mod:`.llama_server_build`) with llama.vscode's
    documented flags on the model's GGUF, sent llama.vscode's ``/infill``
    request for the hole's cursor and its answer post-processed as the
    client does (:mod:`.llama_vscode`), at llama.vscode's default settings
    (``n_predict`` 128, ``t_max_predict_ms`` 500: its own budget, not
    ``--tokens``). Cold, like the daemon's column: every slot erased and no
    prompt cache in RAM, no completion cache, no speculative FIM (those
    serve typing, measured by ``bench --trace``); ``input_extra`` empty (the
    ring holds nothing for a file just opened: docs/bench.md). The
    latency is the whole request (``stream: false``: nothing shows before)."""

    def __init__(self, engine: Any, threads: int, say: Callable[[str], None]) -> None:
        from soldaemon_bench.quality.llama_server import LlamaServer
        from soldaemon_bench.quality.llama_server_build import build_server
        from soldaemon_bench.quality.llama_vscode import LlamaVscodeClient

        self.binary = build_server(log=say)
        gguf = Path(engine.loaded.gguf_path)
        self.server = LlamaServer(self.binary, gguf, threads, small_model="0.5b" in gguf.name.lower(), cold=True)
        self.server.start()
        self.client = LlamaVscodeClient(self.server.infill, use_cache=False, speculative=False)
        say(f"{LLAMA_VSCODE}: {self.binary.describe()}: llama-server {' '.join(self.server.args()[2:])}")

    def __call__(self, hole: Hole, max_tokens: int) -> tuple[str, float, int, int, float]:
        self.server.erase_slots()
        answer = self.client.complete(hole.prefix, hole.suffix, automatic=False)
        r = answer.response
        return (answer.text, answer.wait_ms, int(r.get("tokens_evaluated", 0)),
                int(r.get("tokens_predicted", 0)), answer.wait_ms)

    def close(self) -> None:
        self.server.stop()


def llama_vscode_column(engine: Any, threads: int, say: Callable[[str], None]) -> LlamaVscode | None:
    """The llama.vscode column, or None (said why) when the model has no
    GGUF or the server cannot be built or started."""
    from soldaemon_bench.quality.llama_server import ServerError
    from soldaemon_bench.quality.llama_server_build import BuildError

    if engine.loaded.gguf_path is None:
        say(f"{LLAMA_VSCODE}: the model has no GGUF; column skipped")
        return None
    try:
        return LlamaVscode(engine, threads, say)
    except (BuildError, ServerError) as exc:
        say(f"{LLAMA_VSCODE}: column skipped: {exc}")
        return None


def make_precision_engines(engine: Any, config: Config, precisions: list[str],
                       say: Callable[[str], None]) -> list[tuple[str, Any]]:
    """(column, engine) per ``--precisions`` entry, each with the plan that
    ``model.precision`` would give it on this machine (from the main
    engine's timing table), all over one more loaded copy of the module
    (not released: they share it)."""
    if not precisions:
        return []
    from soldaemon.weights.loader import load_model
    from soldaemon.runtime.engine.local import LocalEngine
    from soldaemon.policy.kernel_plan import PRECISIONS, choose_plan

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
        eng = LocalEngine(loaded, config, plan=plan, timings=table, release=False,
                          served=getattr(engine, "served_model", None))
        eng.warmup()
        out.append((f"sol[{p}]", eng))
    return out


def sol_variants(config: Config, orders: list[str] | None) -> list[tuple[str, Config]]:
    if not orders:
        return [("sol", config)]
    out = []
    for order in orders:
        if order not in ("psm", "spm"):
            raise BadRequest(f"--fim-orders: {order!r} is not a FIM order (expected psm or spm)")
        out.append((f"sol[{order}]", config.with_overrides({"model.fim_order": order}, source="bench")))
    return out


def model_label(spec: str) -> str:
    """``qwen2.5-coder-1.5b+qwen2.5-coder-0.5b`` → ``1.5b+0.5b``."""
    return "+".join(part.removeprefix("qwen2.5-coder-") for part in spec.split("+"))


def model_configs(config: Config, specs: list[str]) -> list[tuple[str, str, Config]]:
    """(column label, target model, config) per ``--models`` entry: an
    embedded model's name, or ``target+draft`` for the target with that
    draft model (every other entry without a draft, so a column measures
    one thing). Raises BadRequest for a name that is no embedded model."""
    from soldaemon.weights.embedded import EMBEDDED_MODELS

    out = []
    for spec in specs:
        parts = spec.split("+")
        if len(parts) > 2 or any(p not in EMBEDDED_MODELS for p in parts):
            raise BadRequest(f"--models: {spec!r} is not an embedded model or a target+draft pair "
                             f"(names: {', '.join(EMBEDDED_MODELS)})")
        draft = parts[1] if len(parts) == 2 else "off"
        cfg = config.with_overrides({"model.path": None, "model.name": parts[0], "model.draft": draft},
                                    source="bench")
        out.append((f"sol[{model_label(spec)}]", parts[0], cfg))
    return out
