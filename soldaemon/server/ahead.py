"""The worker's slot for lowest-priority work an engine names after a completion (its optional
``work_ahead(req, done)``; speculative FIM in :mod:`soldaemon.runtime.engine.foresight`).
It runs only when the queue is empty and any arriving request preempts it within one engine
step. No job, id or frame: it never reaches a client."""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.errors import SolError

log = logging.getLogger("soldaemon.server.ahead")


class Ahead:
    """At most one piece of work, pending or running. :meth:`preempt` is called from the event
    loop thread, the rest from the worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[str, Callable[[CancelToken], object]] | None = None   # (after request id, work)
        self._running: CancelToken | None = None

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def offer(self, engine: Any, req: CompletionRequest, done: Done) -> None:
        """Keep the work the engine's ``work_ahead`` names after ``done`` for ``req``, if any."""
        work_ahead = getattr(engine, "work_ahead", None)
        work = work_ahead(req, done) if work_ahead is not None else None
        if work is None:
            return
        with self._lock:
            self._pending = (req.id, work)

    def preempt(self) -> None:
        """Drop the pending work and supersede the running one (a request arrived, or shutdown)."""
        with self._lock:
            self._pending = None
            running = self._running
        if running is not None:
            running.supersede()

    def run(self) -> None:
        """Run the pending work to its end or until :meth:`preempt`. Never raises: failures are
        logged."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            cancel = self._running = CancelToken()
        after, work = pending
        try:
            work(cancel)
        except SolError as exc:     # e.g. the accepted prompt no longer fits the context
            log.debug("no work ahead after request %s: %s", after, exc)
        except Exception:
            log.exception("work ahead after request %s failed", after)
        finally:
            with self._lock:
                self._running = None
