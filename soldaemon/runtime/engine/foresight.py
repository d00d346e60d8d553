"""Work the engine does ahead of a request it can foresee (issue 16, item 5).

- ``warm``: prefill the prompt the next ``complete`` at that place will use,
  so that the first suggestion after the user pauses somewhere new reuses
  the KV cache instead of prefilling a whole FIM prompt.
- speculative FIM (``completion.speculative_fim``, what llama.vscode calls
  speculative FIM): after a completion was delivered, compute the one the
  next request would get if the user accepts it (the prefix plus the
  completion, the same suffix), and keep it for that request.

Both go through the engine's own pipeline -- the same prompt construction
(anchor, windows, context, healing cut) and the same KV cache -- and both
must leave what the user later gets unchanged. So they run
:func:`detached`: on copies of the engine's per-document memory (the sticky
anchor, the relevance context's choice, the text shown for type-through)
and of its counters. What they share with real requests is result-neutral:
the KV cache, whose values depend on positions only (``precise_until``, see
:meth:`KVSession.prefill`), and the window memo (a pure cache).

The server's worker runs speculation when its queue is empty and cancels it
(reason ``superseded``) as soon as any request arrives; the engine checks the
token before every decode step and between prefill chunks, which
:func:`speculate` keeps short (:data:`AHEAD_CHUNK` tokens).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import TYPE_CHECKING, Iterator

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Event, Timings
from soldaemon.fim import FimPrompt
from soldaemon.errors import Cancelled

if TYPE_CHECKING:
    from soldaemon.runtime.engine.local import LocalEngine

AHEAD_CHUNK = 32     # tokens per prefill chunk while speculating: the longest wait a real request has


def precise_until(prompt: FimPrompt) -> int | None:
    """Where the prompt's positions switch to decode-cost computation (the
    middle token, :meth:`KVSession.prefill`'s ``precise_until``); None: the
    prompt has no lead. Every prefill of a prompt must pass the same value,
    or a later reuse of its KV would change the answer."""
    return len(prompt.ids) - prompt.n_middle if prompt.n_middle else None


@contextlib.contextmanager
def detached(engine: LocalEngine) -> Iterator[None]:
    """Inside: the engine's sticky anchors, context choice, shown texts and
    counters are copies, so whatever runs leaves no trace in what later
    requests get; after: the originals are back (also when it raised).
    Called on the worker thread; ``diagnosis`` readers meanwhile see a copy
    of the same counters."""
    saved = engine.stats
    engine.stats = dataclasses.replace(engine.stats)
    try:
        with engine.pipeline.detached():
            yield
    finally:
        engine.stats = saved


def warm(engine: LocalEngine, req: CompletionRequest, cancel: CancelToken) -> Timings:
    """Prefill exactly the prompt ``engine.complete(req)`` would compute now
    (the Engine protocol's ``warm``): the same prompt, the same
    ``precise_until``, built :func:`detached`. Afterwards a ``complete``
    with ``req``'s text computes nothing of its prompt (only its logits
    are re-read), one with a few characters typed since only those."""
    t0 = req.received_ns or time.perf_counter_ns()
    with detached(engine):
        prompt, prompt_ms = engine.build_prompt(req)
    t1 = time.perf_counter_ns()
    with engine.memory_scope(req), engine._lock:
        engine.session = engine.pool.acquire(req.uri)
        try:
            pre = engine.session.prefill(prompt.ids, cancelled=lambda: cancel.cancelled,
                                         precise_until=precise_until(prompt))
        except Cancelled:
            return Timings(prompt_ms=prompt_ms, prompt_tokens=len(prompt.ids))
    t2 = time.perf_counter_ns()
    return Timings(prompt_ms=prompt_ms, prefill_ms=(t2 - t1) / 1e6, total_ms=(t2 - t0) / 1e6,
                   prompt_tokens=len(prompt.ids), cached_tokens=pre.cached)


def accepted_request(req: CompletionRequest, item: str) -> CompletionRequest | None:
    """The request that follows accepting ``item`` at ``req``: the same
    document, suffix, context and options, ``item`` appended to the prefix;
    None when there is nothing to foresee (empty item, sampling, several
    candidates)."""
    if not item or req.n != 1 or req.temperature > 0:
        return None
    return dataclasses.replace(req, id=f"{req.id}~ahead", prefix=req.prefix + item, version=None,
                               budget_ms=None, priority="normal", received_ns=0)


def _key(req: CompletionRequest) -> CompletionRequest:
    """What a request's answer depends on (not its id, timing or priority)."""
    return dataclasses.replace(req, id="", version=None, budget_ms=None, priority="normal", received_ns=0)


