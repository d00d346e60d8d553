"""Jobs and the one inference thread, the only thread the engine runs on. It never touches
a socket: every event goes back to the event loop with ``call_soon_threadsafe``."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from soldaemon.server.ahead import Ahead
from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Engine, FinishReason, Timings
from soldaemon.errors import SolError
from soldaemon.server.fairqueue import FairQueue
from soldaemon.policy.priority import job_rank
from soldaemon.pipeline.clock import Clock
from soldaemon.protocol import ErrorFrame, error_frame
from soldaemon.runtime.memory.heap import HeapKeeper, return_free_heap

log = logging.getLogger("soldaemon.server")

HEAP_IDLE_S = 1.0   # idle this long after a request: the C heap's free pages go back (runtime/memory/heap.py)

JobKind = Literal["complete", "warm"]


@dataclass(eq=False)
class Job:
    """One ``complete`` or ``warm`` from arrival to its last frame. ``request.received_ns``
    (stamped by :meth:`arrive`) is what the engine measures from. ``state`` (queued → running →
    finished) is guarded by the worker's lock. ``deliver`` runs on the event loop thread; its last
    event is a ``Done`` or an ``ErrorFrame``."""

    kind: JobKind
    request: CompletionRequest
    deliver: Callable[[Job, Delta | Done | ErrorFrame], None]
    arrival_ns: int = 0                                            # time.time_ns() at arrival
    owner: int = 0                                                 # the connection's id (fair queueing)
    cancel: CancelToken = field(default_factory=CancelToken)
    state: Literal["queued", "running", "finished"] = "queued"

    @classmethod
    def arrive(cls, kind: JobKind, request: CompletionRequest,
               deliver: Callable[[Job, Delta | Done | ErrorFrame], None], owner: int = 0) -> Job:
        stamped = dataclasses.replace(request, received_ns=time.perf_counter_ns())
        return cls(kind, stamped, deliver, arrival_ns=time.time_ns(), owner=owner)

    @property
    def id(self) -> str:
        return self.request.id

    def age_ms(self) -> float:
        """Milliseconds since arrival."""
        return (time.perf_counter_ns() - self.request.received_ns) / 1e6

    def ended(self, reason: FinishReason) -> Done:
        """The ``Done`` of a job that ended without the engine's answer: its timings all queue time."""
        now = time.perf_counter_ns()
        return Done(self.id, (), reason, Clock(self.request.received_ns, self.arrival_ns, now).timings(
            first_ns=None, end_ns=now))


