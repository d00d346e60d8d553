"""``soldaemon bench --trace``: replay a user typing real code, one request
per keystroke (an editor without debounce), against this engine and the
baselines in the same run.

A trace takes single-line statements inside function bodies of real source
files; for each, the line is removed and then "typed" one character at a time
from its first non-blank character. Every keystroke is a completion request
with prefix = everything before the cursor, suffix = the file after the line.
Reported per backend: TTFT and end-to-end p50/p95, prompt tokens computed vs
cached, speculation acceptance, and how often the completion equals the rest
of the line the user then typed.

Two typists:

- default: each keystroke waits for its completion to finish (the user reads
  the ghost text, then types on) — what type-through serves;
- ``--interrupt``: the user types the next character as soon as ghost text
  appears, so every request is superseded after its first visible text, as a
  fast typist does to an editor without debounce — what generation reuse
  (resuming the superseded generation) serves. TTFT is then arrival → first
  visible text.

``--compare-spec`` adds a second run of this engine with speculation off, for
decode tokens per second with and without speculation on the same keystrokes.

``--jumps``: after each line, the cursor jumps to another function of the
file and types a few characters there, once at once and once after a pause
in which the new spot is warmed (:mod:`soldaemon_bench.jumps`); the first
keystroke of each jump is also reported on its own (rows ``NAME:jump`` and
``NAME:jump+pause``).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

from soldaemon.api import CancelToken, CompletionRequest, Done, Timings
from soldaemon.config import Config
from soldaemon.errors import BadRequest
from soldaemon_bench.header import engine_label, with_windows
from soldaemon_bench.holes import default_corpus, statement_lines
from soldaemon_bench.jumps import JUMP_KEYS, JUMP_KINDS, JUMP_PAUSE, jump_targets


# llama-cpp-python baselines: (--baselines key, row name, FIM order, where the middle starts)
MODEL_ALONE = "model alone (llama-cpp-python)"
LLAMA_CPP_LAYOUTS = (("llama.cpp", MODEL_ALONE, "psm", "cursor"),
                     ("llama.cpp-line", f"{MODEL_ALONE}, line", "psm", "line"),
                     ("llama.cpp-spm", f"{MODEL_ALONE}, spm", "spm", "cursor"))
LLAMA_VSCODE = "llama.vscode"


@dataclass(frozen=True)
class Keystroke:
    file: str
    line: int
    prefix: str
    suffix: str
    rest: str             # what the user goes on to type on this line
    jump: str = ""        # the first keystroke at a jump's place: jumps.JUMP or jumps.JUMP_PAUSE


def make_trace(files: list[Path], lines: int, seed: int = 0, *, min_len: int = 12, max_len: int = 60,
               jumps: bool = False) -> list[Keystroke]:
    """Keystrokes that type ``lines`` real lines, one after another;
    ``jumps``: after each line, :data:`JUMP_KEYS` keystrokes at each of two
    lines in other functions of its file (see :mod:`soldaemon_bench.jumps`). The
    lines typed are the same with or without jumps."""
    rng = random.Random(seed)
    picks = [(path, text, ln) for path, text, ln in statement_lines(files)
             if min_len <= len(text.splitlines()[ln - 1].strip()) <= max_len]
    rng.shuffle(picks)
    jump_rng = random.Random(seed + 1)
    out: list[Keystroke] = []
    for path, text, ln in picks[:lines]:
        out.extend(_type_line(path, text, ln))
        if jumps:
            same_file = sorted(c for p, _, c in picks if p == path)
            for kind, target in zip(JUMP_KINDS, jump_targets(text, ln, same_file, jump_rng)):
                out.extend(_type_line(path, text, target, keys=JUMP_KEYS, jump=kind))
    return out


def _type_line(path: Path, text: str, ln: int, *, keys: int | None = None, jump: str = "") -> list[Keystroke]:
    """The keystrokes typing line ``ln`` from its first non-blank character
    (the first ``keys`` of them), the line's rest removed from the file."""
    all_lines = text.splitlines(keepends=True)
    line = all_lines[ln - 1].rstrip("\n")
    indent = len(line) - len(line.lstrip())
    before = "".join(all_lines[: ln - 1])
    after = "".join(all_lines[ln:])
    end = len(line) if keys is None else min(len(line), indent + keys)
    return [Keystroke(path.name, ln, before + line[:k], "\n" + after, line[k:], jump if k == indent else "")
            for k in range(indent, end)]


