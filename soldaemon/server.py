"""``soldaemon serve``: the websocket server over one inference worker.

Layers, each a class below:

- :class:`Worker` — the one inference thread. It loads the engine, then runs
  jobs from a priority queue (``complete`` high, ``complete`` normal, then
  ``warm``) and hands every event back to the event loop with
  ``call_soon_threadsafe``. It never touches a socket.
- :class:`Connection` — one websocket: decodes frames with
  :mod:`soldaemon.protocol`, applies the rate limit, supersedes and cancels
  its own jobs, and writes frames in order through one writer task.
- :class:`Daemon` — what connections share: the worker, the job registry,
  metrics, the HTTP hook (auth, ``/healthz``, ``/metrics``), state and drain.
- :func:`serve` — start-up and shutdown; :func:`run` / :func:`run_status` are
  what the CLI calls.

Threads: the engine runs on the worker thread only; everything else runs on
the event loop thread. ``Engine.diagnosis`` and the optional
``Engine.debug_snapshots`` are called from the loop thread while a request
may be running, so engines must make them safe to call concurrently (they
read counters).

The protocol is docs/protocol.md; security is :mod:`soldaemon.auth`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import importlib
import itertools
import json
import logging
import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

import psutil
from websockets.asyncio.server import Server, ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.datastructures import Headers
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.http11 import Request, Response

from soldaemon import __version__, statefiles
from soldaemon.ahead import Ahead
from soldaemon.api import CancelToken, CompletionRequest, Delta, Done, Engine, FinishReason, Timings
from soldaemon.auth import (
    authorization_header,
    bearer_ok,
    check_bind,
    host_header_ok,
    load_or_create_token,
    origin_ok,
    read_token,
)
from soldaemon.config import is_loopback_host
from soldaemon.errors import (AddressInUse, Busy, DuplicateId, ModelError, ProtocolError, RateLimited, SolError,
                              Unavailable, UnknownId)
from soldaemon.fairness import allowed_priority, over_share, release_memory
from soldaemon.fairqueue import FairQueue
from soldaemon.handshake import RefusalLog, duplicated
from soldaemon.metrics import Metrics
from soldaemon.paths import state_dir
from soldaemon.protocol import (PROTOCOL_VERSION, Cancel, ClientMessage, Complete, CompletionEvent, Debug, ErrorFrame,
                                Health, Limits, Status, Warm, decode_client, decode_server, encode_client,
                                encode_server, error_frame)

if TYPE_CHECKING:
    from soldaemon.config import Config, ServerConfig

log = logging.getLogger("soldaemon.server")

DaemonState = Literal["loading", "ready", "draining"]
JobKind = Literal["complete", "warm"]
SOL_DIAGNOSIS_KEYS = ("active", "ttft_optimized", "prefetch_hit_rate", "kv_fold_ratio", "offloaded_layers")
WS_PATHS = ("/", "/v1")




# --------------------------------------------------------------------------
# Settings
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server needs, built once from ``config.server``."""

    host: str = "127.0.0.1"
    port: int = 8765                               # 0: any free port
    allow_remote: bool = False
    allowed_origins: tuple[str, ...] = ()
    token_path: Path = field(default_factory=lambda: state_dir() / "token")
    max_message_bytes: int = 1_048_576             # one frame, bytes
    rate_limit_per_s: float = 200.0                # frames/s per connection; burst = 2×
    drain_timeout_s: float = 5.0                   # s
    max_in_flight_per_connection: int = 32
    max_in_flight: int = 256
    max_outbox_frames: int = 20_000                # unread frames before a connection is closed
    max_outbox_bytes: int = 8 * 1024 * 1024        # unread bytes before a connection is closed
    max_connections: int = 64                      # more are refused (503) at the handshake

    @classmethod
    def from_config(cls, server: ServerConfig) -> ServerSettings:
        return cls(host=server.host, port=server.port, allow_remote=server.allow_remote,
                   allowed_origins=tuple(server.allowed_origins), token_path=server.token_path(),
                   max_message_bytes=server.max_message_bytes, rate_limit_per_s=server.rate_limit_per_s,
                   drain_timeout_s=server.drain_timeout_s)

    @property
    def limits(self) -> Limits:
        return Limits(max_message_bytes=self.max_message_bytes)