class Worker:
    """The single inference thread. :meth:`start` loads the engine there and resolves the
    returned future with it. Every method but the thread's loop runs on the event loop thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: FairQueue[Job] = FairQueue()
        self._lock = threading.Lock()
        self.queue_depth = 0        # jobs queued, not yet running (guarded by _lock)
        self._thread: threading.Thread | None = None
        self.engine: Engine | None = None
        self.heap_returns = 0       # times the C heap's free pages went back to the system
        self.heap = HeapKeeper()
        self.ahead = Ahead()        # the engine's work ahead (speculative FIM): runs only while the queue is empty

    def start(self, load: Callable[[], Engine]) -> asyncio.Future[Engine]:
        loaded: asyncio.Future[Engine] = self._loop.create_future()

        def main() -> None:
            try:
                engine = load()
            except BaseException as exc:  # reported through the future
                self._post(_resolve, loaded, None, exc)
                return
            self.engine = engine
            self._post(_resolve, loaded, engine, None)
            self._serve(engine)

        self._thread = threading.Thread(target=main, name="sol-inference", daemon=True)
        self._thread.start()
        return loaded

    def submit(self, job: Job) -> None:
        with self._lock:
            self.queue_depth += 1
        self.ahead.preempt()        # any request outranks speculation
        self._queue.put(job_rank(job.kind, job.request.priority), job.owner, job)

    def withdraw(self, job: Job) -> None:
        """Cancel ``job`` (the client cancelled it or went away)."""
        self._end(job, job.cancel.cancel)

    def supersede(self, job: Job) -> None:
        """Supersede ``job`` by a newer request for its document (the engine may park its work)."""
        self._end(job, job.cancel.supersede)

    def _end(self, job: Job, stop: Callable[[], None]) -> None:
        """Apply ``stop`` (a cancel-token operation): a queued job ends here without reaching the
        engine; a running one stops within one decode step."""
        with self._lock:
            was_queued = job.state == "queued"
            if was_queued:
                job.state = "finished"
                self.queue_depth -= 1
        stop()
        if was_queued:
            job.deliver(job, job.ended(job.cancel.reason))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after its current job (call once every job was withdrawn)."""
        self.ahead.preempt()
        self._queue.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            self._loop.call_soon_threadsafe(callback, *args)

    def _serve(self, engine: Engine) -> None:
        worked = True           # since the heap was last handed back (the load counts)
        while True:
            try:
                job = self._queue.get(block=not self.ahead.pending, timeout=HEAP_IDLE_S if worked else None)
            except queue.Empty:
                if self.ahead.pending:      # idle with work ahead pending
                    self.ahead.run()
                else:                       # idle for HEAP_IDLE_S after work
                    self.heap_returns += self.heap.returned(return_free_heap())
                    worked = False
                continue
            worked = True
            self.ahead.preempt()
            if job is None:
                return
            with self._lock:
                if job.state != "queued":
                    continue
                job.state = "running"
                self.queue_depth -= 1
            try:
                self._run(engine, job)
            finally:
                with self._lock:
                    job.state = "finished"
            self.heap_returns += self.heap.after_request()   # after the answer went out

    def _run(self, engine: Engine, job: Job) -> None:
        queue_ms = job.age_ms()
        req = job.request
        if req.budget_ms is not None and queue_ms >= req.budget_ms:  # spent waiting: skip the prefill
            self._post(job.deliver, job, job.ended("budget"))
            return
        try:
            if job.kind == "warm":
                timings = engine.warm(req, job.cancel)
                reason: FinishReason = job.cancel.reason if job.cancel.cancelled else "stop"
                self._post(job.deliver, job, Done(job.id, (), reason, _with_arrival(timings, job, queue_ms)))
                return
            events = engine.complete(req, job.cancel)
            try:
                for event in events:
                    if isinstance(event, Done):
                        timings = _with_arrival(event.timings, job, queue_ms)
                        self._post(job.deliver, job, dataclasses.replace(event, id=job.id, timings=timings))
                        if not job.cancel.cancelled:
                            self.ahead.offer(engine, req, event)
                        return
                    self._post(job.deliver, job, event)
            finally:
                close = getattr(events, "close", None)
                if close is not None:
                    close()
            log.error("engine ended request %s without a done event", job.id)
            self._post(job.deliver, job, error_frame(RuntimeError("no done"), job.id))
        except Exception as exc:
            if job.cancel.cancelled:
                log.debug("request %s raised after cancel: %r", job.id, exc)
                self._post(job.deliver, job, job.ended(job.cancel.reason))
            else:
                if not isinstance(exc, SolError):
                    log.exception("engine failed on request %s", job.id)
                self._post(job.deliver, job, error_frame(exc, job.id))


def _with_arrival(t: Timings, job: Job, queue_ms: float) -> Timings:
    """Fill in the arrival-based timings the engine left at zero (a ``warm`` reports none)."""
    return dataclasses.replace(
        t, queue_ms=t.queue_ms or queue_ms, total_ms=t.total_ms or job.age_ms(),
        ttft_start_ns=t.ttft_start_ns or job.arrival_ns)


def _resolve(fut: asyncio.Future[Engine], engine: Engine | None, exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        assert engine is not None
        fut.set_result(engine)
