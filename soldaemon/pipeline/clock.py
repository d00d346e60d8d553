"""A request's clock and the one place its :class:`~soldaemon.api.Timings`
are built from it.

Every source of an answer -- the model, a resumed generation, type-through,
a speculative answer, a remote engine, a warm, a job the worker ended
before any engine saw it -- reports its figures through :meth:`Clock.timings`,
so that ``ttft_ms``, ``decode_ms`` and ``total_ms`` mean the same whoever
answered. Pure Python: no torch, no I/O.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from soldaemon.api import CompletionRequest, Timings


@dataclass(frozen=True)
class Clock:
    """When a request arrived and when the engine took it."""

    arrival: int        # perf_counter_ns when the server received it (or the engine took it)
    arrival_wall: int   # the same instant, time_ns
    start: int          # perf_counter_ns when the engine took it

    @classmethod
    def now(cls, req: CompletionRequest) -> Clock:
        """Taken by the engine now; arrived at ``req.received_ns`` (0: now)."""
        start = time.perf_counter_ns()
        arrival = req.received_ns or start
        return cls(arrival, time.time_ns() - (time.perf_counter_ns() - arrival), start)

    def deadline(self, req: CompletionRequest) -> int | None:
        """perf_counter_ns at which ``budget_ms`` runs out (None: no budget)."""
        return self.arrival + int(req.budget_ms * 1e6) if req.budget_ms else None

    def timings(self, *, first_ns: int | None = 0, first_wall_ns: int = 0, end_ns: int = 0,
                prompt_ms: float = 0.0, prefill_ms: float = 0.0, prompt_tokens: int = 0,
                cached_tokens: int = 0, generated_tokens: int = 0, draft_tokens: int = 0,
                accepted_tokens: int = 0, source: str = "model") -> Timings:
        """The request's timings, measured from its arrival to ``end_ns``
        (perf_counter_ns; 0: now).

        ``first_ns``: when the first token (or streamed text) came, 0 when
        none came (TTFT is then the whole time, decode 0); None when the
        request generates nothing by design (a warm: no TTFT at all).
        ``first_wall_ns``: the same instant in time_ns when it was stamped
        (0: derived from ``first_ns``)."""
        end = end_ns or time.perf_counter_ns()
        now_wall = time.time_ns()
        ttft_ms = decode_ms = 0.0
        ttft_end_ns = 0
        if first_ns is not None:
            first = first_ns or end
            ttft_ms = (first - self.arrival) / 1e6
            decode_ms = (end - first_ns) / 1e6 if first_ns else 0.0
            ttft_end_ns = first_wall_ns or (now_wall - (time.perf_counter_ns() - first))
        return Timings(
            queue_ms=(self.start - self.arrival) / 1e6, prompt_ms=prompt_ms, prefill_ms=prefill_ms,
            ttft_ms=ttft_ms, decode_ms=decode_ms, total_ms=(end - self.arrival) / 1e6,
            prompt_tokens=prompt_tokens, cached_tokens=cached_tokens, generated_tokens=generated_tokens,
            draft_tokens=draft_tokens, accepted_tokens=accepted_tokens, ttft_start_ns=self.arrival_wall,
            ttft_end_ns=ttft_end_ns, source=source)