@dataclass
class Series:
    ttft_ms: list[float] = field(default_factory=list)
    e2e_ms: list[float] = field(default_factory=list)
    prompt_tokens: list[int] = field(default_factory=list)
    computed_tokens: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    drafted: int = 0
    accepted: int = 0
    matches: int = 0          # completion == the rest of the line typed later
    nonempty: int = 0
    type_through: int = 0
    resumed: int = 0          # answered by resuming a superseded generation
    decode_ms: float = 0.0    # summed over keystrokes: first → last token
    decoded: int = 0          # tokens after the first, summed
    parts: dict[str, Series] = field(default_factory=dict)   # jump kind → its first keystrokes

    @property
    def decode_tok_s(self) -> float:
        return self.decoded / (self.decode_ms / 1000) if self.decode_ms > 0 else float("nan")

    def add(self, t: Timings, item: str, rest: str, part: str = "") -> None:
        """Record one keystroke's answer (``rest``: what the user then typed);
        ``part``: also in ``parts[part]`` (a jump's first keystroke)."""
        if part:
            self.parts.setdefault(part, Series()).add(t, item, rest)
        self.ttft_ms.append(t.ttft_ms)
        self.e2e_ms.append(t.total_ms)
        self.prompt_tokens.append(t.prompt_tokens)
        self.computed_tokens.append(t.prompt_tokens - t.cached_tokens)
        self.generated.append(t.generated_tokens)
        self.drafted += t.draft_tokens
        self.accepted += t.accepted_tokens
        self.type_through += t.source == "type-through"
        self.resumed += t.source == "resumed"
        if t.source == "model" and t.generated_tokens > 1 and t.decode_ms > 0:
            self.decode_ms += t.decode_ms
            self.decoded += t.generated_tokens - 1
        self.nonempty += bool(item.strip())
        self.matches += _is_match(item, rest)

    def add_baseline(self, ttft_ms: float, e2e_ms: float, prompt_tokens: int, generated: int, item: str,
                     rest: str, *, decode_ms: float = 0.0, part: str = "", computed: int | None = None,
                     cached: bool = False) -> None:
        """Record a baseline's keystroke; ``computed``: the prompt tokens it
        computed (default all: a baseline that reports no reuse);
        ``decode_ms``: first → last token; ``cached``: answered from the
        client's cache of shown suggestions (counted as type-through)."""
        if part:
            self.parts.setdefault(part, Series()).add_baseline(ttft_ms, e2e_ms, prompt_tokens, generated, item,
                                                               rest, decode_ms=decode_ms, computed=computed,
                                                               cached=cached)
        self.ttft_ms.append(ttft_ms)
        self.e2e_ms.append(e2e_ms)
        self.prompt_tokens.append(prompt_tokens)
        self.computed_tokens.append(prompt_tokens if computed is None else computed)
        self.type_through += cached
        self.generated.append(generated)
        if generated > 1 and decode_ms > 0:
            self.decode_ms += decode_ms
            self.decoded += generated - 1
        self.nonempty += bool(item.strip())
        self.matches += _is_match(item, rest)

    def pct(self, name: str, q: float) -> float:
        values = sorted(getattr(self, name))
        if not values:
            return float("nan")
        return values[min(len(values) - 1, int(round(q * (len(values) - 1))))]


