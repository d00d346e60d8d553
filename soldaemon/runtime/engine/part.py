"""The local engine's model part for the shared pipeline (:mod:`soldaemon.pipeline`).
:class:`LocalModelPart` owns what a generation touches: the generation lock (shared with the
memory scheduler), the KV session pool, drafts, counters, the parked :class:`Run` and the
foreseen answer (:mod:`.foresight`). A request's session is looked up per request, never kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Generator, Iterator, Sequence

from soldaemon.api import CancelToken, CompletionRequest, Event, FinishReason, Timings
from soldaemon.config import Config
from soldaemon.errors import Cancelled
from soldaemon.fim import FimPrompt, FimTemplate
from soldaemon.pipeline.completion import Settings
from soldaemon.pipeline.sources import Generation, Source, Stats, Stream, precomputed
from soldaemon.pipeline.candidates import Scorer
from soldaemon.pipeline.ending import Ending, decide_multiline
from soldaemon.policy.draft import AlongReference, DraftLength, DraftProposer, PromptLookup
from soldaemon.runtime.engine.foresight import Foreseen, precise_until
from soldaemon.runtime.decode.draft import DraftModel
from soldaemon.runtime.decode.generate import Detok, GenStats, TokenEvent, generate
from soldaemon.runtime.decode.sampling import HealingSampler, Sampler, TokenTexts, make_sampler
from soldaemon.runtime.decode.second import Replay, TokenScores, second_choice, token_scores
from soldaemon.runtime.kv.session import KVSession, PrefillResult, SessionPool
from soldaemon.runtime.memory.scheduler import MemoryScheduler

log = logging.getLogger("soldaemon.engine")


@dataclass
class EngineStats:
    requests: int = 0
    prompt_tokens: int = 0         # summed over requests
    cached_tokens: int = 0         # of which reused from the KV cache
    draft_tokens: int = 0
    accepted_tokens: int = 0
    resumed: int = 0               # requests answered by resuming a parked generation

    @property
    def kv_hit_ratio(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass(frozen=True)
class Drafts:
    """The draft model (``model.draft_model``) and the warm-up's draft sizing (None:
    ``completion.draft_tokens`` fixed)."""

    model: DraftModel | None = None
    length: DraftLength | None = None          # prompt lookup's (sampled decodes derive theirs)
    model_length: DraftLength | None = None    # the draft model's, with its step's cost


def _stats(s: GenStats, tokens: int) -> Stats:
    """The pipeline's stats of a decode; ``tokens``: generated for this request."""
    return Stats(first_ns=s.first_token_ns, first_wall_ns=s.first_token_wall_ns, prefill_ms=s.prefill_ms,
                 cached_tokens=s.cached_tokens, generated_tokens=tokens, draft_tokens=s.draft_tokens,
                 accepted_tokens=s.accepted_tokens)


def _both(first: Stats, again: Stats) -> Stats:
    """Stats of a request decoded twice (second choice): both decodes' counts, ``again``'s
    first token."""
    return dataclasses.replace(again, prefill_ms=first.prefill_ms + again.prefill_ms,
                               cached_tokens=first.cached_tokens,
                               generated_tokens=first.generated_tokens + again.generated_tokens,
                               draft_tokens=first.draft_tokens + again.draft_tokens,
                               accepted_tokens=first.accepted_tokens + again.accepted_tokens)


