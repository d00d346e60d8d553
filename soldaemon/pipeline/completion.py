"""The completion pipeline, written once for every engine.

checks → type-through → (an engine's early answer) → prompt → generate →
preview → post-process → remember. :class:`Pipeline` runs these stages and
owns the per-document memory they need (:class:`Memory`: the text shown for
type-through, the sticky lead anchors, the relevance context's choice, the
window memo). An engine supplies only the model part (:class:`ModelPart`):
text from a prompt -- the local runtime's prefill and decode, or a remote
engine's HTTP stream. Whatever the source of an answer (the model, a parked
generation resumed, an answer computed ahead, type-through), the preview,
the post-processing and the timings (:meth:`Clock.timings`) are done here.
Nothing here imports torch.
"""

from __future__ import annotations

import copy
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, ContextManager, Iterator, NamedTuple, Protocol

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, FinishReason, Timings
from soldaemon.config import Config
from soldaemon.fim import FimPrompt, FimTemplate, WindowMemo
from soldaemon.pipeline.clock import Clock
from soldaemon.pipeline.ending import Ending, TextEnding, ending_for, may_repeat_below
from soldaemon.protocol import validate_request
from soldaemon.shown import Shown, remember, type_through
from soldaemon.pipeline.relevance import ContextSelector
from soldaemon.pipeline import candidates
from soldaemon.pipeline.prompt import LeadAnchors, build_fim_prompt, context_selector

log = logging.getLogger("soldaemon.pipeline")

# Characters a preview holds back at its end: post-processing may still drop
# them (trailing blanks, closers the suffix already has).
HOLD_BACK = " \t)]}>\"'`;,"

@dataclass
class Memory:
    """The pipeline's per-document memory: what later requests' answers
    depend on besides their own text."""

    shown: Shown                          # uri → the last completion shown and its prompt inputs (type-through)
    anchors: LeadAnchors                  # model.fim_anchor: sticky
    selector: ContextSelector | None      # model.context: relevance (None: the chunks as sent)
    memo: WindowMemo                      # windows unchanged while typing (a pure cache)

    @classmethod
    def fresh(cls, config: Config) -> Memory:
        return cls({}, LeadAnchors(), context_selector(config.model), WindowMemo())

    def copy(self) -> Memory:
        """A copy whose changes leave this one as it is (the window memo,
        a pure cache, is shared)."""
        return Memory(dict(self.shown), copy.deepcopy(self.anchors), copy.deepcopy(self.selector), self.memo)


@dataclass
class Generation:
    """One candidate's generation, filled by the model part as it runs."""

    raw: str = ""                     # the text generated so far
    finish: FinishReason = "stop"     # how it ended ("cancelled": see the request's cancel reason)
    tokens: int = 0                   # tokens generated for this request (0: the model part does not count)
    info: Any = None                  # the model part's own record (stats, usage), for its timings
    ids: list[int] = field(default_factory=list)   # its tokens, where the model part has them (the local one)
    # asked for (a list) by the pipeline: each of ``ids``' log-probability, where
    # the model part can say (the local one, as it decodes); left as it was otherwise
    logp: list[float] | None = None


class Early(NamedTuple):
    """Events an engine answers with before any prompt is built, passed on
    as they are (a fallback engine's answer)."""

    events: Iterator[Event]
    counted: bool        # its Done goes into the engine's counters (account)


@dataclass
class Resumed:
    """A generation the model part started for an earlier request and
    hands over to this one (the local part's parked run, resumed when the
    user typed what it had produced). The pipeline previews, post-processes
    and times it like its own."""

    text: Iterator[str]       # the raw text after what was typed, now and after each step; fills ``out``
    out: Generation           # raw, finish and tokens (generated for this request) once ``text`` ended
    ending: Ending            # where its answer ends, as the generation was started
    prompt_tokens: int        # its prompt (all cached: nothing is computed for this request)