class Typist:
    """When the next keystroke arrives: ``pace_ms`` after the one before, or
    at once when its answer took longer (this typist waits for each
    completion). A pace of 0 types every key the moment the previous answer
    is done, which no person does: it leaves a client's background work
    (llama.vscode's speculative FIM, the daemon's work ahead) no time
    between keys, so every baseline with such work gets the same pace."""

    def __init__(self, pace_ms: float) -> None:
        self.pace_ns = int(max(0.0, pace_ms) * 1e6)
        self.last_ns = 0

    def next_key(self) -> int:
        """Wait until the next key is due; its arrival (perf_counter ns)."""
        now = time.perf_counter_ns()
        due = self.last_ns + self.pace_ns
        if self.last_ns and due > now:
            time.sleep((due - now) / 1e9)
            now = time.perf_counter_ns()
        self.last_ns = now
        return now


def _is_match(item: str, rest: str) -> bool:
    return bool(item.strip()) and item.rstrip() == rest.rstrip()


def run_sol(engine: Any, trace: list[Keystroke], progress: Callable[[str], None], *,
            interrupt: bool = False, name: str = "sol", pace_ms: float = 0.0) -> tuple[Series, Series]:
    """All keystrokes, and the subset the model had to compute (not
    answered by type-through or a resumed generation). ``interrupt``: each
    request is superseded as soon as it shows text (see the module doc);
    otherwise keys arrive ``pace_ms`` apart at the fastest (:class:`Typist`)."""
    s = Series()
    m = Series()
    typist = Typist(0.0 if interrupt else pace_ms)
    for i, ks in enumerate(trace):
        if ks.jump == JUMP_PAUSE:      # the cursor rests at the new place: the editor warms it (as sol-lsp does)
            engine.warm(CompletionRequest(id=f"w{i}", uri=f"file:///{ks.file}", prefix=ks.prefix, suffix=ks.suffix,
                                          language="python", max_tokens=32), CancelToken())
        arrival = typist.next_key()
        req = CompletionRequest(id=f"k{i}", uri=f"file:///{ks.file}", prefix=ks.prefix, suffix=ks.suffix,
                                language="python", max_tokens=32, received_ns=arrival)
        cancel = CancelToken()
        shown = ""
        visible_ns = 0
        done: Done | None = None
        for ev in engine.complete(req, cancel):
            if isinstance(ev, Done):
                done = ev
            elif interrupt and not visible_ns:
                visible_ns = time.perf_counter_ns()
                shown = ev.text
                cancel.supersede()   # the next keystroke arrives
        assert done is not None
        t = done.timings
        if visible_ns:
            t = dataclasses.replace(t, ttft_ms=(visible_ns - arrival) / 1e6)
        item = done.items[0] if done.items else shown
        s.add(t, item, ks.rest, ks.jump)
        if t.source == "model":
            m.add(t, item, ks.rest)
        if i % 10 == 0:
            progress(f"{name} {i + 1}/{len(trace)} ttft {t.ttft_ms:.0f} ms")
    return s, m


class _NewlineStop:
    """A transformers stopping criterion: stop at the first newline (single
    line), as the editor would."""

    def __init__(self, tokenizer: Any, start: int) -> None:
        self.tokenizer = tokenizer
        self.start = start

    def __call__(self, input_ids: torch.Tensor, scores: Any, **kwargs: Any) -> torch.Tensor:
        text = self.tokenizer.decode(input_ids[0, self.start:], skip_special_tokens=True)
        return torch.tensor([text.lstrip("\n").find("\n") >= 0], device=input_ids.device)


