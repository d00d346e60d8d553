"""Work the local engine does ahead of a request it can foresee (issue 16,
item 5); speculative FIM lives here whole.

- ``warm``: prefill the prompt the next ``complete`` at that place will use,
  so that the first suggestion after the user pauses somewhere new reuses
  the KV cache instead of prefilling a whole FIM prompt.
- speculative FIM (``completion.speculative_fim``, what llama.vscode calls
  speculative FIM): after a completion was delivered, compute the one the
  next request would get if the user accepts it (the prefix plus the
  completion, the same suffix), and keep it for that request. The decision
  (:func:`ahead_of`), the work (:func:`speculate`) and the kept answer
  (:class:`Foreseen`, owned by the model part, which answers from it) are
  here; the server's worker only gives the work its slot
  (:mod:`soldaemon.server.ahead`: run while the queue is empty, cancelled by
  any request).

Both go through the engine's own pipeline -- the same prompt construction
(anchor, windows, context, healing cut) and the same KV cache -- and both
must leave what the user later gets unchanged. So they run detached: on a
copy of the pipeline's per-document memory (the sticky anchor, the relevance
context's choice, the text shown for type-through), not counted
(:meth:`Pipeline.foresee`, ``Pipeline.build_prompt(detached=True)``). What
they share with real requests is result-neutral: the KV cache, whose values
depend on positions only (``precise_until``, see :meth:`KVSession.prefill`),
and the window memo (a pure cache).

The worker supersedes a speculation (``CancelToken.supersede``) as soon as any
request arrives; the model part checks the token before every decode step
and between prefill chunks, which :func:`speculate` keeps short
(:data:`AHEAD_CHUNK` tokens).
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
    """What foresight asks of the local model part
    (:class:`soldaemon.runtime.engine.part.LocalModelPart`) besides what
    the pipeline does."""

    foreseen: Foreseen

    def prefill(self, uri: str, ids: list[int], *, precise_until: int | None,
                cancel: CancelToken) -> PrefillResult | None: ...

    def prefill_chunks(self, tokens: int) -> ContextManager[None]: ...


def precise_until(prompt: FimPrompt) -> int | None:
    """Where the prompt's positions switch to decode-cost computation (the
    middle token, :meth:`KVSession.prefill`'s ``precise_until``); None: the
    prompt has no lead. Every prefill of a prompt must pass the same value,
    or a later reuse of its KV would change the answer."""
    return len(prompt.ids) - prompt.n_middle if prompt.n_middle else None


def warm(pipeline: Pipeline, part: AheadPart, req: CompletionRequest, cancel: CancelToken) -> Timings:
    """Prefill exactly the prompt ``complete(req)`` would compute now (the
    Engine protocol's ``warm``): the same prompt, built detached, the same
    ``precise_until``. Afterwards a ``complete`` with ``req``'s text
    computes nothing of its prompt (only its logits are re-read), one with
    a few characters typed since only those."""
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
    """The request that follows accepting ``item`` at ``req``: the same
    document, suffix, context and options, ``item`` appended to the prefix;
    None when there is nothing to foresee (empty item, sampling, several
    candidates)."""
    if not item or req.n != 1 or req.temperature > 0:
        return None
    return dataclasses.replace(req, id=f"{req.id}~ahead", prefix=req.prefix + item, version=None,
                               budget_ms=None, priority="normal", received_ns=0)


def ahead_of(config: CompletionConfig, req: CompletionRequest, done: Done) -> CompletionRequest | None:
    """The decision, after ``done`` was delivered for ``req``: the request
    to compute ahead (:func:`accepted_request` of its first item), or None
    when ``completion.speculative_fim`` is off or there is nothing to accept
    (no whole answer, no text)."""
    if not config.speculative_fim or done.finish_reason not in ("stop", "length") or not done.items:
        return None
    return accepted_request(req, done.items[0])


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


def speculate(pipeline: Pipeline, part: AheadPart, ahead: CompletionRequest, cancel: CancelToken) -> Done | None:
    """Compute ``ahead`` (from :func:`ahead_of`) with ``pipeline`` over the
    model part, detached (:meth:`Pipeline.foresee`), and keep its answer in
    ``part.foreseen`` when it finished; returns its ``Done``. Cancelled
    (``cancel``) it returns within one decode step or :data:`AHEAD_CHUNK`
    prefill tokens; superseded (``cancel.supersede()``) after its first token, the
    generation is parked, so the accepted request may still resume it."""
    part.foreseen.clear()
    if cancel.cancelled:
        return None
    with part.prefill_chunks(AHEAD_CHUNK):
        done = pipeline.foresee(ahead, cancel, part)
    if done is not None and done.finish_reason in ("stop", "length") and not cancel.cancelled:
        part.foreseen.keep(ahead, done)
    return done
