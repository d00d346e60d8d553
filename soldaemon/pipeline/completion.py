"""The completion pipeline, written once for every engine: checks → type-through → early answer →
prompt → generate → preview → ending → remember. :class:`Pipeline` owns the per-document state
(:class:`DocumentState`); an engine supplies only its :class:`ModelPart`. Every answer's source
(:mod:`.sources`) is previewed, cut and timed here, on one path. Nothing here imports torch.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any, Callable, ContextManager, Generator, Iterator, Protocol

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from soldaemon.config import Config
from soldaemon.fim import FimPrompt, FimTemplate, WindowMemo
from soldaemon.pipeline import candidates
from soldaemon.pipeline.clock import Clock
from soldaemon.pipeline.ending import Ending, TextEnding, ending_for
from soldaemon.pipeline.prompt import LeadAnchors, build_fim_prompt, context_selector
from soldaemon.pipeline.relevance import ContextSelector
from soldaemon.pipeline.sources import Early, Generation, Source, Stats, Stream, typed
from soldaemon.protocol import validate_request
from soldaemon.shown import Shown, remember, type_through

log = logging.getLogger("soldaemon.pipeline")

# Held back at a preview's end: post-processing may still drop them.
HOLD_BACK = " \t)]}>\"'`;,"


class Settings:
    """An engine's one config, shared by its parts: each reads ``config`` per request, none keeps
    a copy; :meth:`use` replaces it between requests. ``adapt`` is applied to every config given;
    ``candidates``: the block candidates it ranks (``completion.candidates`` resolved)."""

    def __init__(self, config: Config, adapt: Callable[[Config], Config] | None = None) -> None:
        self._adapt = adapt
        self.use(config)

    def use(self, config: Config) -> None:
        """Apply ``config`` (adapted) from the next request on."""
        self._given = config
        self.config = config if self._adapt is None else self._adapt(config)
        self.candidates = self.config.completion.candidate_count()

    def adapt_again(self) -> None:
        """Re-adapt the config given last (what ``adapt`` reads changed)."""
        self.use(self._given)


@dataclass
class DocumentState:
    """Per-document state that later answers depend on besides their own text."""

    shown: Shown                          # uri → the last completion shown (type-through)
    anchors: LeadAnchors                  # model.fim_anchor: sticky
    selector: ContextSelector | None      # by relevance (None: the chunks as sent)
    memo: WindowMemo                      # windows unchanged while typing (a pure cache)

    @classmethod
    def fresh(cls, config: Config) -> DocumentState:
        return cls({}, LeadAnchors(), context_selector(config.model), WindowMemo())

    def copy(self) -> DocumentState:
        """An independent copy; the window memo (a pure cache) is shared."""
        return DocumentState(dict(self.shown), copy.deepcopy(self.anchors), copy.deepcopy(self.selector),
                             self.memo)


class ModelPart(Protocol):
    """What an engine supplies to the pipeline; called on the engine's worker thread."""

    def scope(self, req: CompletionRequest) -> ContextManager[None]:
        """Around the whole request, type-through included."""

    def early(self, req: CompletionRequest, cancel: CancelToken, deadline: int | None,
              typed_through: bool) -> Early | Source | None:
        """An answer without a prompt (:class:`Early` events or a :class:`Source`), or None.
        Called after the checks, always; when ``typed_through`` the return is ignored."""

    def generating(self, req: CompletionRequest) -> ContextManager[None]:
        """Around all of ``req``'s candidates."""

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, ending: Ending,
                 cancel: CancelToken, deadline: int | None, *, keep_logp: bool = False) -> Stream:
        """Yield the raw text after each step, return the :class:`Generation`; stop when
        ``ending.may_stop``, on cancel and past ``deadline``. ``keep_logp``: record log-probs."""

    def scorer(self) -> candidates.Scorer | None:
        """What samples and ranks block candidates, or None."""

    def recover(self, req: CompletionRequest, cancel: CancelToken, exc: Exception,
                streamed: bool, candidate: int) -> Iterator[Event] | None:
        """Another answer after ``generate`` raised ``exc`` (None: re-raise)."""

    def account(self, timings: Timings) -> None:
        """Count one finished request."""


