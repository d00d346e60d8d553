"""The inference worker's slot for lowest-priority work (speculative FIM).

After a ``complete`` was delivered, the engine may name work to do next
(``work_ahead(req, done)``, optional: engines without it never do any; the
local engine decides and does speculative FIM in
:mod:`soldaemon.runtime.engine.foresight`). :class:`Ahead` holds that one
piece of work between the worker thread and the event loop:

- the worker :meth:`~Ahead.offer` s it when a completion ends, and
  :meth:`~Ahead.run` s it only when its queue is empty;
- every request that arrives :meth:`~Ahead.preempt` s it: a pending one is
  dropped, a running one is superseded (``CancelToken.supersede``) and stops
  within one engine step, so the request waits at most that long.

No job, id or frame: nobody waits for it, and it never reaches a client.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.errors import SolError

log = logging.getLogger("soldaemon.server.ahead")


class Ahead:
    """At most one piece of work, pending or running (see the module doc).
    Thread-safe: :meth:`preempt` is called from the event loop thread,
    the rest from the worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[str, Callable[[CancelToken], object]] | None = None   # (after request id, work)
        self._running: CancelToken | None = None
        self.runs = 0           # pieces of work started
        self.preempted = 0      # of which cancelled by a request

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def offer(self, engine: Any, req: CompletionRequest, done: Done) -> None:
        """After ``done`` was delivered for ``req``: keep the work the
        engine names for next (its ``work_ahead``), if any."""
        work_ahead = getattr(engine, "work_ahead", None)
        work = work_ahead(req, done) if work_ahead is not None else None
        if work is None:
            return
        with self._lock:
            self._pending = (req.id, work)

    def preempt(self) -> None:
        """A request arrived (or the worker stops): drop the pending
        speculation, cancel the running one."""
        with self._lock:
            self._pending = None
            running = self._running
        if running is not None and not running.cancelled:
            running.supersede()
            self.preempted += 1

    def run(self) -> None:
        """Run the pending work to its end or until :meth:`preempt`.
        Never raises: a failure is logged (nobody waits for the result)."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            cancel = self._running = CancelToken()
        self.runs += 1
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