@dataclass(frozen=True)
class Precomputed:
    """This very request's answer, computed ahead (speculative FIM): its
    ``Done`` as the computation ended."""

    done: Done


class ModelPart(Protocol):
    """What an engine supplies to the pipeline: the model's part of a
    completion. Called on the engine's worker thread."""

    def scope(self, req: CompletionRequest) -> ContextManager[None]:
        """Around the whole request, type-through included (e.g. the local
        model's memory scheduler: weights restored, pinned for priority)."""

    def early(self, req: CompletionRequest, cancel: CancelToken, clock: Clock,
              typed_through: bool) -> Early | Resumed | Precomputed | None:
        """Called after the checks, before and whatever type-through answers
        (``typed_through``: it did; the return is then ignored). An answer
        without a prompt -- events passed on as they are (:class:`Early`),
        a generation to finish (:class:`Resumed`), this request's answer
        computed ahead (:class:`Precomputed`) -- or None."""

    def generating(self, req: CompletionRequest) -> ContextManager[None]:
        """Around all of ``req``'s candidates (e.g. the local model's lock)."""

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, ending: Ending,
                 cancel: CancelToken, deadline: int | None, out: Generation) -> Iterator[str]:
        """Generate candidate ``candidate``; yield the raw text after each
        step, and fill ``out``. Stops early when ``ending.may_stop`` says
        the rest would be cut, on cancel and past ``deadline``."""

    def recover(self, req: CompletionRequest, cancel: CancelToken, exc: Exception,
                streamed: bool, candidate: int) -> Iterator[Event] | None:
        """Another answer after ``generate`` raised ``exc`` (None: re-raise)."""

    def timings(self, req: CompletionRequest, gens: list[Generation], prompt: FimPrompt, prompt_ms: float,
                clock: Clock) -> Timings:
        """The request's timings from its candidates' generations."""

    def account(self, timings: Timings) -> None:
        """Count one finished request."""