class Foreseen:
    """The last speculative answer: the accepted request and its ``Done``.
    One entry; :meth:`take` empties it whatever it returns, so only the
    request right after the speculation can be answered from it (later, the
    engine's per-document state may have moved on)."""

    def __init__(self) -> None:
        self._entry: tuple[CompletionRequest, Done] | None = None

    def keep(self, req: CompletionRequest, done: Done) -> None:
        self._entry = (_key(req), done)

    def clear(self) -> None:
        self._entry = None

    def take(self, req: CompletionRequest) -> Done | None:
        """The kept answer when ``req`` asks what it answers, else None."""
        entry, self._entry = self._entry, None
        if entry is None or entry[0] != _key(req):
            return None
        return entry[1]


def foreseen_events(req: CompletionRequest, done: Done, arrival: int, t_start: int) -> tuple[Delta | None, Done]:
    """``req``'s answer from a speculative ``done``: its first item as one
    delta, and a done with ``source: speculative`` (every prompt token
    counted cached: nothing was computed for this request)."""
    now = time.perf_counter_ns()
    ms = (now - arrival) / 1e6
    t = done.timings
    timings = Timings(queue_ms=(t_start - arrival) / 1e6, ttft_ms=ms, total_ms=ms,
                      prompt_tokens=t.prompt_tokens, cached_tokens=t.prompt_tokens,
                      generated_tokens=t.generated_tokens, ttft_start_ns=time.time_ns() - (now - arrival),
                      ttft_end_ns=time.time_ns(), source="speculative")
    delta = Delta(req.id, done.items[0]) if done.items and done.items[0] else None
    return delta, Done(req.id, done.items, done.finish_reason, timings)


def speculate(engine: LocalEngine, req: CompletionRequest, item: str, cancel: CancelToken) -> Done | None:
    """Compute the completion that follows accepting ``item`` at ``req``
    (see :func:`accepted_request`) :func:`detached`, and keep it in
    ``engine.foreseen`` when it finished; returns its ``Done``, or None
    when there was nothing to foresee. Cancelled (``cancel``) it returns
    within one decode step or :data:`AHEAD_CHUNK` prefill tokens; cancelled
    as ``superseded`` after its first token, the generation is parked, so
    the accepted request may still resume it."""
    ahead = accepted_request(req, item)
    engine.foreseen.clear()
    if ahead is None or cancel.cancelled:
        return None
    with engine._lock:
        session = engine.pool.acquire(req.uri)
    chunk, session.chunk = session.chunk, min(session.chunk, AHEAD_CHUNK)
    done: Done | None = None
    try:
        with detached(engine):
            for event in engine.complete(ahead, cancel):
                if isinstance(event, Done):
                    done = event
    finally:
        session.chunk = chunk
    if done is not None and done.finish_reason in ("stop", "length") and not cancel.cancelled:
        engine.foreseen.keep(ahead, done)
    return done


def answer_foreseen(engine: LocalEngine, req: CompletionRequest, arrival: int, t_start: int) -> Iterator[Event] | None:
    """The events answering ``req`` from the kept speculation, or None when
    it does not ask for it (the kept answer is dropped either way). Its
    Done is finished by the pipeline (:meth:`Pipeline.finish`)."""
    done = engine.foreseen.take(req)
    if done is None:
        return None
    delta, final = foreseen_events(req, done, arrival, t_start)

    def events() -> Iterator[Event]:
        if delta is not None:
            yield delta
        yield final      # the pipeline counts and remembers it

    return events()