class Pipeline:
    """The stages of a completion and their per-document state. ``heal``: the engine can heal
    tokens (``completion.token_healing`` then decides); ``n_ctx``: what prompt + ``max_tokens``
    must fit; ``outbound``: the request filter applied before its prompt (remote engines)."""

    def __init__(self, settings: Settings, template: FimTemplate, tokenizer: Any, n_ctx: int, *, heal: bool,
                 outbound: Callable[[CompletionRequest], CompletionRequest] | None = None) -> None:
        self.settings = settings
        self.template = template
        self.tokenizer = tokenizer
        self.n_ctx = n_ctx
        self.can_heal = heal
        self.outbound = outbound
        self.documents = DocumentState.fresh(settings.config)

    @property
    def config(self) -> Config:
        return self.settings.config

    def forget(self, uri: str | None = None) -> None:
        """Drop all per-document state; with ``uri``, only the text shown there."""
        if uri is not None:
            self.documents.shown.pop(uri, None)
        else:
            self.documents = DocumentState.fresh(self.config)

    def build_prompt(self, req: CompletionRequest, *, detached: bool = False) -> tuple[FimPrompt, float]:
        """(prompt, ms) for ``req``; ``detached``: on a copy of the state, leaving no trace."""
        return self._prompt(req, self.documents.copy() if detached else self.documents)

    def _prompt(self, req: CompletionRequest, state: DocumentState) -> tuple[FimPrompt, float]:
        if self.outbound is not None:
            req = self.outbound(req)
        return build_fim_prompt(self.template, self.tokenizer, self.config.model, req, self.n_ctx,
                                heal=self.can_heal and self.config.completion.token_healing,
                                selector=state.selector, anchors=state.anchors, memo=state.memo)

    def run(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart) -> Iterator[Event]:
        """Stream zero or more Delta, then one Done. Raises :class:`soldaemon.errors.BadRequest`
        for an invalid request or a prompt that does not fit."""
        with model.scope(req):
            yield from self._run(req, cancel, model, self.documents, counted=True)

    def foresee(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart) -> Done | None:
        """``req``'s Done computed ahead (speculative FIM) on a copy of the state, not counted;
        None when the model part gave none. Raises what :meth:`run` raises."""
        done: Done | None = None
        with model.scope(req):
            for event in self._run(req, cancel, model, self.documents.copy(), counted=False):
                if isinstance(event, Done):
                    done = event
        return done

    def _run(self, req: CompletionRequest, cancel: CancelToken, model: ModelPart, state: DocumentState, *,
             counted: bool) -> Iterator[Event]:
        """The stages over ``state``; ``counted``: the Done goes into the model part's counters."""
        clock = Clock.now(req)
        validate_request(req)
        rests = type_through(state.shown, req)
        deadline = clock.deadline(req)
        early = model.early(req, cancel, deadline, bool(rests))
        if rests:
            early = typed(rests)
        if isinstance(early, Source):
            yield from self._deliver(req, early, clock, state, model, counted)
            return
        if early is not None:
            yield from self._relay(req, early, state, model, counted)
            return
        prompt, prompt_ms = self._prompt(req, state)
        ending = self._ending(req)
        previewer = Previewer(ending.multiline, ending.may_repeat_below())
        items: list[str] = []
        ends: list[str] = []
        gens: list[Generation] = []
        with model.generating(req):
            for candidate in range(req.n):
                if candidate:
                    ending.restart()
                text = model.generate(req, prompt, candidate, ending, cancel, deadline,
                                      keep_logp=self._may_rank(req, ending))
                try:
                    gen, _, _ = yield from self._previewed(req, text, previewer if candidate == 0 else None)
                except Exception as exc:
                    other = model.recover(req, cancel, exc, bool(previewer.emitted), candidate)
                    if other is None:
                        raise
                    yield from self._relay(req, Early(other, counted=False), state, model, counted)
                    return
                gens.append(gen)
                answer = ending.shown(gen.raw, gen.finish, ending.rule)
                items.append(answer.text)
                ends.append(answer.end)
                if not gen.whole:
                    break
            streamed: str | None = None
            scorer = model.scorer()
            # sample block candidates after a rankable answer that ended whole
            if scorer is not None and self._may_rank(req, ending) and len(gens) == 1 and gens[0].whole and gens[0].ids:
                greedy = items[0]
                items[0], ends[0], sampled = self._chosen(req, prompt, ending, gens[0], items[0], ends[0], scorer,
                                                          cancel, deadline)
                gens[0] = dataclasses.replace(gens[0], stats=dataclasses.replace(
                    gens[0].stats, generated_tokens=gens[0].stats.generated_tokens + sampled))
                streamed = greedy if greedy.strip() and items[0] != greedy else None
        finish = gens[-1].finish if gens else "stop"
        yield self._finish(req, items, finish, _timings(clock, gens, len(prompt.ids), prompt_ms), state, model,
                           counted, ends, streamed)

    def _previewed(self, req: CompletionRequest, text: Stream,
                   previewer: Previewer | None) -> Generator[Event, None, tuple[Generation, int, int]]:
        """``text`` as deltas through ``previewer`` (None: no deltas); returns the Generation and
        the first delta's perf_counter_ns and time_ns (0: none)."""
        first_ns = first_wall = 0
        while True:
            try:
                raw = next(text)
            except StopIteration as end:
                return end.value, first_ns, first_wall
            new = previewer.push(raw) if previewer is not None else ""
            if new:
                if not first_ns:
                    first_ns, first_wall = time.perf_counter_ns(), time.time_ns()
                yield Delta(req.id, new)

    def _deliver(self, req: CompletionRequest, source: Source, clock: Clock,
                 state: DocumentState, model: ModelPart, counted: bool) -> Iterator[Event]:
        """A prompt-less answer, previewed, cut for ``req`` and timed from its arrival. Started
        under another multi-line plan, it is cut by the text rules alone and its end is unknown;
        one without an ending is shown as is and timed as come at once."""
        started = source.ending
        previewer = Previewer(started.multiline) if started is not None else Previewer(True, hold_back="")
        gen, first_ns, first_wall = yield from self._previewed(req, source.text, previewer)
        items, ends = [gen.raw], []
        if started is not None:
            ending = self._ending(req)
            if ending.multiline == started.multiline:
                answer = ending.shown(gen.raw, gen.finish, started.rule)
                items, ends = [answer.text], [answer.end]
            else:
                items = [TextEnding(req.prefix, req.suffix, started.multiline, started.max_lines)
                         .shown(gen.raw, gen.finish, None).text]
        else:
            first_ns = first_wall = 0
        timings = clock.timings(first_ns=first_ns, first_wall_ns=first_wall, prompt_tokens=source.prompt_tokens,
                                cached_tokens=source.prompt_tokens, generated_tokens=gen.stats.generated_tokens,
                                source=source.kind)
        yield self._finish(req, items, gen.finish, timings, state, model, counted and source.counted, ends,
                           also=source.also)

    def _ending(self, req: CompletionRequest) -> Ending:
        """``req``'s ending (restarted per generation)."""
        cc = self.config.completion
        return ending_for(req.prefix, req.suffix, req.language, req.multiline, cc.max_lines, cc.block_end)

    def _may_rank(self, req: CompletionRequest, ending: Ending) -> bool:
        """Whether the answer may be chosen among candidates (greedy, single, multi-line)."""
        return self.settings.candidates > 1 and ending.multiline and req.n == 1 and req.temperature == 0

    def _chosen(self, req: CompletionRequest, prompt: FimPrompt, ending: Ending, gen: Generation,
                text: str, end: str, scorer: candidates.Scorer, cancel: CancelToken,
                deadline: int | None) -> tuple[str, str, int]:
        """(text, end, tokens sampled) of the candidate the model is surest of, the greedy
        ``text`` included; nothing is sampled when it is :data:`candidates.SURE`."""
        text_of = scorer.texts(prompt)

        def scores(g: Generation) -> candidates.Scores:   # as decoded, or one forward more
            return candidates.Decoded(list(g.logp)) if g.logp is not None and len(g.logp) == len(g.ids) \
                else scorer.score(req, prompt, g.ids)

        best = candidates.confidence(scores(gen), candidates.shown_tokens(text_of, gen.ids, text))
        if best >= candidates.SURE:
            log.info("candidates id=%s: none sampled, the greedy answer is sure (mean log-p %.3f)", req.id, best)
            return text, end, 0
        best_text, best_end, seen, sampled = text, end, {text}, 0
        for c in range(1, self.settings.candidates):
            if cancel.cancelled or (deadline is not None and time.perf_counter_ns() >= deadline):
                break
            ending.restart()
            stream = scorer.generate(candidates.sampled(req, c), prompt, 0, ending, cancel, deadline,
                                     keep_logp=True, reference=gen.ids)
            other = yield_all(stream)
            sampled += other.stats.generated_tokens
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
        return best_text, best_end, sampled

    def _finish(self, req: CompletionRequest, items: list[str], finish: str, timings: Timings, state: DocumentState,
                model: ModelPart, counted: bool, ends: list[str] | None = None, streamed: str | None = None, *,
                also: str | None = None) -> Done:
        """The request's Done; a whole answer's first item is remembered for type-through, with
        ``streamed`` (the streamed answer a candidate replaced) or else ``also``."""
        if counted:
            model.account(timings)
        if finish in ("stop", "length") and items:
            remember(state.shown, req, items[0], streamed if streamed is not None else also)
        log.info("complete id=%s finish=%s source=%s prompt=%d cached=%d gen=%d prompt_ms=%.1f prefill_ms=%.1f "
                 "ttft_ms=%.1f decode_ms=%.1f total_ms=%.1f accept=%d/%d", req.id, finish, timings.source,
                 timings.prompt_tokens, timings.cached_tokens, timings.generated_tokens, timings.prompt_ms,
                 timings.prefill_ms, timings.ttft_ms, timings.decode_ms, timings.total_ms,
                 timings.accepted_tokens, timings.draft_tokens)
        return Done(req.id, tuple(items), finish, timings, tuple(ends or ()), streamed)  # type: ignore[arg-type]

    def _relay(self, req: CompletionRequest, early: Early, state: DocumentState, model: ModelPart,
               counted: bool) -> Iterator[Event]:
        """A fallback engine's events, its Done finished like the pipeline's own."""
        for event in early.events:
            if isinstance(event, Done):
                if early.counted:
                    event = self._finish(req, list(event.items), event.finish_reason, event.timings, state,
                                         model, counted, list(event.ends), event.streamed)
                elif event.finish_reason in ("stop", "length") and event.items:
                    remember(state.shown, req, event.items[0], event.streamed)
            yield event