class Pipeline:
    """The stages of a completion and their per-document memory (see the
    module doc). ``heal``: the engine can heal tokens (the local one: it
    constrains the first token), then ``completion.token_healing`` decides;
    ``n_ctx``: the context the prompt and ``max_tokens`` must fit;
    ``outbound``: what of a request may leave the machine (a remote engine:
    :func:`soldaemon.privacy.rules.outbound`), applied before its prompt. An
    engine may replace ``config`` between requests (the quality benchmark
    does): every stage reads it at each request."""

    def __init__(self, config: Config, template: FimTemplate, tokenizer: Any, n_ctx: int, *, heal: bool,
                 outbound: Callable[[CompletionRequest], CompletionRequest] | None = None) -> None:
        self.config = config
        self.template = template
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.can_heal = heal
        self.outbound = outbound
        self.memory = Memory.fresh(config)

    def forget(self, uri: str | None = None) -> None:
        """Drop every per-document memory, as if just built; with ``uri``,
        only the text shown there (its next request is not type-through)."""
        if uri is not None:
            self.memory.shown.pop(uri, None)
        else:
            self.memory = Memory.fresh(self.config)

    def build_prompt(self, req: CompletionRequest, *, detached: bool = False) -> tuple[FimPrompt, float]:
        """Window, tokenize and template ``req`` (:func:`build_fim_prompt`
        with this pipeline's memory; ``detached``: with a copy of it, so
        that later prompts are as if this one was never built). Returns
        (prompt, ms)."""
        return self._prompt(req, self.memory.copy() if detached else self.memory)

    def _prompt(self, req: CompletionRequest, memory: Memory) -> tuple[FimPrompt, float]:
        if self.outbound is not None:
            req = self.outbound(req)
        return build_fim_prompt(self.template, self.tokenizer, self.config.model, req, self.n_ctx,
                                heal=self.can_heal and self.config.completion.token_healing,
                                selector=memory.selector, anchors=memory.anchors, memo=memory.memo)

    def run(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart) -> Iterator[Event]:
        """Stream one completion: zero or more Delta, then one Done. Raises
        :class:`soldaemon.errors.BadRequest` for a request the protocol
        refuses or whose prompt does not fit."""
        with model.scope(req):
            yield from self._run(req, cancel, model, self.memory, model)

    def foresee(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart) -> Done | None:
        """Compute ``req``'s answer ahead of it (speculative FIM): the
        stages :meth:`run` goes through, on a copy of the per-document
        memory and not counted, so that what later requests get is as if
        it never ran. Its Done (logged like any), or None when the model
        part ended without one. Raises what :meth:`run` raises."""
        done: Done | None = None
        with model.scope(req):
            for event in self._run(req, cancel, model, self.memory.copy(), None):
                if isinstance(event, Done):
                    done = event
        return done

    def _run(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart, memory: Memory,
             counter: ModelPart | None) -> Iterator[Event]:
        """The stages over ``memory``; the Done is counted by ``counter``
        (None: not counted)."""
        clock = Clock.now(req)
        validate_request(req)
        rests = type_through(memory.shown, req)
        early = model.early(req, cancel, clock, bool(rests))
        if rests:
            remember(memory.shown, req, *rests)
            yield from type_through_events(req, rests[0], clock)
            return
        if isinstance(early, Resumed):
            yield from self._resumed(req, early, cancel, clock, memory, counter)
            return
        if isinstance(early, Precomputed):
            yield from self._precomputed(req, early.done, clock, memory, counter)
            return
        if early is not None:
            yield from self._relay(req, early, memory, counter)
            return
        prompt, prompt_ms = self._prompt(req, memory)
        ending = self._ending(req)
        deadline = clock.deadline(req)
        previewer = Previewer(ending.multiline, may_repeat_below(req.prefix, req.suffix))
        items: list[str] = []
        ends: list[str] = []
        gens: list[Generation] = []
        finish: str = "stop"
        with model.generating(req):
            for candidate in range(req.n):
                if candidate:
                    ending.restart()
                gen = Generation(logp=[] if self._may_rank(req, ending) else None)
                try:
                    for raw in model.generate(req, prompt, candidate, ending, cancel, deadline, gen):
                        if candidate == 0:
                            new = previewer.push(raw)
                            if new:
                                yield Delta(req.id, new)
                except Exception as exc:
                    other = model.recover(req, cancel, exc, bool(previewer.emitted), candidate)
                    if other is None:
                        raise
                    yield from self._relay(req, Early(other, counted=False), memory, counter)
                    return
                gens.append(gen)
                finish = gen.finish
                answer = ending.shown(gen.raw, gen.finish, ending.rule)
                items.append(answer.text)
                ends.append(answer.end)
                if finish in ("cancelled", "budget", "superseded"):
                    break
            streamed: str | None = None
            if self._may_sample(req, ending, gens, model):
                greedy = items[0]
                items[0], ends[0] = self._chosen(req, prompt, ending, gens[0], items[0], ends[0], model, cancel,
                                                 deadline)
                streamed = greedy if greedy.strip() and items[0] != greedy else None
        if finish == "cancelled":
            finish = cancel.reason
        yield self._finish(req, items, finish, model.timings(req, gens, prompt, prompt_ms, clock), memory,
                           counter, ends, streamed)

    def _ending(self, req: CompletionRequest) -> Ending:
        """Where ``req``'s answer ends (restarted for each of its
        generations)."""
        cc = self.config.completion
        return ending_for(req.prefix, req.suffix, req.language, req.multiline, cc.max_lines, cc.block_end)

    def _may_sample(self, req: CompletionRequest, ending: Ending, gens: list[Generation],
                    model: ModelPart) -> bool:
        """Block candidates (:mod:`.candidates`) for this answer: a greedy
        single multi-line answer that ended whole (not cancelled, superseded
        or past the budget), a model part that scores."""
        return (self._may_rank(req, ending) and len(gens) == 1 and gens[0].finish in ("stop", "length")
                and bool(gens[0].ids) and hasattr(model, "score"))

    def _may_rank(self, req: CompletionRequest, ending: Ending) -> bool:
        """Whether this request's answer may be chosen among candidates."""
        return self.config.completion.candidate_count() > 1 and ending.multiline and req.n == 1 and req.temperature == 0

    def _chosen(self, req: CompletionRequest, prompt: FimPrompt, ending: Ending, gen: Generation,
                text: str, end: str, model: ModelPart, cancel: CancelToken,
                deadline: int | None) -> tuple[str, str]:
        """The shown answer and its end among the greedy one (``text``,
        ``end``) and the sampled candidates: the one the model is surest of."""
        scorer: candidates.Scorer = model  # type: ignore[assignment]   # _may_sample: it has score
        text_of = candidates.texts(self.tokenizer, prompt.heal)

        def scores(g: Generation) -> candidates.Scores:   # as decoded, or one forward more
            return candidates.Decoded(g.logp) if g.logp is not None and len(g.logp) == len(g.ids) \
                else scorer.score(req, prompt, g.ids)

        best = candidates.confidence(scores(gen), candidates.shown_tokens(text_of, gen.ids, text))
        best_text, best_end, seen = text, end, {text}
        for c in range(1, self.config.completion.candidate_count()):
            if cancel.cancelled or (deadline is not None and time.perf_counter_ns() >= deadline):
                break
            ending.restart()
            other = Generation(logp=[])
            for _ in scorer.generate(candidates.sampled(req, c), prompt, 0, ending, cancel, deadline, other,
                                     reference=gen.ids):
                pass
            gen.tokens += other.tokens
            if other.finish not in ("stop", "length"):
                break
            answer = ending.shown(other.raw, other.finish, ending.rule)
            if answer.text in seen:
                continue
            seen.add(answer.text)
            sure = candidates.confidence(scores(other), candidates.shown_tokens(text_of, other.ids, answer.text))
            log.info("candidate id=%s #%d: mean log-p %.3f against %.3f%s", req.id, c, sure, best,
                     ", shown" if sure > best else "")
            if sure > best:
                best, best_text, best_end = sure, answer.text, answer.end
        return best_text, best_end

    def _resumed(self, req: CompletionRequest, run: Resumed, cancel: CancelToken, clock: Clock, memory: Memory,
                 counter: ModelPart | None) -> Iterator[Event]:
        """A generation handed over by the model part: previewed as it
        continues, post-processed for ``req`` (whose plan may differ from
        the one it was started under) and timed from ``req``'s arrival."""
        previewer = Previewer(run.ending.multiline)
        first_ns = first_wall = 0
        for raw in run.text:
            new = previewer.push(raw)
            if new:
                if not first_ns:
                    first_ns, first_wall = time.perf_counter_ns(), time.time_ns()
                yield Delta(req.id, new)
        gen = run.out
        ending = self._ending(req)
        ends: list[str] = []
        if ending.multiline == run.ending.multiline:
            answer = ending.shown(gen.raw, gen.finish, run.ending.rule)
            items, ends = [answer.text], [answer.end]
        else:
            mode = TextEnding(req.prefix, req.suffix, run.ending.multiline, run.ending.max_lines)
            items = [mode.shown(gen.raw, gen.finish, None).text]
        finish = cancel.reason if gen.finish == "cancelled" else gen.finish
        timings = clock.timings(first_ns=first_ns, first_wall_ns=first_wall, prompt_tokens=run.prompt_tokens,
                                cached_tokens=run.prompt_tokens, generated_tokens=gen.tokens, source="resumed")
        yield self._finish(req, items, finish, timings, memory, counter, ends)

    def _precomputed(self, req: CompletionRequest, done: Done, clock: Clock, memory: Memory,
                     counter: ModelPart | None) -> Iterator[Event]:
        """``req``'s answer computed ahead: its first item as one delta; the
        Done timed from ``req``'s arrival, every prompt token counted cached
        (nothing was computed for this request)."""
        t = done.timings
        timings = clock.timings(prompt_tokens=t.prompt_tokens, cached_tokens=t.prompt_tokens,
                                generated_tokens=t.generated_tokens, source="speculative")
        if done.items and done.items[0]:
            yield Delta(req.id, done.items[0])
        yield self._finish(req, list(done.items), done.finish_reason, timings, memory, counter)

    def _finish(self, req: CompletionRequest, items: list[str], finish: str, timings: Timings, memory: Memory,
                counter: ModelPart | None, ends: list[str] | None = None, streamed: str | None = None) -> Done:
        """The request's Done; counted by ``counter`` (None: not counted), its
        first item remembered for type-through when it finished whole, and
        the ``streamed`` answer a candidate replaced after it (typing along
        the lines the deltas showed goes on from it)."""
        if counter is not None:
            counter.account(timings)
        if finish in ("stop", "length") and items:
            remember(memory.shown, req, items[0], streamed)
        log.info("complete id=%s finish=%s source=%s prompt=%d cached=%d gen=%d prompt_ms=%.1f prefill_ms=%.1f "
                 "ttft_ms=%.1f decode_ms=%.1f total_ms=%.1f accept=%d/%d", req.id, finish, timings.source,
                 timings.prompt_tokens, timings.cached_tokens, timings.generated_tokens, timings.prompt_ms,
                 timings.prefill_ms, timings.ttft_ms, timings.decode_ms, timings.total_ms,
                 timings.accepted_tokens, timings.draft_tokens)
        return Done(req.id, tuple(items), finish, timings, tuple(ends or ()), streamed)  # type: ignore[arg-type]

    def _relay(self, req: CompletionRequest, early: Early, memory: Memory,
               counter: ModelPart | None) -> Iterator[Event]:
        """An early answer's events, its Done finished like the pipeline's own."""
        for event in early.events:
            if isinstance(event, Done):
                if early.counted:
                    event = self._finish(req, list(event.items), event.finish_reason, event.timings, memory,
                                         counter, list(event.ends), event.streamed)
                elif event.finish_reason in ("stop", "length") and event.items:
                    remember(memory.shown, req, event.items[0], event.streamed)
            yield event


