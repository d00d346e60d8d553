"""The local engine's model part: tokens from a prompt, for the shared
pipeline (:mod:`soldaemon.pipeline`).

One generation in flight is a :class:`Run`. A single greedy generation that
is superseded after its first token is parked (suspended, its KV session
kept) so that the next keystroke, when the user typed what it had already
produced, resumes it instead of starting over (:meth:`LocalModelPart.early`).
"""

from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Iterator

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from soldaemon.errors import Cancelled
from soldaemon.fim import FimPrompt
from soldaemon.pipeline import blockend
from soldaemon.pipeline.completion import Clock, Early, Generation
from soldaemon.pipeline.completion import preview as preview_of
from soldaemon.pipeline.postprocess import StopChecker, decide_multiline, postprocess
from soldaemon.runtime.decode.detok import Detok, end_holder, stopper
from soldaemon.policy.draft import DraftProposer, PromptLookup
from soldaemon.runtime.engine.foresight import answer_foreseen, precise_until
from soldaemon.runtime.decode.generate import GenStats, TokenEvent, generate
from soldaemon.runtime.decode.healing import HealingSampler
from soldaemon.runtime.decode.sampling import make_sampler
from soldaemon.runtime.kv.session import KVSession

if TYPE_CHECKING:
    from soldaemon.runtime.engine.local import LocalEngine


class Run:
    """One generation in flight: the suspended token generator and what the
    engine needs to stream, finish — or park and later resume — it."""

    def __init__(self, req: CompletionRequest, cancel: CancelToken, deadline_ns: int | None, decode: Detok,
                 multiline: bool, max_lines: int, prompt_tokens: int, *, resumable: bool) -> None:
        self.req = req
        self.cancel = cancel
        self.deadline_ns = deadline_ns
        self.decode = decode
        self.multiline = multiline
        self.max_lines = max_lines
        self.prompt_tokens = prompt_tokens
        self.resumable = resumable
        self.gen: Iterator[TokenEvent] = iter(())
        self.stats = GenStats()
        self.finish = "stop"
        self.parked = False
        self.typed = ""              # what the user typed of this generation's text
        self.emitted = ""            # preview streamed to the current request
        self.tokens_before = 0       # tokens generated before the current request adopted it
        self.checker: StopChecker | None = None   # the stop check it decodes under (its rule: blockend.finish)

    def cancelled(self) -> bool:
        """What the generator sees: a supersede does not stop a resumable
        generation that is decoding; the engine parks it instead."""
        return self.cancel.cancelled and not self.should_park()

    def should_park(self) -> bool:
        return (self.resumable and self.cancel.cancelled and self.cancel.reason == "superseded"
                and self.stats.first_token_ns > 0)

    def deadline(self) -> int | None:
        return self.deadline_ns

    def preview_delta(self) -> str:
        """The new preview characters of the text after what was typed."""
        preview = preview_of(self.decode.current[len(self.typed):], self.multiline)
        if preview.startswith(self.emitted) and len(preview) > len(self.emitted):
            delta = preview[len(self.emitted):]
            self.emitted = preview
            return delta
        return ""

    def typed_by(self, req: CompletionRequest, session: KVSession | None) -> str | None:
        """The text ``req`` typed along this parked generation, or None when
        it cannot take the generation over: another document or suffix, a
        prefix that does not extend this one by text the generation already
        produced, other sampling, or a KV cache used since."""
        old = self.req
        if (req.uri != old.uri or req.suffix != old.suffix or req.n != 1 or req.temperature > 0
                or req.context != old.context or req.multiline != old.multiline or req.language != old.language
                or session is None or session is not self.session or session.version != self.session_version):
            return None
        if not req.prefix.startswith(old.prefix):
            return None
        typed = req.prefix[len(old.prefix):]
        if len(typed) < len(self.typed) or not self.decode.current.startswith(typed):
            return None
        if decide_multiline(req.prefix, req.suffix, req.multiline) != self.multiline:
            return None
        if self.finish != "superseded" and len(typed) >= len(self.decode.current):
            return None
        return typed

    def park(self, session: KVSession) -> None:
        """Left suspended; ``session`` holds its prompt and tokens."""
        self.session, self.session_version = session, session.version

    session: KVSession | None = None
    session_version = -1

    def adopt(self, req: CompletionRequest, typed: str, cancel: CancelToken, deadline_ns: int | None) -> None:
        self.req, self.typed, self.cancel, self.deadline_ns = req, typed, cancel, deadline_ns
        self.emitted = ""
        self.parked = False
        self.tokens_before = len(self.decode.tokens)

    def close(self) -> None:
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()