# --------------------------------------------------------------------------
# Jobs and the inference worker
# --------------------------------------------------------------------------

_PRIORITY = {("complete", "high"): 0, ("complete", "normal"): 1, ("warm", "high"): 2, ("warm", "normal"): 2}


@dataclass(eq=False)
class Job:
    """One ``complete`` or ``warm`` from arrival to its last frame.

    ``request.received_ns`` is the arrival (``perf_counter_ns``), stamped by
    :meth:`arrive`; the engine measures queue, TTFT, total and the budget
    from it. ``state`` moves queued → running → finished, guarded by the
    worker's lock (a queued job withdrawn by the loop goes straight to
    finished and the worker skips it). ``deliver`` is called on the event loop
    thread with each event, the last being a ``Done`` or an ``ErrorFrame``."""

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

    def timings_without_engine(self) -> Timings:
        """Timings for a job that ended before the engine saw it."""
        ms = self.age_ms()
        return Timings(queue_ms=ms, total_ms=ms, ttft_start_ns=self.arrival_ns)


class Worker:
    """The single inference thread.

    :meth:`start` runs ``load`` on the thread and resolves the returned future
    with the engine; the thread then serves jobs until :meth:`stop`. All
    methods except the thread's own loop are called from the event loop
    thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        # priority classes; round-robin between connections inside one (soldaemon.fairqueue)
        self._queue: FairQueue[Job] = FairQueue()
        self._lock = threading.Lock()
        self._queued = 0
        self._thread: threading.Thread | None = None
        self.engine: Engine | None = None
        self.ahead = Ahead()        # speculative FIM: runs only while the queue is empty

    @property
    def queue_depth(self) -> int:
        return self._queued

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
            self._queued += 1
        self.ahead.preempt()        # any request outranks speculation
        self._queue.put(_PRIORITY[(job.kind, job.request.priority)], job.owner, job)

    def withdraw(self, job: Job, reason: FinishReason) -> None:
        """Cancel ``job`` for ``reason`` (cancelled or superseded). A queued
        job ends now, here, without reaching the engine; a running one is
        stopped by the engine within one decode step."""
        with self._lock:
            was_queued = job.state == "queued"
            if was_queued:
                job.state = "finished"
                self._queued -= 1
        job.cancel.cancel(reason)
        if was_queued:
            job.deliver(job, Done(job.id, (), reason, job.timings_without_engine()))

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread after the job it is running (call after every job
        was withdrawn)."""
        self.ahead.preempt()
        self._queue.close()
        if self._thread is not None:
            self._thread.join(timeout)

    def _post(self, callback: Callable[..., None], *args: Any) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody listens
            self._loop.call_soon_threadsafe(callback, *args)

    def _serve(self, engine: Engine) -> None:
        while True:
            try:
                job = self._queue.get(block=not self.ahead.pending)
            except queue.Empty:     # idle with a speculation pending
                self.ahead.run(engine)
                continue
            self.ahead.preempt()
            if job is None:
                return
            with self._lock:
                if job.state != "queued":
                    continue
                job.state = "running"
                self._queued -= 1
            try:
                self._run(engine, job)
            finally:
                with self._lock:
                    job.state = "finished"

    def _run(self, engine: Engine, job: Job) -> None:
        queue_ms = job.age_ms()
        req = job.request
        if req.budget_ms is not None and queue_ms >= req.budget_ms:  # spent waiting: skip the prefill
            self._post(job.deliver, job, Done(job.id, (), "budget", job.timings_without_engine()))
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
                        self._post(job.deliver, job, self._final(job, event, queue_ms))
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
                done = Done(job.id, (), job.cancel.reason, job.timings_without_engine())
                self._post(job.deliver, job, done)
            else:
                if not isinstance(exc, SolError):
                    log.exception("engine failed on request %s", job.id)
                self._post(job.deliver, job, error_frame(exc, job.id))

    @staticmethod
    def _final(job: Job, done: Done, queue_ms: float) -> Done:
        reason = done.finish_reason
        if job.cancel.cancelled and reason in ("cancelled", "superseded"):
            reason = job.cancel.reason
        return Done(job.id, done.items, reason, _with_arrival(done.timings, job, queue_ms))


