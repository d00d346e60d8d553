"""The inference worker's lowest-priority work: speculative FIM.

After a ``complete`` ends with text, the worker may compute the completion
that follows accepting it (``Engine.speculate``, optional: engines without
it never speculate; the local engine's ``completion.speculative_fim``
turns it off). :class:`Ahead` holds that one piece of work between the
worker thread and the event loop:

- the worker :meth:`~Ahead.offer` s it when a completion ends, and
  :meth:`~Ahead.run` s it only when its queue is empty;
- every request that arrives :meth:`~Ahead.preempt` s it: a pending one is
  dropped, a running one is cancelled (reason ``superseded``) and stops
  within one engine step, so the request waits at most that long.

No job, id or frame: nobody waits for it, and it never reaches a client.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.errors import SolError

log = logging.getLogger("soldaemon.server.ahead")


class Ahead:
    """At most one speculation, pending or running (see the module doc).
    Thread-safe: :meth:`preempt` is called from the event loop thread,
    the rest from the worker thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: tuple[CompletionRequest, str] | None = None
        self._running: CancelToken | None = None
        self.runs = 0           # speculations started
        self.preempted = 0      # of which cancelled by a request

    @property
    def pending(self) -> bool:
        return self._pending is not None

    def offer(self, engine: Any, req: CompletionRequest, done: Done) -> None:
        """After ``done`` was delivered for ``req``: speculate on its first
        item next, unless the engine cannot or there is nothing to accept."""
        if (getattr(engine, "speculate", None) is None or done.finish_reason not in ("stop", "length")
                or not done.items or not done.items[0]):
            return
        with self._lock:
            self._pending = (req, done.items[0])

    def preempt(self) -> None:
        """A request arrived (or the worker stops): drop the pending
        speculation, cancel the running one."""
        with self._lock:
            self._pending = None
            running = self._running
        if running is not None and not running.cancelled:
            running.cancel("superseded")
            self.preempted += 1

    def run(self, engine: Any) -> None:
        """Run the pending speculation to its end or until :meth:`preempt`.
        Never raises: a failure is logged (nobody waits for the result)."""
        with self._lock:
            pending, self._pending = self._pending, None
            if pending is None:
                return
            cancel = self._running = CancelToken()
        self.runs += 1
        req, item = pending
        try:
            engine.speculate(req, item, cancel)
        except SolError as exc:     # e.g. the accepted prompt no longer fits the context
            log.debug("no speculation after request %s: %s", req.id, exc)
        except Exception:
            log.exception("speculation after request %s failed", req.id)
        finally:
            with self._lock:
                self._running = None