class Run:
    """One generation in flight. A single greedy one superseded after its first token is parked
    (suspended, its KV session kept) and resumed when the next request typed what it produced."""

    def __init__(self, req: CompletionRequest, cancel: CancelToken, deadline_ns: int | None, decode: Detok,
                 ending: Ending, prompt_tokens: int, *, resumable: bool) -> None:
        self.req = req
        self.cancel = cancel
        self.deadline_ns = deadline_ns
        self.decode = decode
        self.ending = ending         # where its answer ends (its rule: the one that stopped it)
        self.prompt_tokens = prompt_tokens
        self.resumable = resumable
        self.gen: Iterator[TokenEvent] = iter(())
        self.stats = GenStats()
        self.finish: FinishReason = "stop"
        self.parked = False          # superseded mid-decode: kept for the next keystroke
        self.typed = ""              # what the user typed of this generation's text
        self.tokens_before = 0       # tokens generated before the current request adopted it

    def cancelled(self) -> bool:
        """Cancel as the generator sees it: a resumable decoding run is parked, not stopped."""
        return self.cancel.cancelled and not self.should_park()

    def should_park(self) -> bool:
        return self.resumable and self.cancel.superseded and self.stats.first_token_ns > 0

    def deadline(self) -> int | None:
        return self.deadline_ns

    def text(self) -> str:
        """What it generated after the text the user typed."""
        return self.decode.current[len(self.typed):]

    def typed_by(self, req: CompletionRequest) -> str | None:
        """The text ``req`` typed along this parked run, or None when ``req`` cannot take it over
        (other document, suffix or sampling; typed text it did not produce; its session changed)."""
        old = self.req
        if (req.uri != old.uri or req.suffix != old.suffix or req.n != 1 or req.temperature > 0
                or req.context != old.context or req.multiline != old.multiline or req.language != old.language
                or self.session is None or self.session.version != self.session_version):
            return None
        if not req.prefix.startswith(old.prefix):
            return None
        typed = req.prefix[len(old.prefix):]
        if len(typed) < len(self.typed) or not self.decode.current.startswith(typed):
            return None
        if decide_multiline(req.prefix, req.suffix, req.multiline) != self.ending.multiline:
            return None
        return typed

    def park(self, session: KVSession) -> None:
        """Suspend on ``session``, which holds its prompt and tokens."""
        self.session, self.session_version = session, session.version

    session: KVSession | None = None
    session_version = -1

    def adopt(self, req: CompletionRequest, typed: str, cancel: CancelToken, deadline_ns: int | None) -> None:
        self.req, self.typed, self.cancel, self.deadline_ns = req, typed, cancel, deadline_ns
        self.parked = False
        self.tokens_before = len(self.decode.tokens)

    def close(self) -> None:
        close = getattr(self.gen, "close", None)
        if close is not None:
            close()