def _timings(clock: Clock, gens: list[Generation], prompt_tokens: int, prompt_ms: float) -> Timings:
    """Timings: first token and prompt from the first generation, tokens summed over all."""
    first = gens[0].stats if gens else Stats()
    return clock.timings(first_ns=first.first_ns, first_wall_ns=first.first_wall_ns, prompt_ms=prompt_ms,
                         prefill_ms=first.prefill_ms, prompt_tokens=prompt_tokens,
                         cached_tokens=min(first.cached_tokens, prompt_tokens),
                         generated_tokens=sum(g.stats.generated_tokens for g in gens),
                         draft_tokens=sum(g.stats.draft_tokens for g in gens),
                         accepted_tokens=sum(g.stats.accepted_tokens for g in gens))


def yield_all(text: Stream) -> Generation:
    """Run ``text`` to its end and return its Generation."""
    while True:
        try:
            next(text)
        except StopIteration as end:
            return end.value


# -- the streamed preview ---------------------------------------------------


class Previewer:
    """Turns the growing raw text into append-only ``Delta`` texts: ``push(raw)`` returns the new
    characters of what may stream (the first line when single-line, ``hold_back`` stripped), or ""
    when none (or the preview would rewrite what was sent). ``held(raw)``: True while nothing may
    show yet (:meth:`Ending.may_repeat_below`)."""

    def __init__(self, multiline: bool, held: Callable[[str], bool] | None = None,
                 hold_back: str = HOLD_BACK) -> None:
        self.multiline = multiline
        self.held = held
        self.hold_back = hold_back
        self.emitted = ""

    def push(self, raw: str) -> str:
        if self.held is not None and not self.emitted and self.held(raw):
            return ""
        shown = (raw if self.multiline else raw.split("\n", 1)[0]).rstrip(self.hold_back)   # "": strips nothing
        if shown.startswith(self.emitted) and len(shown) > len(self.emitted):
            new = shown[len(self.emitted):]
            self.emitted = shown
            return new
        return ""