def _with_arrival(t: Timings, job: Job, queue_ms: float) -> Timings:
    """The engine measures from ``request.received_ns`` (the arrival); fill
    in what it left at zero (a ``warm`` reports no queue time or stamps)."""
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


# --------------------------------------------------------------------------
# One websocket connection
# --------------------------------------------------------------------------


class TokenBucket:
    """``rate`` events per second on average, bursts up to ``burst``."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.capacity = rate, burst
        self.tokens = burst
        self.stamp = time.monotonic()

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1.0:
            return False
        self.tokens -= 1.0
        return True


class Connection:
    """One client. Requests ids are scoped to the connection; so is
    supersession (same ``uri``, same connection)."""

    _ids = itertools.count(1)

    def __init__(self, daemon: Daemon, ws: ServerConnection) -> None:
        self.daemon = daemon
        self.ws = ws
        self.cid = next(self._ids)
        self.jobs: dict[str, Job] = {}
        self.open = True
        self._outbox: asyncio.Queue[str] = asyncio.Queue()
        self._outbox_bytes = 0                      # encoded size of the frames in _outbox
        self._closer: asyncio.Future[None] | None = None
        rate = daemon.settings.rate_limit_per_s
        self._bucket = TokenBucket(rate, max(1.0, 2.0 * rate))

    async def serve(self) -> None:
        """Run until the client goes away; then cancel everything it left."""
        writer = asyncio.create_task(self._write(), name=f"sol-writer-{self.cid}")
        try:
            self.send(Status("hello", self.daemon.hello_body()))
            while True:
                try:
                    data = await self.ws.recv(decode=False)
                except ConnectionClosed:
                    return
                self.handle(data)
        finally:
            self.open = False
            for job in list(self.jobs.values()):
                self.daemon.worker.withdraw(job, "cancelled")
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            piled_up = self._outbox_bytes
            while not self._outbox.empty():      # drop what the client never read
                self._outbox.get_nowait()
            self._outbox_bytes = 0
            if piled_up > 1024 * 1024:
                release_memory()

    def send(self, msg: Delta | Done | ErrorFrame | Status) -> None:
        """Queue a frame for the writer. A client that lets more than
        ``max_outbox_frames`` pile up is not reading: it is closed with 1008
        (its work is then cancelled like any disconnect)."""
        if not self.open:
            return
        frame = encode_server(msg)
        settings = self.daemon.settings
        if self._outbox.qsize() >= settings.max_outbox_frames or \
                self._outbox_bytes + len(frame) > settings.max_outbox_bytes:
            log.warning("connection %d: the client is not reading its frames (%d frames, %d bytes unread); "
                        "closing it", self.cid, self._outbox.qsize(), self._outbox_bytes)
            self.open = False
            self._closer = asyncio.ensure_future(self.ws.close(1008, "client is not reading its messages"))
            return
        self._outbox_bytes += len(frame)
        self._outbox.put_nowait(frame)

    async def flush(self, timeout: float) -> None:
        """Wait (bounded) until every queued frame was written."""
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._outbox.join(), timeout)

    async def _write(self) -> None:
        while True:
            frame = await self._outbox.get()
            self._outbox_bytes -= len(frame)
            try:
                await self.ws.send(frame)
            except ConnectionClosed:
                self.open = False
            finally:
                self._outbox.task_done()

    # -- inbound -----------------------------------------------------------

    def handle(self, data: bytes | str) -> None:
        """Answer one frame. Never raises: a bad frame gets an error frame
        (naming the frame's id when one could be read)."""
        allowed = self._bucket.take()  # every frame counts, valid or not
        request_id: str | None = None
        try:
            msg = decode_client(data, self.daemon.limits)
            request_id = _message_id(msg)
            if not allowed:
                raise RateLimited("too many messages on this connection; this one was dropped",
                                  hint=f"send at most {self.daemon.settings.rate_limit_per_s:g} per second")
            self.dispatch(msg)
        except SolError as exc:
            self.daemon.metrics.record_client_error(exc.code)
            self.send(error_frame(exc, request_id))
        except Exception as exc:  # a bug: log it, answer cleanly, keep serving
            log.exception("connection %d: failed to handle a frame", self.cid)
            self.send(error_frame(exc, request_id))

    def dispatch(self, msg: ClientMessage) -> None:
        if isinstance(msg, (Complete, Warm)):
            self.start(msg)
        elif isinstance(msg, Cancel):
            job = self.jobs.get(msg.id)
            if job is None:
                raise UnknownId("no request with this id is in flight on this connection",
                                request_id=msg.id)
            self.daemon.worker.withdraw(job, "cancelled")
        elif isinstance(msg, CompletionEvent):
            self.daemon.metrics.record_event(msg.kind)
        elif isinstance(msg, Health):
            self.send(Status("health", self.daemon.health_body(), msg.id))
        elif isinstance(msg, Debug):
            self.send(Status("debug", self.daemon.debug_body(msg.parts), msg.id))

    def start(self, msg: Complete | Warm) -> None:
        req = msg.request
        kind: JobKind = "complete" if isinstance(msg, Complete) else "warm"
        self.daemon.check_accepting()
        if req.id in self.jobs:
            raise DuplicateId("a request with this id is still in flight", request_id=req.id)
        limits = self.daemon.settings
        if len(self.jobs) >= limits.max_in_flight_per_connection or len(self.daemon.jobs) >= limits.max_in_flight \
                or over_share(len(self.jobs), len(self.daemon.jobs), self.daemon.active_connections(self.cid),
                              limits.max_in_flight):
            raise Busy("too many requests in flight", hint="cancel or wait for earlier requests")
        for old in list(self.jobs.values()):
            if old.request.uri == req.uri and (kind == "complete" or old.kind == "warm"):
                self.daemon.worker.withdraw(old, "superseded")
        high = sum(1 for j in self.jobs.values() if j.state == "queued" and j.request.priority == "high")
        if req.priority == "high" and allowed_priority("high", high) != "high":
            req = dataclasses.replace(req, priority="normal")
        job = Job.arrive(kind, req, self.deliver, owner=self.cid)
        self.jobs[req.id] = job
        self.daemon.track(job)
        self.daemon.worker.submit(job)

    # -- outbound (event loop thread, from the worker) ---------------------

    def deliver(self, job: Job, event: Delta | Done | ErrorFrame) -> None:
        if isinstance(event, Delta):
            if not job.cancel.cancelled:  # the client no longer wants it
                self.send(event)
            return
        if self.jobs.get(job.id) is job:
            del self.jobs[job.id]
        self.daemon.job_ended(self, job, event)
        self.send(event)


def _message_id(msg: ClientMessage) -> str | None:
    if isinstance(msg, (Complete, Warm)):
        return msg.request.id
    return msg.id


# --------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------


class Daemon:
    """State shared by all connections. Lives on the event loop thread."""

    def __init__(self, settings: ServerSettings, token: str, model_label: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
        self.limits = settings.limits
        self.token = token
        self.model_label = model_label
        self.machine: dict[str, Any] | None = None   # doctor.summarize() of the start-up checks
        self.worker = Worker(loop)
        self.state: DaemonState = "loading"
        self.connections: set[Connection] = set()
        self.jobs: set[Job] = set()
        self._idle = asyncio.Event()
        self._idle.set()
        self._started = time.monotonic()
        self.engine_info: dict[str, Any] = {}
        self._loopback = is_loopback_host(settings.host)
        self.refusals = RefusalLog(log.warning)   # failed handshakes, logged in aggregate
        self.metrics = Metrics(self._live, self._engine_stats)

    # -- state --------------------------------------------------------------

    def set_state(self, state: DaemonState) -> None:
        self.state = state
        log.info("state: %s", state)
        for conn in self.connections:
            conn.send(Status("state", {"state": state}))

    def check_accepting(self) -> None:
        if self.state == "loading":
            raise Unavailable("the model is still loading", hint="retry in a moment")
        if self.state == "draining":
            raise Unavailable("the daemon is shutting down", hint="reconnect after it restarts")

    async def load(self, load: Callable[[], Engine]) -> Engine:
        """Load the engine on the worker thread, logging progress."""
        t0 = time.monotonic()
        loaded = self.worker.start(load)
        while True:
            try:
                engine = await asyncio.wait_for(asyncio.shield(loaded), timeout=15.0)
                break
            except asyncio.TimeoutError:
                log.info("still preparing the model (%.0f s)…", time.monotonic() - t0)
        self.engine_info = _safe_call(engine.info)
        log.info("model ready in %.1f s: %s", time.monotonic() - t0, self.engine_info or self.model_label)
        self.set_state("ready")
        return engine

    # -- jobs ---------------------------------------------------------------

    def job_ended(self, conn: Connection, job: Job, event: Done | ErrorFrame) -> None:
        self.jobs.discard(job)
        if not self.jobs:
            self._idle.set()
        if isinstance(event, Done):
            self.metrics.record_done(job.kind, event)
            t = event.timings
            log.info("req conn=%d id=%s kind=%s outcome=%s queue=%.1fms prompt=%.1fms prefill=%.1fms "
                     "ttft=%.1fms decode=%.1fms total=%.1fms prompt_tokens=%d cached=%d generated=%d",
                     conn.cid, job.id, job.kind, event.finish_reason, t.queue_ms, t.prompt_ms, t.prefill_ms,
                     t.ttft_ms, t.decode_ms, t.total_ms, t.prompt_tokens, t.cached_tokens, t.generated_tokens)
        else:
            self.metrics.record_error(job.kind, event.code)
            log.info("req conn=%d id=%s kind=%s outcome=error:%s total=%.1fms", conn.cid, job.id, job.kind,
                     event.code, job.age_ms())

    def active_connections(self, asking: int) -> int:
        """Connections with work in flight, and ``asking`` (the fair share
        divides among them)."""
        return len({job.owner for job in self.jobs} | {asking})

    def track(self, job: Job) -> None:
        self.jobs.add(job)
        self._idle.clear()

    async def wait_idle(self, timeout: float) -> bool:
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except asyncio.TimeoutError:
            return False
        return True

    # -- bodies -------------------------------------------------------------

    def _live(self) -> Mapping[str, int]:
        return {"queue_depth": self.worker.queue_depth, "in_flight": len(self.jobs),
                "connections": len(self.connections)}

    def _engine_stats(self) -> Mapping[str, Any]:
        engine = self.worker.engine
        if engine is None:
            return {}
        return _safe_call(engine.diagnosis)

    def hello_body(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "daemon": __version__, "state": self.state,
                "model": self.engine_info.get("model", self.model_label),
                "limits": dataclasses.asdict(self.limits)}

    def health_body(self) -> dict[str, Any]:
        """The ``health`` status body and ``GET /healthz`` document."""
        diagnosis: dict[str, Any] | None = None
        counters: dict[str, Any] = {}
        if self.worker.engine is not None:
            raw = _safe_call(self.worker.engine.diagnosis)
            diagnosis = {key: raw.get(key) for key in SOL_DIAGNOSIS_KEYS}
            counters = {k: v for k, v in raw.items() if k not in SOL_DIAGNOSIS_KEYS}
        return {
            "state": self.state, "protocol": PROTOCOL_VERSION, "daemon": __version__,
            "sol_diagnosis": diagnosis,
            "device": self.engine_info.get("device"), "model": self.engine_info.get("model", self.model_label),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "engine": self.engine_info, "counters": counters,
            "machine": self.machine,
            "load": dict(self._live()),
            "process": {"pid": os.getpid(), "rss_bytes": psutil.Process().memory_info().rss,
                        "tasks": len(asyncio.all_tasks())},
        }

    def debug_body(self, parts: tuple[str, ...]) -> dict[str, Any]:
        """The engine's memory-scheduler snapshots (``debug_snapshots()``
        when the engine has it); empty objects otherwise."""
        snapshots: Mapping[str, Any] = {}
        engine = self.worker.engine
        get = getattr(engine, "debug_snapshots", None)
        if callable(get):
            snapshots = _safe_call(get)
        return {part: snapshots.get(part) or {} for part in parts}

    # -- HTTP hook (runs before the websocket upgrade) ------------------------

    def process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        """Authenticate every request; answer ``/healthz`` and ``/metrics``;
        let authenticated websocket upgrades on ``/`` or ``/v1`` through."""
        path = request.path.split("?", 1)[0]
        headers = request.headers
        if path not in WS_PATHS + ("/healthz", "/metrics"):
            return conn.respond(HTTPStatus.NOT_FOUND, "not found\n")
        if path in WS_PATHS and len(self.connections) >= self.settings.max_connections:
            self.refusals.refused("too many connections")
            return conn.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections; retry later\n")
        twice = duplicated(headers.get_all)
        if twice is not None:
            self.refusals.refused(f"duplicate {twice} header")
            return conn.respond(HTTPStatus.BAD_REQUEST, f"bad request: more than one {twice} header\n")
        if not host_header_ok(headers.get("Host"), self._loopback):
            self.refusals.refused("Host not loopback", repr(headers.get("Host"))[:80])
            return conn.respond(HTTPStatus.FORBIDDEN, "forbidden: Host is not a loopback name\n")
        if not origin_ok(headers.get("Origin"), self.settings.allowed_origins):
            self.refusals.refused("Origin not allowed", repr(headers.get("Origin"))[:80])
            return conn.respond(HTTPStatus.FORBIDDEN, "forbidden: Origin not allowed\n")
        if not bearer_ok(headers.get("Authorization"), self.token):
            self.refusals.refused("no valid token")
            response = conn.respond(HTTPStatus.UNAUTHORIZED,
                                    "unauthorized: send 'Authorization: Bearer <token>' "
                                    "(the token is in the daemon's token file)\n")
            response.headers["WWW-Authenticate"] = 'Bearer realm="soldaemon"'
            return response
        if path == "/healthz":
            body = self.health_body()
            status = HTTPStatus.OK if self.state == "ready" else HTTPStatus.SERVICE_UNAVAILABLE
            return _http(status, json.dumps(body).encode(), "application/json")
        if path == "/metrics":
            payload, content_type = self.metrics.render()
            return _http(HTTPStatus.OK, payload, content_type)
        if self.state == "draining":
            return conn.respond(HTTPStatus.SERVICE_UNAVAILABLE, "the daemon is shutting down\n")
        return None

    async def handler(self, ws: ServerConnection) -> None:
        conn = Connection(self, ws)
        self.connections.add(conn)
        try:
            await conn.serve()
        finally:
            self.connections.discard(conn)

    # -- shutdown -----------------------------------------------------------

    async def drain(self, server: Server) -> None:
        """Let in-flight work finish (bounded by ``drain_timeout_s``), cancel
        the rest, flush the last frames, close every connection with 1001."""
        self.set_state("draining")
        if self.jobs:
            log.info("draining %d request(s), up to %.1f s", len(self.jobs), self.settings.drain_timeout_s)
        if not await self.wait_idle(self.settings.drain_timeout_s):
            log.info("drain timeout: cancelling %d request(s)", len(self.jobs))
            for job in list(self.jobs):
                self.worker.withdraw(job, "cancelled")
            await self.wait_idle(2.0)
        await asyncio.gather(*(conn.flush(1.0) for conn in list(self.connections)))
        server.close(close_connections=True, code=1001, reason="soldaemon is shutting down")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5.0)


def _http(status: HTTPStatus, body: bytes, content_type: str) -> Response:
    headers = Headers([("Content-Type", content_type), ("Content-Length", str(len(body))),
                       ("Cache-Control", "no-store")])
    return Response(status.value, status.phrase, headers, body)


def _safe_call(fn: Callable[[], Mapping[str, Any]]) -> dict[str, Any]:
    try:
        return dict(fn())
    except Exception:
        log.exception("engine call %s failed", getattr(fn, "__name__", fn))
        return {}


# --------------------------------------------------------------------------
# Start-up and shutdown
# --------------------------------------------------------------------------


def ws_url(host: str, port: int) -> str:
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"


async def serve(settings: ServerSettings, load: Callable[[], Engine], model_label: str,
                *, ready_out: Any = None) -> int:
    """Run the daemon until SIGTERM/SIGINT; return the exit status.

    Order: check the bind address, create/read the token, bind the port
    (a taken port fails at once, before the slow model load), load the model
    on the worker thread, print the ready line, serve, drain. Raises
    :class:`SolError` for start-up problems."""
    check_bind(settings.host, settings.allow_remote)
    statefiles.ensure_state_dir()
    token = load_or_create_token(settings.token_path)
    loop = asyncio.get_running_loop()
    daemon = Daemon(settings, token, model_label, loop)
    # The machine checks of `soldaemon doctor` (GPU persistence mode, ECC,
    # driver/CUDA match, PCIe link, CPU): logged once, reported in health.
    from . import doctor

    checks = doctor.startup_checks()
    doctor.log_checks(checks, log)
    daemon.machine = doctor.summarize(checks)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        server = await ws_serve(
            daemon.handler, settings.host, settings.port,
            process_request=daemon.process_request, max_size=settings.max_message_bytes,
            compression=None, server_header=f"soldaemon/{__version__}", max_queue=64,
        )
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise AddressInUse(
                f"port {settings.port} on {settings.host} is already in use",
                hint="another soldaemon may be running (soldaemon status); or choose another port "
                     "with --port N or server.port (0 picks a free one)") from None
        raise Unavailable(f"cannot listen on {settings.host}:{settings.port}: {exc.strerror or exc}") from None
    daemon_file: Path | None = None
    try:
        port = server.sockets[0].getsockname()[1]  # type: ignore[index]
        url = ws_url(settings.host, port)
        log.info("listening on %s; preparing the model (%s)", url, model_label)
        loading = asyncio.ensure_future(daemon.load(load))
        stopping = asyncio.ensure_future(stop.wait())
        await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
        if not loading.done():
            log.info("interrupted while preparing the model")
            loading.cancel()
            stopping.cancel()
            return 130
        stopping.cancel()
        try:
            loading.result()
        except SolError:
            raise
        except Exception as exc:  # a loader bug: the log gets the traceback, the user a clean error
            log.error("model preparation failed", exc_info=exc)
            raise ModelError(f"could not prepare the model ({model_label}): {type(exc).__name__}: {exc}",
                             hint="see the log above; run with --log-level debug for more") from None
        daemon_file = statefiles.write_daemon_record(url, settings.token_path)
        info = daemon.engine_info
        print(f"soldaemon ready on {url} model={info.get('model', model_label)} "
              f"device={info.get('device', '?')} token file: {settings.token_path}",
              file=ready_out or sys.stdout, flush=True)
        await stop.wait()
        log.info("shutting down")
        await daemon.drain(server)
        return 0
    finally:
        server.close()  # idempotent: a no-op after drain
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        daemon.worker.stop(timeout=2.0)
        daemon.refusals.flush()
        if daemon_file is not None:
            statefiles.remove_daemon_record(daemon_file)
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


# --------------------------------------------------------------------------
# CLI entry points (wired by soldaemon.cli)
# --------------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``soldaemon serve`` (``--config`` is the CLI's)."""
    parser.add_argument("--host", help="listen address (default from config: 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port; 0 picks a free one (default from config: 8765)")
    parser.add_argument("--model", help="a local HF model directory or .gguf file (default: the embedded model)")
    parser.add_argument("--allow-remote", action="store_true", default=None,
                        help="allow listening on a non-loopback address")
    parser.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    # For tests and development: MODULE:FACTORY, called with the Config, returning an Engine.
    parser.add_argument("--engine", help=argparse.SUPPRESS)


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of ``soldaemon status``."""
    parser.add_argument("--url", help="the daemon's ws:// URL (default: the running daemon's, else from config)")
    parser.add_argument("--json", action="store_true", help="print the health document as JSON")
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for an answer")


def _overridden(config: Config, args: argparse.Namespace) -> Config:
    overrides: dict[str, object] = {}
    for arg, key in (("host", "server.host"), ("port", "server.port"), ("model", "model.path"),
                     ("allow_remote", "server.allow_remote")):
        value = getattr(args, arg, None)
        if value is not None:
            overrides[key] = value
    return config.with_overrides(overrides, source="command line") if overrides else config


def _engine_loader(args: argparse.Namespace, config: Config) -> tuple[Callable[[], Engine], str]:
    spec = getattr(args, "engine", None)
    if spec:
        module_name, _, attr = spec.partition(":")
        factory = getattr(importlib.import_module(module_name), attr or "make_engine")
        return (lambda: factory(config)), spec

    if config.backend.kind == "remote":
        from soldaemon.remote import Endpoint, load_remote_engine

        shown = Endpoint.parse(config.backend.url or "").shown
        return (lambda: load_remote_engine(config)), f"remote engine at {shown}"

    def load() -> Engine:
        try:
            from soldaemon.runtime.engine import load_engine
        except ImportError as exc:
            raise ModelError(f"the inference engine is not available: {exc}") from None
        return load_engine(config)

    return load, str(config.model.path) if config.model.path else "embedded Qwen2.5-Coder-0.5B"


def _setup_logging(level: str) -> None:
    root = logging.getLogger()
    if not root.handlers:
        logging.basicConfig(stream=sys.stderr, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("soldaemon").setLevel(level.upper())


def run(args: argparse.Namespace, config: Config) -> int:
    """``soldaemon serve``. Returns the exit status; raises :class:`SolError`
    for start-up problems (the CLI maps them to messages and exit codes)."""
    _setup_logging(getattr(args, "log_level", "info") or "info")
    config = _overridden(config, args)
    load, label = _engine_loader(args, config)
    return asyncio.run(serve(ServerSettings.from_config(config.server), load, label))


def _find_daemon(args: argparse.Namespace, config: Config) -> tuple[str, Path]:
    url = getattr(args, "url", None)
    token_path = config.server.token_path()
    if url is None:
        record = statefiles.read_daemon_record(allow_remote=config.server.allow_remote)
        if record is not None:
            url, token_path = record.url, record.token_path
    if url is None:
        url = ws_url(config.server.host, config.server.port)
    return url, token_path


async def query_health(url: str, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """Connect, ask ``health``, return the status body. Raises
    :class:`Unavailable` when no daemon answers."""
    from websockets.asyncio.client import connect

    try:
        async with asyncio.timeout(timeout):
            async with connect(url, additional_headers=[authorization_header(token)], proxy=None,
                               open_timeout=timeout, compression=None) as ws:
                await ws.send(encode_client(Health("status")))
                while True:
                    msg = decode_server(await ws.recv())
                    if isinstance(msg, Status) and msg.kind == "health":
                        return dict(msg.body)
    except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed, TimeoutError, ProtocolError) as exc:
        raise Unavailable(f"no soldaemon answering at {url} ({type(exc).__name__}: {exc})",
                          hint="start it with: soldaemon serve") from None


def _format_health(url: str, body: Mapping[str, Any]) -> str:
    diag = body.get("sol_diagnosis") or {}
    load = body.get("load") or {}
    proc = body.get("process") or {}
    lines = [
        f"soldaemon {body.get('daemon', '?')} is {body.get('state')} at {url} "
        f"(pid {proc.get('pid', '?')}, up {float(body.get('uptime_s', 0)):.0f} s)",
        f"  model:  {body.get('model')} on {body.get('device')}",
        "  sol:    " + (", ".join(f"{k}={diag.get(k)}" for k in SOL_DIAGNOSIS_KEYS) if diag else "(loading)"),
        f"  load:   {load.get('connections', 0)} connection(s), {load.get('in_flight', 0)} request(s) in flight, "
        f"queue {load.get('queue_depth', 0)}",
    ]
    return "\n".join(lines)


def run_status(args: argparse.Namespace, config: Config) -> int:
    """``soldaemon status``: print the running daemon's health. Raises
    :class:`Unavailable` when none answers."""
    url, token_path = _find_daemon(args, config)
    token = read_token(token_path)
    body = asyncio.run(query_health(url, token, getattr(args, "timeout", 5.0) or 5.0))
    print(json.dumps(body, indent=2) if getattr(args, "json", False) else _format_health(url, body))
    return 0