class LocalModelPart:
    """The local engine's part of the pipeline
    (:class:`soldaemon.pipeline.ModelPart`): prefill and decode on the
    engine's KV session, with its drafts, token healing and cancel; the
    speculative answer and the parked generation as early answers."""

    def __init__(self, engine: LocalEngine) -> None:
        self.engine = engine

    def scope(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        """Around one request: notes activity for idle release, restores
        released weights first, pins them for ``priority: high``."""
        memory = self.engine.memory
        return contextlib.nullcontext() if memory is None else memory.request(req.priority)

    def early(self, req: CompletionRequest, cancel: CancelToken, clock: Clock, typed_through: bool) -> Early | None:
        """A speculative answer kept for ``req``, or the parked generation
        resumed when ``req`` typed what it had produced; a parked generation
        that cannot be resumed is closed."""
        parked, self.engine._parked = self.engine._parked, None
        if typed_through:
            if parked is not None:
                parked.close()
            return None
        foreseen = answer_foreseen(self.engine, req, clock.arrival, clock.start)
        if foreseen is not None:
            if parked is not None:
                parked.close()
            return Early(foreseen, counted=True)
        if parked is not None:
            typed = parked.typed_by(req, self.engine.session)
            if typed is not None:
                return Early(self._resume(parked, req, typed, cancel, clock), counted=True)
            parked.close()
        return None

    def generating(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        """One generation at a time, on ``req``'s document's KV session."""
        return _acquired(self.engine, req.uri)

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, checker: StopChecker,
                 multiline: bool, max_lines: int, cancel: CancelToken, deadline: int | None,
                 out: Generation) -> Iterator[str]:
        """Prefill and decode one candidate on the KV session (drafts,
        healing, stop checks); yields the decoded text after each step.
        A greedy single candidate superseded mid-decode is parked."""
        decode = Detok(self.engine.tokenizer, prompt.heal)
        sampler = make_sampler(req.temperature, req.top_p, None if req.seed is None else req.seed + candidate)
        if prompt.heal:
            sampler = HealingSampler(sampler, self.engine.token_texts(), prompt.heal)
        drafter: DraftProposer | None = None
        draft_length = self.engine.draft_length
        if self.engine.config.completion.speculative and sampler.greedy:
            drafter = self.engine.draft_model or PromptLookup()
            if self.engine.draft_model is not None:
                draft_length = self.engine.draft_model_length
        # A single greedy generation survives being superseded once it
        # decodes: parked, the next keystroke may resume it (_resume).
        run = Run(req, cancel, deadline, decode, multiline, max_lines, len(prompt.ids),
                  resumable=req.n == 1 and sampler.greedy)
        run.checker = checker
        run.gen = generate(
            self.engine.session, prompt.ids, sampler=sampler, stop_ids=self.engine.template.stop_ids,
            max_tokens=req.max_tokens, cancelled=run.cancelled,
            should_stop=stopper(checker, decode),
            deadline_ns=run.deadline, drafter=drafter,
            draft_k=self.engine.config.completion.draft_tokens, draft_length=draft_length,
            # the middle token and the typed line: at decode cost (session.prefill)
            precise_until=precise_until(prompt),
            hold_end=end_holder(req.prefix, req.suffix, decode) if multiline and self.engine.config.completion.hold_end else None,
        )
        try:
            for _ in self._drive(run):
                out.raw = decode.current
                yield out.raw
        except Cancelled:
            run.finish = "cancelled"
        finally:
            out.raw, out.finish, out.info = decode.current, run.finish, (run.stats, len(decode.tokens))  # type: ignore[assignment]
            if run.parked:
                run.park(self.engine.session)
                self.engine._parked = run
            else:
                run.close()

    def recover(self, req: CompletionRequest, cancel: CancelToken, exc: Exception,
                streamed: bool, candidate: int) -> Iterator[Event] | None:
        """No other engine to hand a failure to."""
        return None

    def timings(self, req: CompletionRequest, gens: list[Generation], prompt: FimPrompt, prompt_ms: float,
                clock: Clock) -> Timings:
        """From the last candidate's generation stats; tokens summed over all."""
        stats = gens[-1].info[0] if gens else GenStats()
        generated = sum(g.info[1] for g in gens)
        end = time.perf_counter_ns()
        first = stats.first_token_ns or end
        return Timings(
            queue_ms=(clock.start - clock.arrival) / 1e6, prompt_ms=prompt_ms, prefill_ms=stats.prefill_ms,
            ttft_ms=(first - clock.arrival) / 1e6, decode_ms=(end - first) / 1e6 if stats.first_token_ns else 0.0,
            total_ms=(end - clock.arrival) / 1e6, prompt_tokens=len(prompt.ids), cached_tokens=stats.cached_tokens,
            generated_tokens=generated, draft_tokens=stats.draft_tokens,
            accepted_tokens=stats.accepted_tokens, ttft_start_ns=clock.arrival_wall,
            ttft_end_ns=stats.first_token_wall_ns or time.time_ns(),
        )

    def account(self, t: Timings) -> None:
        s = self.engine.stats
        s.requests += 1
        s.prompt_tokens += t.prompt_tokens
        s.cached_tokens += t.cached_tokens
        s.draft_tokens += t.draft_tokens
        s.accepted_tokens += t.accepted_tokens

    def _drive(self, run: Run) -> Iterator[None]:
        """Pull ``run``'s token events, one yield per step that added text;
        park the run when it is superseded mid-decode."""
        for ev in run.gen:
            run.stats = ev.stats
            if ev.tokens:
                run.decode.push(ev.tokens)
                yield
            if ev.finish_reason:
                run.finish = ev.finish_reason
                return
            if run.should_park():
                run.parked = True
                run.finish = "superseded"
                return

    def _resume(self, run: Run, req: CompletionRequest, typed: str, cancel: CancelToken,
                clock: Clock) -> Iterator[Event]:
        """Continue a parked generation for ``req``, whose prefix is the
        parked one plus ``typed``, text the generation had already produced."""
        run.adopt(req, typed, cancel, clock.deadline(req))
        first_ns = 0
        with _acquired(self.engine, req.uri):
            delta = run.preview_delta()
            if delta:
                first_ns = time.perf_counter_ns()
                yield Delta(req.id, delta)
            if run.finish == "superseded":   # still decoding when it was parked
                run.finish = "stop"
                try:
                    for _ in self._drive(run):
                        delta = run.preview_delta()
                        if delta:
                            first_ns = first_ns or time.perf_counter_ns()
                            yield Delta(req.id, delta)
                except Cancelled:
                    run.finish = "cancelled"
            if run.parked:
                run.park(self.engine.session)
                self.engine._parked = run
            else:
                run.close()
        finish = cancel.reason if run.finish == "cancelled" else run.finish
        text = run.decode.current[len(run.typed):]
        cc = self.engine.config.completion
        plan = blockend.plan(req.prefix, req.suffix, req.language, req.multiline, cc.max_lines, cc.block_end)
        ends: tuple[str, ...] = ()
        if plan.multiline == run.multiline and run.checker is not None:
            answer = blockend.finish(plan, text, run.finish, run.checker)
            items, ends = (answer.text,), (answer.end,)
        else:
            items = (postprocess(text, prefix=req.prefix, suffix=req.suffix, multiline=run.multiline,
                                 max_lines=run.max_lines),)
        end = time.perf_counter_ns()
        first_ns = first_ns or end
        timings = Timings(
            queue_ms=(clock.start - clock.arrival) / 1e6, ttft_ms=(first_ns - clock.arrival) / 1e6,
            decode_ms=(end - first_ns) / 1e6, total_ms=(end - clock.arrival) / 1e6,
            prompt_tokens=run.prompt_tokens, cached_tokens=run.prompt_tokens,
            generated_tokens=len(run.decode.tokens) - run.tokens_before, ttft_start_ns=clock.arrival_wall,
            ttft_end_ns=time.time_ns(), source="resumed")
        self.engine.stats.resumed += 1
        yield Done(req.id, items, finish, timings, ends)  # type: ignore[arg-type]


@contextlib.contextmanager
def _acquired(engine: LocalEngine, uri: str) -> Iterator[None]:
    """Inside: the engine's lock held, ``engine.session`` the KV session of ``uri``."""
    with engine._lock:
        engine.session = engine.pool.acquire(uri)
        yield