def run_generate(engine: Any, trace: list[Keystroke], every: int, progress: Callable[[str], None],
                 model: Any = None) -> Series:
    """Plain transformers generate() on the same prompt ids, no reuse;
    ``model``: the module to run (default the engine's; under an offloading
    ``sol.memory_budget`` :func:`soldaemon_bench.baselines.baseline_model` gives one
    that can)."""
    from transformers import StoppingCriteriaList

    from soldaemon_bench.baselines import FirstToken
    from soldaemon.pipeline.ending import postprocess

    model, tok = model if model is not None else engine.loaded.model, engine.tokenizer
    s = Series()
    for i, ks in enumerate(trace):
        if i % every:
            continue
        t0 = time.perf_counter_ns()
        req = CompletionRequest(id="g", prefix=ks.prefix, suffix=ks.suffix, max_tokens=32)
        ids = engine.build_prompt(req)[0].ids
        x = torch.tensor([ids], device=model.device)
        streamer = FirstToken()
        with torch.inference_mode():
            out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=32, do_sample=False,
                                 streamer=streamer, pad_token_id=0, eos_token_id=sorted(engine.template.stop_ids),
                                 stopping_criteria=StoppingCriteriaList([_NewlineStop(tok, len(ids))]))
        gen = out[0, len(ids):].tolist()
        item = postprocess(tok.decode(gen, skip_special_tokens=True), prefix=ks.prefix, suffix=ks.suffix,
                           multiline=False, max_lines=1)
        t1 = time.perf_counter_ns()
        s.add_baseline((streamer.first_ns - t0) / 1e6, (t1 - t0) / 1e6, len(ids), len(gen), item, ks.rest)
        if (i // every) % 5 == 0:
            progress(f"generate {i + 1}/{len(trace)} ttft {s.ttft_ms[-1]:.0f} ms")
    return s


def run_llama_cpp(engine: Any, gguf: Path, trace: list[Keystroke], threads: int,
                  progress: Callable[[str], None], *, interrupt: bool = False, order: str = "psm",
                  anchor: str = "cursor", name: str = MODEL_ALONE) -> Series | None:
    """llama.cpp through llama-cpp-python on the same GGUF and this daemon's
    prompt windows, in FIM ``order`` — PSM by default, the layout llama.cpp's
    server (``/infill`` without ``spm_infill``) sends; its Python API reuses
    the longest common prefix between calls. ``anchor``: where the middle
    starts (``model.fim_anchor``): ``cursor`` (``/infill`` with prefix and
    suffix only), ``line`` (the cursor line in ``/infill``'s ``prompt``
    field, after the middle token). ``interrupt``: stop at the first token
    (the next keystroke arrives)."""
    from soldaemon.fim import Budget, Place, line_anchor, make_prompt
    from soldaemon.pipeline.prompt import build_fim_prompt

    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    from soldaemon.pipeline.ending import postprocess

    model_config = dataclasses.replace(engine.config.model, fim_order=order, fim_anchor=anchor)
    llm = Llama(model_path=str(gguf), n_ctx=engine.backend.n_ctx, n_threads=threads, verbose=False)
    tok = engine.tokenizer
    s = Series()
    for i, ks in enumerate(trace):
        t0 = time.perf_counter_ns()
        req = CompletionRequest(id="l", prefix=ks.prefix, suffix=ks.suffix, max_tokens=32)
        if anchor == "cursor":
            ids = build_fim_prompt(engine.template, engine.tokenizer, model_config, req, engine.backend.n_ctx)[0].ids
        else:   # the cursor line after the middle token, without healing (llama.cpp has none)
            windows = model_config.windows()
            place = Place(ks.prefix, ks.suffix, lead_from=line_anchor(ks.prefix))
            ids = make_prompt(engine.template, engine.tokenizer, place, Budget(windows.prefix, windows.suffix),
                              order=model_config.fim_order).ids
        if ks.jump == JUMP_PAUSE:      # the same warm as the daemon gets: the prompt evaluated during the pause
            built = time.perf_counter_ns() - t0
            for _ in llm.generate(ids, temp=0.0, top_k=1):
                break
            t0 = time.perf_counter_ns() - built
        first = 0
        gen: list[int] = []
        for t in llm.generate(ids, temp=0.0, top_k=1):  # reset=True: keeps the common prefix, drops the rest
            if not first:
                first = time.perf_counter_ns()
            if t in engine.template.stop_ids or len(gen) >= 32:
                break
            if interrupt and gen:
                break
            gen.append(int(t))
            if "\n" in tok.decode(gen, skip_special_tokens=True).lstrip("\n"):
                break
        item = postprocess(tok.decode(gen, skip_special_tokens=True), prefix=ks.prefix, suffix=ks.suffix,
                           multiline=False, max_lines=1)
        t1 = time.perf_counter_ns()
        # llama-cpp-python does not report its reuse
        s.add_baseline((first - t0) / 1e6, (t1 - t0) / 1e6, len(ids), len(gen), item, ks.rest,
                       decode_ms=(t1 - first) / 1e6, part=ks.jump)
        if i % 10 == 0:
            progress(f"{name} {i + 1}/{len(trace)} ttft {s.ttft_ms[-1]:.0f} ms")
    return s


def run_llama_vscode(engine: Any, trace: list[Keystroke], threads: int,
                     progress: Callable[[str], None], pace_ms: float = 0.0) -> tuple[Series, Series, str] | None:
    """The keystrokes through llama.vscode's client against llama.cpp's
    ``llama-server`` on the engine's GGUF, started with llama.vscode's
    documented flags (:mod:`soldaemon_bench.quality.llama_server`): its request and
    post-processing, its completion cache (typing into a shown suggestion is
    answered from it: counted as type-through) and its speculative FIM after
    a shown suggestion (a background request the next keystroke does not
    wait for, but shares the server with). The wait is the whole request
    (``stream: false``). "= rest of line" compares the suggestion's first
    line. Returns the series of every keystroke, that of the keystrokes
    sent to the server (not answered from the cache), and the server's
    description; or None (said why) when there is no GGUF or the server
    cannot be built or started. Keys arrive ``pace_ms`` apart at the
    fastest (:class:`Typist`), as for the daemon."""
    from soldaemon_bench.quality.llama_server import LlamaServer, ServerError
    from soldaemon_bench.quality.llama_server_build import BuildError, build_server
    from soldaemon_bench.quality.llama_vscode import LlamaVscodeClient

    gguf = engine.loaded.gguf_path
    if gguf is None:
        progress(f"{LLAMA_VSCODE}: the model has no GGUF; skipped")
        return None
    try:
        binary = build_server(log=progress)
        server = LlamaServer(binary, Path(gguf), threads, small_model="0.5b" in Path(gguf).name.lower()).start()
    except (BuildError, ServerError) as exc:
        progress(f"{LLAMA_VSCODE}: skipped: {exc}")
        return None
    client = LlamaVscodeClient(server.infill)
    s, m = Series(), Series()
    typist = Typist(pace_ms)
    try:
        for i, ks in enumerate(trace):
            typist.next_key()
            answer = client.complete(ks.prefix, ks.suffix)
            r, t = answer.response, answer.response.get("timings", {})
            prompt_n = int(r.get("tokens_evaluated", 0))
            s.add_baseline(answer.wait_ms, answer.wait_ms, prompt_n, int(r.get("tokens_predicted", 0)),
                           answer.text.split("\n")[0], ks.rest, decode_ms=float(t.get("predicted_ms", 0.0)),
                           part=ks.jump, computed=int(t.get("prompt_n", prompt_n)), cached=answer.cached)
            if answer.requested:
                m.add_baseline(answer.wait_ms, answer.wait_ms, prompt_n, int(r.get("tokens_predicted", 0)),
                               answer.text.split("\n")[0], ks.rest, decode_ms=float(t.get("predicted_ms", 0.0)),
                               computed=int(t.get("prompt_n", prompt_n)))
            if i % 10 == 0:
                progress(f"{LLAMA_VSCODE} {i + 1}/{len(trace)} wait {answer.wait_ms:.0f} ms")
    finally:         # speculative requests still in flight are dropped with the server
        server.stop()
    return s, m, (f"{binary.describe()}; llama-server {' '.join(server.args()[2:])}; "
               f"{client.speculative_sent} speculative requests")


def run_remote(config: Config, engine: Any, trace: list[Keystroke],
               progress: Callable[[str], None]) -> dict[str, Series]:
    """The same keystrokes through the remote backend (``backend.url``: an
    OpenAI-compatible engine serving this model), with the local engine's
    tokenizer; series "remote" and "remote:model" as for sol."""
    from soldaemon.remote.engine import RemoteEngine

    if config.backend.url is None:
        progress("remote: set backend.url in the config to the engine's URL; skipped")
        return {}
    remote = RemoteEngine(config, engine.tokenizer, str(engine.info()["model"]))
    every, computed = run_sol(remote, trace, progress)
    return {"remote": every, "remote:model": computed}


def table(results: dict[str, Series], n_keys: int) -> list[str]:
    lines = [f"{'backend':<25} {'n':>4} {'TTFT p50':>9} {'TTFT p95':>9} {'e2e p50':>8} {'e2e p95':>8} "
             f"{'computed/prompt tok':>20} {'accept':>7} {'decode tok/s':>12} {'=rest of line':>14} "
             f"{'type-through':>12} {'resumed':>7}"]
    base = results.get(LLAMA_VSCODE) or results.get(MODEL_ALONE) or results.get("generate")
    for name, s in results.items():
        n = len(s.ttft_ms)
        comp = f"{statistics.mean(s.computed_tokens):.0f}/{statistics.mean(s.prompt_tokens):.0f}" if n else "-"
        acc = f"{s.accepted / s.drafted:.2f}" if s.drafted else "-"
        lines.append(f"{name:<25} {n:>4} {s.pct('ttft_ms', .5):>9.0f} {s.pct('ttft_ms', .95):>9.0f} "
                     f"{s.pct('e2e_ms', .5):>8.0f} {s.pct('e2e_ms', .95):>8.0f} {comp:>20} {acc:>7} "
                     f"{s.decode_tok_s:>12.1f} {s.matches:>6}/{n:<7} {s.type_through:>12} {s.resumed:>7}")
    if base is not None and "sol" in results:
        lines.append("")
        bases: list[str] = [b for b in (LLAMA_VSCODE, MODEL_ALONE, f"{MODEL_ALONE}, line")
                            if b in results] or ["generate"]
        for bname in bases:
            pairs = ([("sol", bname), ("sol:model", f"{bname}:model" if f"{bname}:model" in results else bname)]
                     + [(f"sol:{k}", f"{bname}:{k}") for k in JUMP_KINDS])
            for name, against in pairs:
                sol, base = results.get(name), results.get(against)
                if sol is None or base is None or not sol.ttft_ms or not base.ttft_ms:
                    continue
                lines.append(f"{name} / {against}: TTFT p50 {sol.pct('ttft_ms', .5) / base.pct('ttft_ms', .5):.3f}x, "
                             f"TTFT p95 {sol.pct('ttft_ms', .95) / base.pct('ttft_ms', .95):.3f}x, "
                             f"e2e p50 {sol.pct('e2e_ms', .5) / base.pct('e2e_ms', .5):.3f}x")
        lines.append("(sol: every keystroke; sol:model: the keystrokes the model computed, not type-through "
                     "or resumed; llama.vscode:model: the keystrokes it sent to llama-server, not answered from "
                     "its completion cache)")
        if any(f"sol:{k}" in results for k in JUMP_KINDS):
            lines.append("(NAME:jump: the first keystroke after the cursor jumped to another function, typed at "
                         "once; NAME:jump+pause: the same after a pause in which the spot was warmed)")
    nospec = results.get("sol-nospec")
    if nospec is not None and "sol" in results and nospec.decoded and results["sol"].decoded:
        lines.append(f"decode tokens/s with speculation / without: "
                     f"{results['sol'].decode_tok_s / nospec.decode_tok_s:.2f}x "
                     f"({results['sol'].decode_tok_s:.1f} vs {nospec.decode_tok_s:.1f})")
    return lines


def with_parts(results: dict[str, Series]) -> dict[str, Series]:
    """``results`` with each series' jump keystrokes (``Series.parts``) as
    rows of their own, ``NAME:jump`` and ``NAME:jump+pause``, after it."""
    out: dict[str, Series] = {}
    for name, s in results.items():
        out[name] = s
        parts, s.parts = s.parts, {}
        for kind in JUMP_KINDS:
            if kind in parts:
                out[f"{name}:{kind}"] = parts[kind]
    return out


def plot(results: dict[str, Series], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5))
    names = [n for n, s in results.items() if s.ttft_ms]
    # type-through answers take microseconds: floor at 0.1 ms for the log scale
    ax.boxplot([[max(v, 0.1) for v in results[n].ttft_ms] for n in names], tick_labels=names, showfliers=True)
    ax.set_yscale("log")
    ax.set_ylabel("time to first token per keystroke (ms, log)")
    import textwrap

    ax.set_title(textwrap.fill(title, 100), fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def run(args: argparse.Namespace, config: Config) -> int:
    import platform

    from soldaemon.runtime.engine.local import load_engine

    if not float(getattr(args, "pace_ms", 0.0)) >= 0:
        raise BadRequest(f"--pace-ms must be >= 0 (got {args.pace_ms})")
    config = with_windows(config, args)
    files = [Path(p) for p in args.corpus] if args.corpus else default_corpus()
    jumps = bool(getattr(args, "jumps", False))
    trace = make_trace(files, args.lines, args.seed, jumps=jumps)
    engine = load_engine(config)
    say = lambda msg: print("  " + msg, file=sys.stderr, flush=True)  # noqa: E731
    results: dict[str, Series] = {}
    interrupt = bool(getattr(args, "interrupt", False))
    pace = float(getattr(args, "pace_ms", 0.0))
    results["sol"], results["sol:model"] = run_sol(engine, trace, say, interrupt=interrupt, pace_ms=pace)
    if getattr(args, "compare_spec", False):
        # the same engine and weights (one resident copy), speculation off, every memory dropped
        engine.config = config.with_overrides({"completion.speculative": False}, source="bench")
        engine.forget()
        results["sol-nospec"], _ = run_sol(engine, trace, say, interrupt=interrupt, name="sol-nospec",
                                           pace_ms=pace)
        engine.config = config
    if "generate" in args.baselines:
        from soldaemon_bench.baselines import baseline_model

        model, why = baseline_model(engine, config)
        if why:
            say(why)
        if model is not None:
            results["generate"] = run_generate(engine, trace, args.baseline_every, say, model)
    peer = ""
    if LLAMA_VSCODE in args.baselines:
        got = run_llama_vscode(engine, trace, torch.get_num_threads(), say, pace_ms=pace)
        if got is not None:
            results[LLAMA_VSCODE], results[f"{LLAMA_VSCODE}:model"], peer = got
    for key, name, order, anchor in LLAMA_CPP_LAYOUTS:
        if key not in args.baselines and not (key == "llama.cpp" and "model-alone" in args.baselines):
            continue
        gguf = engine.loaded.gguf_path
        lc = (run_llama_cpp(engine, gguf, trace, torch.get_num_threads(), say, interrupt=interrupt, order=order,
                            anchor=anchor, name=name) if gguf else None)
        if lc is None:
            say(f"{name}: llama-cpp-python not installed (pip install -e ./bench) "
                "or the model has no GGUF; skipped")
            break
        results[name] = lc
    if "remote" in args.baselines:
        results.update(run_remote(config, engine, trace, say))
    results = with_parts(results)
    info = engine.info()
    head = (f"soldaemon bench --trace — {engine_label(info)}, "
            f"{info['threads']} threads, {platform.machine()}; {len(trace)} keystrokes typing {args.lines} lines "
            f"(seed {args.seed}); generate() on every {args.baseline_every}th keystroke; "
            f"typist: {'types on at the first ghost text (--interrupt)' if interrupt else 'waits for each completion'}"
            f"{'' if interrupt else f', keys at least {pace:.0f} ms apart (sol, {LLAMA_VSCODE})'}; "
            f"FIM {config.model.fim_order}, middle from the {config.model.fim_anchor} anchor"
            + (f"; after each line two jumps to other functions, {JUMP_KEYS} keystrokes each (one after a pause "
               "that warms the spot)" if jumps else "")
            + (f"; {LLAMA_VSCODE}: {peer}" if peer else ""))
    lines = [head, ""] + table(results, len(trace))
    print("\n".join(lines))
    if args.png:
        plot(results, Path(args.png), head)
        print(f"wrote {args.png}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"info": info, "keystrokes": len(trace),
                                                   "results": {k: asdict(v) for k, v in results.items()}}))
    return 0
