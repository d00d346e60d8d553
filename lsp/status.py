"""What the user sees of the daemon's state: ``sol/status``, one failure message per outage,
``$/progress`` while the daemon starts or loads, and completion round trips."""

from __future__ import annotations

import itertools
import logging
import statistics
import time
from collections import deque
from typing import Any, Protocol

import attrs
from lsprotocol import types

from lsp.daemon_client import StatusUpdate

log = logging.getLogger("sol.lsp")

SOL_STATUS = "sol/status"
MESSAGE_INTERVAL_S = 600.0      # at most one failure pop-up per this many seconds
LATENCY_WINDOW = 50             # completions the median is taken over


@attrs.define
class SolStatusParams:
    """Params of the ``sol/status`` notification."""

    state: str
    message: str = ""
    url: str | None = None
    lastMs: float | None = None       # noqa: N815 (the wire name) the last completion's round trip
    medianMs: float | None = None     # noqa: N815 the median of the last LATENCY_WINDOW
    withheld: str | None = None       # the secrets redacted from the last request sent ("notes.py: Private Key")


OPEN_LOG = "Open daemon log"
RUN_DOCTOR = "Run soldaemon doctor"
ACTIONS = (OPEN_LOG, RUN_DOCTOR)


class _Server(Protocol):
    """What the reporters use of the language server."""

    @property
    def protocol(self) -> Any: ...
    def window_show_message(self, params: types.ShowMessageParams) -> None: ...
    def error_action(self, title: str) -> None: ...


class Progress:
    """One ``$/progress`` bar at a time, titled "soldaemon" (none for a client that refuses the
    token). Event loop thread only."""

    _tokens = itertools.count(1)

    def __init__(self, server: _Server) -> None:
        self.server = server
        self.enabled = False           # set from the client's window.workDoneProgress
        self._token: str | None = None
        self._created = False          # the client answered the create request
        self._message = ""             # the latest message, sent once created
        self._sent = ""

    @property
    def active(self) -> bool:
        return self._token is not None

    def show(self, message: str) -> None:
        """Begin the bar, or report ``message`` on it."""
        if not self.enabled:
            return
        self._message = message
        if self._token is None:
            token = self._token = f"soldaemon-{next(self._tokens)}"
            self._created = False
            future = self.server.protocol.send_request(
                types.WINDOW_WORK_DONE_PROGRESS_CREATE, types.WorkDoneProgressCreateParams(token=token))
            future.add_done_callback(lambda f: self._on_created(token, f.exception()))
        elif self._created and message != self._sent:
            self._sent = message
            self._notify(self._token, types.WorkDoneProgressReport(message=message))

    def done(self, message: str) -> None:
        """End the bar (if any) with ``message``."""
        token, self._token = self._token, None
        if token is not None and self._created:
            self._notify(token, types.WorkDoneProgressEnd(message=message))
        self._created = False

    def _on_created(self, token: str, error: BaseException | None) -> None:
        """Begin the bar once the client accepted ``token``."""
        if token != self._token:            # ended before the client answered
            return
        if error is not None:
            log.info("the client refused a progress token: %s", error)
            self._token = None
            return
        self._created = True
        self._sent = self._message
        self._notify(token, types.WorkDoneProgressBegin(title="soldaemon", message=self._message))

    def _notify(self, token: str, value: Any) -> None:
        self.server.protocol.notify(types.PROGRESS, types.ProgressParams(token=token, value=value))


class StatusReporter:
    """Turns :class:`StatusUpdate` into ``sol/status`` (while ``enabled``), ``$/progress`` for
    ``busy`` ones, and at most one ``window/showMessageRequest`` per outage and per
    ``MESSAGE_INTERVAL_S``."""

    def __init__(self, server: _Server, progress: Progress | None = None) -> None:
        self.server = server
        self.progress = progress
        self.round_trips: deque[float] = deque(maxlen=LATENCY_WINDOW)   # of completions run on the daemon, ms
        self.last = StatusUpdate("connecting")
        self.enabled = False            # send sol/status (set from the client's declaration)
        self.withheld_text: str | None = None   # what the last request sent had redacted
        self._shown_this_outage = False
        self._last_shown = -MESSAGE_INTERVAL_S

    def __call__(self, update: StatusUpdate) -> None:
        log.info("status: %s %s", update.state, update.message)
        self.last = update
        self.notify()
        if self.progress is not None:
            if update.busy:
                self.progress.show(update.message)
            elif self.progress.active:
                self.progress.done(update.message)
        if update.state == "ready":
            self._shown_this_outage = False
            return
        now = time.monotonic()
        if update.persistent and not self._shown_this_outage and now - self._last_shown >= MESSAGE_INTERVAL_S:
            self._shown_this_outage = True
            self._last_shown = now
            self.ask(f"soldaemon completions are unavailable: {update.message}. "
                     "sol-lsp keeps retrying in the background.")

    def ask(self, message: str) -> None:
        """Send ``window/showMessageRequest`` with :data:`ACTIONS`."""
        future = self.server.protocol.send_request(
            types.WINDOW_SHOW_MESSAGE_REQUEST, types.ShowMessageRequestParams(
                type=types.MessageType.Error, message=message,
                actions=[types.MessageActionItem(title=t) for t in ACTIONS]))
        future.add_done_callback(self._answered)

    def _answered(self, future: Any) -> None:
        if future.cancelled() or future.exception() is not None:
            return
        choice = future.result()
        title = getattr(choice, "title", None) or (choice.get("title") if isinstance(choice, dict) else None)
        if title in ACTIONS:
            self.server.error_action(title)

    def notify(self) -> None:
        """Send ``sol/status`` for the current state (while ``enabled``)."""
        if not self.enabled:
            return
        u, times = self.last, self.round_trips
        self.server.protocol.notify(SOL_STATUS, SolStatusParams(
            u.state, u.message, u.url, round(times[-1], 1) if times else None,
            round(statistics.median(times), 1) if times else None, self.withheld_text))

    def withheld(self, what: str | None) -> None:
        """Tell the client when what the last request had redacted changes."""
        if what != self.withheld_text:
            self.withheld_text = what
            self.notify()

    def completed(self, round_trip_ms: float) -> None:
        """Record a completion's round trip and tell the client."""
        self.round_trips.append(round_trip_ms)
        self.notify()