class LocalModelPart:
    """The local :class:`~soldaemon.pipeline.completion.ModelPart`: decode on the document's KV
    session; the foreseen answer and the parked run as early answers. Worker thread only.
    ``lock``: the generation lock, held around every forward; ``memory`` takes it to move
    weights."""

    def __init__(self, pool: SessionPool, tokenizer: Any, template: FimTemplate, settings: Settings, *,
                 lock: threading.Lock, memory: MemoryScheduler | None, drafts: Drafts = Drafts()) -> None:
        self.settings = settings
        self.tokenizer = tokenizer
        self.template = template
        self.stats = EngineStats()
        self.foreseen = Foreseen()                     # completion.speculative_fim's answer
        self.draft_length: DraftLength | None = None
        self.draft_model: DraftModel | None = None
        self.draft_model_length: DraftLength | None = None
        # sampled decodes' draft sizing: (made from, its own)
        self._sampled_length: tuple[DraftLength, DraftLength] | None = None
        self.use_drafts(drafts)
        self._pool = pool
        self._lock = lock
        self._memory = memory
        self._parked: Run | None = None              # see Run
        self._prefill_chunk: int | None = None       # prompt tokens per forward cap
        self._token_texts: TokenTexts | None = None  # token healing's vocabulary index

    @property
    def config(self) -> Config:
        return self.settings.config

    @contextlib.contextmanager
    def between_requests(self) -> Iterator[None]:
        """Hold the generation lock for short background work (kernel re-timing). Sleeps 1 ms
        first so a waiting request takes the lock (threading.Lock is not fair)."""
        time.sleep(0.001)
        with self._lock:
            yield

    # -- for the pipeline (ModelPart) ------------------------------------------

    def scope(self, req: CompletionRequest) -> contextlib.AbstractContextManager[None]:
        """The memory scheduler's request scope: weights restored, pinned for ``priority: high``."""
        memory = self._memory
        return contextlib.nullcontext() if memory is None else memory.request(req.priority)

    def early(self, req: CompletionRequest, cancel: CancelToken, deadline: int | None,
              typed_through: bool) -> Source | None:
        """The foreseen answer for ``req``, or the parked run resumed; a parked run not resumed
        is closed."""
        parked, self._parked = self._parked, None
        foreseen = None if typed_through else self.foreseen.take(req)
        if parked is not None and not typed_through and foreseen is None:
            typed = parked.typed_by(req)
            if typed is not None:
                parked.adopt(req, typed, cancel, deadline)
                return Source(self._resume(parked), parked.ending, "resumed", prompt_tokens=parked.prompt_tokens)
        if parked is not None:
            parked.close()
        return None if foreseen is None else precomputed(foreseen)

    @contextlib.contextmanager
    def generating(self, req: CompletionRequest) -> Iterator[None]:
        """Hold the generation lock."""
        with self._lock:
            yield

    def generate(self, req: CompletionRequest, prompt: FimPrompt, candidate: int, ending: Ending,
                 cancel: CancelToken, deadline: int | None, *, keep_logp: bool = False,
                 reference: Sequence[int] = ()) -> Stream:
        """Decode one candidate on ``req``'s session, yielding the text after each step; a first
        line that repeats the line below is decoded again from the model's second choice
        (``completion.second_choice``). ``reference``: tokens to draft along. Inside
        :meth:`generating`."""
        session = self._session(req.uri)
        sampler = self._sampler(req, prompt, candidate)
        run, gen = yield from self._decode(req, prompt, session, sampler, ending, cancel, deadline, keep_logp,
                                           reference=reference)
        if not (self.config.completion.second_choice and run.finish == "stop" and not run.parked
                and req.n == 1 and sampler.greedy and ending.repeats_below(run.decode.current)):
            return gen
        first = run.decode
        line = self._first_line(first)
        left = req.max_tokens - len(first.tokens)     # max_tokens covers both decodes
        if left <= len(line) or cancel.cancelled or (deadline is not None and time.perf_counter_ns() >= deadline):
            return gen
        choice = second_choice(session, prompt.ids, line, self.template.stop_ids,
                               self._sampler(req, prompt, candidate) if prompt.heal else None,
                               precise_until(prompt))
        if choice is None:
            return gen
        log.info("second choice id=%s: the first line repeats the line below; again from token %d of %d "
                 "(log-odds %.2f)", req.id, choice.at, len(line), choice.gap)
        ending.restart()
        _, again = yield from self._decode(req, prompt, session, Replay(self._sampler(req, prompt, candidate),
                                                                        choice.tokens),
                                           ending, cancel, deadline, keep_logp, max_tokens=left)
        return dataclasses.replace(again, stats=_both(gen.stats, again.stats))

    def scorer(self) -> Scorer:
        """This part samples and ranks block candidates."""
        return self

    def texts(self, prompt: FimPrompt) -> Callable[[Sequence[int]], str]:
        """The text of tokens generated after ``prompt``, as an answer has it."""
        return Detok(self.tokenizer, prompt.heal).text

    def score(self, req: CompletionRequest, prompt: FimPrompt, ids: Sequence[int]) -> TokenScores:
        """:func:`token_scores` of ``ids`` after ``prompt`` on ``req``'s session. Inside
        :meth:`generating`."""
        return token_scores(self._session(req.uri), prompt.ids, ids, precise_until(prompt))

    def _sampler(self, req: CompletionRequest, prompt: FimPrompt, candidate: int) -> Sampler:
        sampler = make_sampler(req.temperature, req.top_p, None if req.seed is None else req.seed + candidate)
        if prompt.heal:
            sampler = HealingSampler(sampler, self.token_texts(), prompt.heal)
        return sampler

    def _first_line(self, decode: Detok) -> list[int]:
        """``decode``'s tokens through the one holding the first newline (all when none)."""
        for n in range(1, len(decode.tokens) + 1):
            if "\n" in decode.text(decode.tokens[:n]):
                return decode.tokens[:n]
        return list(decode.tokens)

    def _decode(self, req: CompletionRequest, prompt: FimPrompt, session: KVSession, sampler: Sampler,
                ending: Ending, cancel: CancelToken, deadline: int | None, keep_logp: bool,
                max_tokens: int | None = None,
                reference: Sequence[int] = ()) -> Generator[str, None, tuple[Run, Generation]]:
        """One decode of ``prompt`` on ``session``, yielding its text after each step; returns its
        run (parked or closed) and generation. Drafts along ``reference``, else the draft model
        (greedy), else prompt lookup."""
        decode = Detok(self.tokenizer, prompt.heal)
        logp: list[float] | None = [] if keep_logp else None   # asked for: as it decodes
        drafter: DraftProposer | None = None
        draft_length = self.draft_length
        cc = self.config.completion
        if cc.speculative:
            if reference:
                drafter = AlongReference(reference)
            elif sampler.greedy and self.draft_model is not None:
                drafter, draft_length = self.draft_model, self.draft_model_length
            else:
                drafter = PromptLookup()
            if not sampler.greedy and draft_length is not None:
                # sampled decodes accept drafts at their own rates
                if self._sampled_length is None or self._sampled_length[0] is not draft_length:
                    self._sampled_length = (draft_length, draft_length.fresh())
                draft_length = self._sampled_length[1]
        run = Run(req, cancel, deadline, decode, ending, len(prompt.ids), resumable=req.n == 1 and sampler.greedy)
        run.gen = generate(
            session, prompt.ids, sampler=sampler, stop_ids=self.template.stop_ids,
            max_tokens=req.max_tokens if max_tokens is None else max_tokens, cancelled=run.cancelled,
            should_stop=decode.stopper(ending.may_stop),
            deadline_ns=run.deadline, drafter=drafter,
            draft_k=cc.draft_tokens, draft_length=draft_length,
            precise_until=precise_until(prompt),
            logp=logp,
        )
        chunk = session.chunk
        if self._prefill_chunk is not None:
            session.chunk = min(chunk, self._prefill_chunk)
        try:
            for _ in self._drive(run):
                yield decode.current
        except Cancelled:
            run.finish = cancel.reason
        finally:
            session.chunk = chunk
            self._park_or_close(run, session)
        return run, Generation(decode.current, run.finish, _stats(run.stats, len(decode.tokens)),
                               tuple(decode.tokens), None if logp is None else tuple(logp))

    def recover(self, req: CompletionRequest, cancel: CancelToken, exc: Exception,
                streamed: bool, candidate: int) -> Iterator[Event] | None:
        """No fallback engine: re-raise."""
        return None

    def account(self, t: Timings) -> None:
        s = self.stats
        s.requests += 1
        s.prompt_tokens += t.prompt_tokens
        s.cached_tokens += t.cached_tokens
        s.draft_tokens += t.draft_tokens
        s.accepted_tokens += t.accepted_tokens
        s.resumed += t.source == "resumed"

    # -- for the engine and foresight ------------------------------------------

    def use_drafts(self, drafts: Drafts) -> None:
        """Draft with ``drafts`` from the next generation on."""
        self.draft_model, self.draft_length, self.draft_model_length = drafts.model, drafts.length, drafts.model_length
        self._sampled_length = None

    def warmed(self, drafts: Drafts) -> None:
        """Draft as the warm-up measured; reset the counters (warm-up requests are not counted)."""
        self.use_drafts(drafts)
        self.stats = EngineStats()

    def prefill(self, uri: str, ids: list[int], *, precise_until: int | None,
                cancel: CancelToken) -> PrefillResult | None:
        """Warm ``uri``'s session with ``ids`` under the lock; None when cancelled (a valid
        prefix stays)."""
        with self._lock:
            try:
                return self._session(uri).prefill(ids, cancelled=lambda: cancel.cancelled,
                                                  precise_until=precise_until)
            except Cancelled:
                return None

    @contextlib.contextmanager
    def prefill_chunks(self, tokens: int) -> Iterator[None]:
        """Inside, at most ``tokens`` prompt tokens per forward (bounds how long a cancel waits)."""
        saved, self._prefill_chunk = self._prefill_chunk, tokens
        try:
            yield
        finally:
            self._prefill_chunk = saved

    def forget(self) -> None:
        """Drop the parked run, the foreseen answer and every session's KV, as if just loaded."""
        with self._lock:
            self._drop_computed()

    def swap(self, apply: Callable[[], str | None]) -> str | None:
        """Run ``apply`` (a kernel change) between requests and return its answer; on success (None)
        drop everything computed (as :meth:`forget`) so no prompt mixes two kernels' bits."""
        with self.between_requests():
            why = apply()
            if why is None:
                self._drop_computed()
            return why

    def _drop_computed(self) -> None:
        if self._parked is not None:
            self._parked.close()
            self._parked = None
        self._pool.truncate_all()
        self.foreseen.clear()

    def token_texts(self) -> TokenTexts:
        """Every token's text, for token healing (built lazily)."""
        if self._token_texts is None:
            self._token_texts = TokenTexts(self.tokenizer)
        return self._token_texts

    # -- inside ----------------------------------------------------------------

    def _session(self, uri: str) -> KVSession:
        """``uri``'s KV session (lock held). Closes a parked run of another document: the pool may
        fold or recycle its session, and a resumed run needs exactly the KV it left."""
        if self._parked is not None and self._parked.req.uri != uri:
            self._parked.close()
            self._parked = None
        return self._pool.acquire(uri)

    def _park_or_close(self, run: Run, session: KVSession) -> None:
        if run.parked:
            run.park(session)
            self._parked = run
        else:
            run.close()

    def _drive(self, run: Run) -> Iterator[None]:
        """Pull ``run``'s events, yielding per step that adds text; mark it parked if superseded."""
        for ev in run.gen:
            run.stats = ev.stats
            if ev.tokens:
                run.decode.push(ev.tokens)
                yield
            if ev.finish_reason:
                run.finish = run.cancel.reason if ev.finish_reason == "cancelled" else ev.finish_reason
                return
            if run.should_park():
                run.parked = True
                run.finish = "superseded"
                return

    def _resume(self, run: Run) -> Stream:
        """Continue an adopted parked run: yield its text past what was typed, now and after each
        step; return its generation for this request. Parked again if superseded again."""
        with self._lock:
            session = self._session(run.req.uri)
            try:
                yield run.text()
                run.finish = "stop"
                try:
                    for _ in self._drive(run):
                        yield run.text()
                except Cancelled:
                    run.finish = run.cancel.reason
            finally:
                self._park_or_close(run, session)
        return Generation(run.text(), run.finish, Stats(generated_tokens=len(run.decode.tokens) - run.tokens_before))
