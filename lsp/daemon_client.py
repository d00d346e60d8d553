"""The language server's side of the daemon's websocket API (docs/protocol.md): one
:class:`DaemonClient` per daemon, on the event loop thread."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import random
import time
from dataclasses import dataclass
from typing import Callable, Literal

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus, InvalidURI

from soldaemon.api import CompletionRequest, Delta, Done
from soldaemon.errors import ProtocolError, SolError, Unavailable
from soldaemon.protocol import Cancel, Complete, CompletionEvent, ErrorFrame, Status, Warm, decode_server, encode_client

from lsp.launcher import DaemonLauncher, Target

log = logging.getLogger("sol.lsp.daemon")

StatusState = Literal["connecting", "ready", "slow", "error"]
Answer = Done | ErrorFrame


@dataclass(frozen=True)
class StatusUpdate:
    """What ``sol/status`` carries."""

    state: StatusState
    message: str = ""
    url: str | None = None
    persistent: bool = False
    busy: bool = False              # the daemon is starting or loading its model ($/progress)


@dataclass
class _Pending:
    kind: Literal["complete", "warm"]
    future: asyncio.Future[Answer]
    sent: float                                     # perf_counter at send
    conn: int                                       # connection serial it was sent on
    on_delta: Callable[[Delta], None] | None = None


def unavailable(request_id: str, message: str = "not connected to soldaemon") -> ErrorFrame:
    return ErrorFrame(request_id, "unavailable", message, True, None)


class DaemonClient:
    """One websocket to the daemon, reconnecting with jittered exponential back-off.
    ``resolve`` finds the daemon (URL and token) before each attempt; ``launcher`` starts one,
    only once a request wanted it (:meth:`poke`). Status changes go to ``on_status``, each
    completion's round trip (ms) to ``on_latency``."""

    def __init__(self, resolve: Callable[[], Target], *,
                 on_status: Callable[[StatusUpdate], None] = lambda update: None,
                 on_latency: Callable[[float], None] = lambda ms: None,
                 launcher: DaemonLauncher | None = None,
                 backoff_initial_s: float = 0.25, backoff_max_s: float = 10.0,
                 connect_timeout_s: float = 3.0, failure_message_after_s: float = 10.0,
                 slow_ms: float = 1500.0) -> None:
        self._resolve = resolve
        self._on_status = on_status
        self._on_latency = on_latency
        self._launcher = launcher
        self.backoff_initial_s = backoff_initial_s
        self.backoff_max_s = max(backoff_initial_s, backoff_max_s)
        self.connect_timeout_s = connect_timeout_s
        self.failure_message_after_s = failure_message_after_s
        self.slow_ms = slow_ms
        self._ws: ClientConnection | None = None
        self._conn = 0                                   # serial of the current connection
        self._outbox: asyncio.Queue[str] | None = None
        self._pending: dict[str, _Pending] = {}
        self._cancelled: dict[str, float] = {}           # id → perf_counter when we sent cancel
        self._ids = itertools.count(1)
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._last_attempt = 0.0
        self._daemon_state = "loading"
        self._slow = False
        self._closing = False
        self.wanted = False                              # a request needed the daemon: may start one
        self._unanswered_poke = False                    # poked; the connection loop has not reported since
        self._changed = asyncio.Event()                  # set (and replaced) on every status change
        self.url: str | None = None
        self.last_status = StatusUpdate("connecting")

    def start(self) -> None:
        """Start connecting in the background (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sol-daemon-client")

    async def close(self) -> None:
        """Stop reconnecting and drop the connection (requests end ``unavailable``)."""
        self._closing = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._fail_pending("sol-lsp is shutting down")

    @property
    def ready(self) -> bool:
        """Whether the daemon is connected and accepts completions."""
        return self._ws is not None and self._daemon_state == "ready"

    def new_id(self, kind: str = "c", tag: str | None = None) -> str:
        """A request id unique on this client: ``c17``, or ``c17.lsp42`` with ``tag``."""
        base = f"{kind}{next(self._ids)}"
        return (f"{base}.lsp{tag}" if tag else base)[:128]

    def poke(self) -> None:
        """Mark the daemon wanted (one may be started from now on) and retry now if waiting out
        a back-off (at most once a second)."""
        first, self.wanted = not self.wanted, True
        if self._ws is None and (first or time.monotonic() - self._last_attempt >= 1.0):
            self._unanswered_poke = self._launcher is not None
            self._wake.set()

    async def wait_ready(self) -> bool:
        """Wait while a daemon is starting, loading its model or about to start: True once ready,
        False when none is coming."""
        while not self.ready:
            if not (self.last_status.busy or self._unanswered_poke):
                return False
            await self._changed.wait()
        return True

    async def complete(self, req: CompletionRequest, *, timeout_s: float | None = None,
                       on_delta: Callable[[Delta], None] | None = None) -> Answer:
        """Send ``complete`` and return its ``done`` or ``error`` (``timeout`` after ``timeout_s``).
        Answers ``unavailable`` at once while not ready. A cancelled or timed-out wait sends the
        daemon a ``cancel``."""
        pending = self._send(Complete(req), on_delta)
        if pending is None:
            self.poke()
            return unavailable(req.id, self._not_ready_reason())
        try:
            async with asyncio.timeout(timeout_s):
                answer = await pending.future
        except TimeoutError:
            log.info("request %s: no answer within %.0f ms; cancelling it", req.id, (timeout_s or 0) * 1000)
            answer = ErrorFrame(req.id, "timeout", f"no answer within {(timeout_s or 0) * 1000:.0f} ms",
                                True, None)
        finally:
            still = self._pending.pop(req.id, None)
            if still is not None:  # cancelled or timed out while the daemon works on it
                self._send_cancel(req.id, still.conn)
        self._observe(answer, (time.perf_counter() - pending.sent) * 1000)
        return answer

    def cancel(self, request_id: str) -> bool:
        """Cancel ``request_id`` on the daemon (its ``complete`` gets the done); False when not in
        flight."""
        pending = self._pending.get(request_id)
        if pending is None:
            return False
        self._send_cancel(request_id, pending.conn)
        return True

    def in_flight(self, kind: str = "complete") -> list[str]:
        """Ids of requests of ``kind`` sent and not yet answered."""
        return [rid for rid, p in self._pending.items() if p.kind == kind]

    def warm(self, req: CompletionRequest) -> bool:
        """Send ``warm`` (prefill only, fire and forget); False when not ready."""
        return self._send(Warm(req)) is not None

    def _send(self, frame: Complete | Warm, on_delta: Callable[[Delta], None] | None = None) -> _Pending | None:
        """Send ``frame`` and track its answer; None when not ready."""
        if not self.ready or self._outbox is None:
            return None
        kind: Literal["complete", "warm"] = "complete" if isinstance(frame, Complete) else "warm"
        pending = self._pending[frame.request.id] = _Pending(
            kind, asyncio.get_running_loop().create_future(), time.perf_counter(), self._conn, on_delta)
        self._outbox.put_nowait(encode_client(frame))
        return pending

    def event(self, event: CompletionEvent) -> bool:
        """Forward an editor event (fire and forget); False when not connected."""
        if self._ws is None or self._outbox is None:
            return False
        self._outbox.put_nowait(encode_client(event))
        return True

    def _send_cancel(self, request_id: str, conn: int) -> None:
        if conn != self._conn or self._outbox is None:
            return  # that connection is gone, and the daemon cancelled its work with it
        self._cancelled[request_id] = time.perf_counter()
        if len(self._cancelled) > 256:  # never answered (should not happen): bound the table
            for stale in list(self._cancelled)[:128]:
                del self._cancelled[stale]
        self._outbox.put_nowait(encode_client(Cancel(request_id)))

    def _observe(self, answer: Answer, elapsed_ms: float) -> None:
        """Report ``slow`` while the daemon's TTFT exceeds ``slow_ms``, ``ready`` once fast
        again; the round trip goes to ``on_latency``."""
        if isinstance(answer, ErrorFrame) and answer.code == "timeout":
            slow, ttft = True, elapsed_ms
        elif not isinstance(answer, Done) or answer.finish_reason in ("cancelled", "superseded"):
            return
        else:
            ttft = answer.timings.ttft_ms if answer.timings.generated_tokens > 0 else answer.timings.total_ms
            slow = ttft > self.slow_ms
            with contextlib.suppress(Exception):
                self._on_latency(elapsed_ms)
        if slow and not self._slow:
            self._slow = True
            self._status("slow", f"the daemon took {ttft:.0f} ms to its first token")
        elif not slow and self._slow:
            self._slow = False
            self._status("ready", "soldaemon ready")

    def _not_ready_reason(self) -> str:
        if self._ws is not None:
            return f"soldaemon is {self._daemon_state}"
        return self.last_status.message or "not connected to soldaemon"

    def _status(self, state: StatusState, message: str, *, persistent: bool = False, busy: bool = False) -> None:
        self._unanswered_poke = False
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()                                    # wait_ready looks again (also when nothing changed)
        update = StatusUpdate(state, message, self.url, persistent, busy)
        if update == self.last_status:
            return
        self.last_status = update
        with contextlib.suppress(Exception):
            self._on_status(update)

    async def _run(self) -> None:
        delay = self.backoff_initial_s
        outage = time.monotonic()
        self._status("connecting", "connecting to soldaemon")
        while True:
            self._wake.clear()
            self._last_attempt = time.monotonic()
            try:
                failure, refused = await self._attempt()
            except Exception as exc:  # a bug must not end the reconnect loop
                log.exception("connection attempt failed unexpectedly")
                failure, refused = f"internal error in sol-lsp: {type(exc).__name__}: {exc}", False
            if failure is None:  # we had a connection; it ended
                delay, outage = self.backoff_initial_s, time.monotonic()
                if self._closing:
                    return
                self._status("connecting", "reconnecting to soldaemon")
                await self._sleep(self.backoff_initial_s * random.uniform(0.5, 1.0))
                continue
            delay = self._after_failure(failure, refused, outage, delay)
            await self._sleep(delay * random.uniform(0.8, 1.2))
            delay = min(delay * 2, self.backoff_max_s)

    def _after_failure(self, failure: str, refused: bool, outage_since: float, delay: float) -> float:
        """Report a failed attempt, maybe start the daemon; the delay before the next."""
        launcher = self._launcher
        if launcher is not None and refused and not self.wanted and not launcher.other_starting:
            self._status("connecting",
                         "soldaemon is not running; it starts when a document in an enabled language opens")
            return delay
        if launcher is not None:
            if refused:
                launcher.start()
            problem = launcher.check() or launcher.error
            if launcher.starting:
                self._status("connecting", f"starting soldaemon… {launcher.stage() or 'preparing the model'}",
                             busy=True)
                return min(delay, 0.5)
            if not problem and launcher.other_starting:
                stage = launcher.stage()
                self._status("connecting", "another editor window is starting soldaemon…"
                             + (f" {stage}" if stage else ""), busy=True)
                return min(delay, 0.5)
            if problem:
                self._status("error", problem, persistent=True)
                return delay
        persistent = time.monotonic() - outage_since >= self.failure_message_after_s
        self._status("error", failure, persistent=persistent)
        return delay

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)

    async def _attempt(self) -> tuple[str | None, bool]:
        """One connection: ``(None, _)`` after one that worked, else ``(why it failed, whether
        nothing is listening)``."""
        t0 = time.perf_counter()
        try:
            target = self._resolve()
        except Unavailable as exc:  # no token file yet: no daemon ever started
            return f"{exc.message} ({exc.hint})" if exc.hint else exc.message, True
        except SolError as exc:
            return str(exc), False
        except OSError as exc:  # an unreadable token or config file
            return f"cannot read the daemon's settings: {exc}", False
        self.url = target.url
        try:
            ws = await connect(target.url, additional_headers=[("Authorization", f"Bearer {target.token}")],
                               open_timeout=self.connect_timeout_s, proxy=None, compression=None,
                               max_size=16 * 1024 * 1024, close_timeout=1.0, ping_interval=20.0)
        except InvalidStatus as exc:
            code = exc.response.status_code
            if code == 401:
                return f"soldaemon at {target.url} refused the token from {target.token_path} (401)", False
            return f"soldaemon at {target.url} answered HTTP {code}", False
        except TimeoutError:
            return f"soldaemon at {target.url} did not answer within {self.connect_timeout_s:g} s", False
        except OSError as exc:
            return f"no soldaemon at {target.url} ({target.source}): {exc.strerror or exc}", True
        except (InvalidHandshake, InvalidURI) as exc:
            return f"cannot connect to {target.url}: {exc}", False
        log.info("connected to %s (%s) in %.1f ms", target.url, target.source, (time.perf_counter() - t0) * 1000)
        if self._launcher is not None:
            self._launcher.ready()
        await self._serve(ws)
        return None, False

    async def _serve(self, ws: ClientConnection) -> None:
        self._conn += 1
        outbox: asyncio.Queue[str] = asyncio.Queue()
        writer = asyncio.get_running_loop().create_task(self._write(ws, outbox), name="sol-daemon-writer")
        self._daemon_state = "loading"
        self._ws, self._outbox = ws, outbox
        try:
            async for raw in ws:
                self._handle(raw)
        except ConnectionClosed:
            pass
        finally:
            self._ws, self._outbox = None, None
            self._daemon_state = "loading"
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            self._fail_pending("the connection to soldaemon was lost")
            self._cancelled.clear()
            with contextlib.suppress(Exception):
                await ws.close()
            log.info("disconnected from %s (close code %s)", self.url, ws.close_code)

    @staticmethod
    async def _write(ws: ClientConnection, outbox: asyncio.Queue[str]) -> None:
        with contextlib.suppress(ConnectionClosed):
            while True:
                await ws.send(await outbox.get())

    def _fail_pending(self, why: str) -> None:
        pending, self._pending = self._pending, {}
        for rid, p in pending.items():
            if not p.future.done():
                p.future.set_result(unavailable(rid, why))

    def _handle(self, raw: str | bytes) -> None:
        """Route one daemon frame; never raises (a bad frame is logged)."""
        try:
            msg = decode_server(raw)
            if isinstance(msg, Delta):
                pending = self._pending.get(msg.id)
                if pending is not None and pending.on_delta is not None:
                    pending.on_delta(msg)
            elif isinstance(msg, (Done, ErrorFrame)):
                self._finish(msg)
            elif isinstance(msg, Status):
                self._on_daemon_status(msg)
        except ProtocolError as exc:
            log.warning("ignoring a daemon frame: %s", exc.message)
        except Exception:
            log.exception("failed to handle a daemon frame")

    def _finish(self, msg: Answer) -> None:
        rid = msg.id or ""
        pending = self._pending.pop(rid, None)
        cancelled_at = self._cancelled.pop(rid, None)
        now = time.perf_counter()
        if isinstance(msg, ErrorFrame):
            if msg.code == "unknown_id" and cancelled_at is not None:
                log.debug("cancel of %s crossed its done", rid)
            elif pending is None:
                log.warning("daemon error%s: %s: %s", f" for {rid}" if rid else "", msg.code, msg.message)
            else:
                log.info("request %s (%s): daemon error %s: %s", rid, pending.kind, msg.code, msg.message)
        elif pending is not None:
            t = msg.timings
            cancel_ms = f" cancel→done={(now - cancelled_at) * 1000:.1f}ms" if cancelled_at is not None else ""
            log.info("daemon %s %s: finish=%s round_trip=%.1fms queue=%.1fms prefill=%.1fms ttft=%.1fms "
                     "decode=%.1fms total=%.1fms prompt_tokens=%d cached=%d generated=%d items=%d%s",
                     pending.kind, rid, msg.finish_reason, (now - pending.sent) * 1000, t.queue_ms, t.prefill_ms,
                     t.ttft_ms, t.decode_ms, t.total_ms, t.prompt_tokens, t.cached_tokens, t.generated_tokens,
                     len(msg.items), cancel_ms)
        elif cancelled_at is not None:
            log.info("daemon confirmed cancel of %s: finish=%s cancel→done=%.1fms",
                     rid, msg.finish_reason, (now - cancelled_at) * 1000)
        if pending is not None and not pending.future.done():
            pending.future.set_result(msg)

    def _on_daemon_status(self, msg: Status) -> None:
        if msg.kind not in ("hello", "state"):
            return
        state = str(msg.body.get("state", "ready"))
        self._daemon_state = state
        if msg.kind == "hello":
            log.info("daemon hello: protocol %s, daemon %s, model %s, state %s", msg.body.get("protocol"),
                     msg.body.get("daemon"), msg.body.get("model"), state)
        if state == "ready":
            self._slow = False
            self._status("ready", "soldaemon ready")
        elif state == "loading":
            self._status("connecting", "soldaemon is loading its model", busy=True)
        else:
            self._status("connecting", "soldaemon is shutting down")