# -- the streamed preview and type-through --------------------------------


def preview(raw: str, multiline: bool) -> str:
    """What may be streamed of the raw generated text so far: its first line
    when single-line, minus the :data:`HOLD_BACK` characters at its end."""
    text = raw if multiline else raw.split("\n", 1)[0]
    return text.rstrip(HOLD_BACK)


class Previewer:
    """Turns the growing raw text into ``Delta`` texts that only ever append:
    ``push(raw)`` returns the new preview characters, or "" when the preview
    did not grow (or would rewrite what was sent). ``held(raw)``: True while
    nothing of ``raw`` may be shown yet (a first line that is, or may become,
    the line below the cursor: :func:`may_repeat_below`)."""

    def __init__(self, multiline: bool, held: Callable[[str], bool] | None = None) -> None:
        self.multiline = multiline
        self.held = held
        self.emitted = ""

    def push(self, raw: str) -> str:
        if self.held is not None and not self.emitted and self.held(raw):
            return ""
        shown = preview(raw, self.multiline)
        if shown.startswith(self.emitted) and len(shown) > len(self.emitted):
            new = shown[len(self.emitted):]
            self.emitted = shown
            return new
        return ""


def type_through_events(req: CompletionRequest, rest: str, clock: Clock) -> Iterator[Event]:
    """The answer from type-through: the rest as one delta, then done."""
    timings = clock.timings(source="type-through")
    yield Delta(req.id, rest)
    yield Done(req.id, (rest,), "stop", timings)
