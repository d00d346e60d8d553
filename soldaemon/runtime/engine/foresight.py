"""Work the local engine does ahead of a foreseeable request: ``warm`` (prefill the next
prompt) and speculative FIM (compute the answer after the user accepts one; the server's
:mod:`soldaemon.server.ahead` only gives it a slot). Both run detached, on a copy of the
pipeline's per-document memory, so they never change what the user later gets; they share
only the KV cache, whose values depend on positions alone, and the window memo.
"""

from __future__ import annotations

import dataclasses
import time
from typing import ContextManager, Protocol

from soldaemon.api import CancelToken, CompletionRequest, Done, Timings
from soldaemon.config.sections import CompletionConfig
from soldaemon.fim import FimPrompt
from soldaemon.pipeline.clock import Clock
from soldaemon.pipeline.completion import ModelPart, Pipeline
from soldaemon.runtime.kv.session import PrefillResult

AHEAD_CHUNK = 32     # tokens per prefill chunk while speculating: the longest wait a real request has


class AheadPart(ModelPart, Protocol):
    """What foresight asks of the local model part beyond what the pipeline does."""

    foreseen: Foreseen

    def prefill(self, uri: str, ids: list[int], *, precise_until: int | None,
                cancel: CancelToken) -> PrefillResult | None: ...

    def prefill_chunks(self, tokens: int) -> ContextManager[None]: ...


def precise_until(prompt: FimPrompt) -> int | None:
    """:meth:`KVSession.prefill`'s ``precise_until`` for ``prompt`` (None: no lead). Every
    prefill of a prompt must pass the same value, or reusing its KV would change the answer."""
    return len(prompt.ids) - prompt.n_middle if prompt.n_middle else None


def warm(pipeline: Pipeline, part: AheadPart, req: CompletionRequest, cancel: CancelToken) -> Timings:
    """Prefill exactly the prompt ``complete(req)`` would compute now (built detached, the
    same ``precise_until``), so that request then computes none of its prompt."""
    clock = Clock.now(req)
    prompt, prompt_ms = pipeline.build_prompt(req, detached=True)
    t1 = time.perf_counter_ns()
    with part.scope(req):
        pre = part.prefill(req.uri, prompt.ids, precise_until=precise_until(prompt), cancel=cancel)
    if pre is None:     # cancelled
        return clock.timings(first_ns=None, prompt_ms=prompt_ms, prompt_tokens=len(prompt.ids))
    t2 = time.perf_counter_ns()
    return clock.timings(first_ns=None, end_ns=t2, prompt_ms=prompt_ms, prefill_ms=(t2 - t1) / 1e6,
                         prompt_tokens=len(prompt.ids), cached_tokens=pre.cached)


def accepted_request(req: CompletionRequest, item: str) -> CompletionRequest | None:
    """``req`` with ``item`` appended to its prefix; None for an empty item, sampling or
    several candidates."""
    if not item or req.n != 1 or req.temperature > 0:
        return None
    return dataclasses.replace(_key(req), id=f"{req.id}~ahead", prefix=req.prefix + item)


def ahead_of(config: CompletionConfig, req: CompletionRequest, done: Done) -> CompletionRequest | None:
    """The request to compute ahead after ``done`` for ``req`` (accepting its first item), or
    None when ``completion.speculative_fim`` is off or there is no whole answer."""
    if not config.speculative_fim or done.finish_reason not in ("stop", "length") or not done.items:
        return None
    return accepted_request(req, done.items[0])


def _key(req: CompletionRequest) -> CompletionRequest:
    """What a request's answer depends on (not its id, timing or priority)."""
    return dataclasses.replace(req, id="", version=None, budget_ms=None, priority="normal", received_ns=0)


class Foreseen:
    """The last speculative answer. :meth:`take` empties it whatever it returns: only the
    request right after the speculation may be answered from it."""

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


def speculate(pipeline: Pipeline, part: AheadPart, ahead: CompletionRequest, cancel: CancelToken) -> Done | None:
    """Compute ``ahead`` detached and keep a finished answer in ``part.foreseen``; returns its
    Done. Cancelled, it returns within one decode step or :data:`AHEAD_CHUNK` prefill tokens;
    superseded after its first token, the generation is parked for the request to resume."""
    part.foreseen.clear()
    if cancel.cancelled:
        return None
    with part.prefill_chunks(AHEAD_CHUNK):
        done = pipeline.foresee(ahead, cancel, part)
    if done is not None and done.finish_reason in ("stop", "length") and not cancel.cancelled:
        part.foreseen.keep(ahead, done)
    return done
