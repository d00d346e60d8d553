"""One websocket connection: decode, rate limit, supersede and cancel its own jobs, and write
frames in order through one writer task. It sees the daemon only through :class:`Hub`
(:mod:`.daemon` imports this module, not the other way round).

Sharing the daemon (queue order is :mod:`.fairqueue`): above half of ``max_in_flight`` a
connection over its share is refused ``busy``, so a newcomer always gets in; ``high`` priority
is the client's word, capped at :data:`MAX_HIGH_QUEUED` queued per connection."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import itertools
import logging
import time
from typing import Any, Protocol

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from soldaemon.api import Delta, Done
from soldaemon.errors import Busy, DuplicateId, RateLimited, SolError, UnknownId
from soldaemon.protocol import (Cancel, ClientMessage, Complete, CompletionEvent, Debug, ErrorFrame, Health, Status,
                                Warm, decode_client, encode_server, error_frame)
from soldaemon.runtime.memory.heap import return_free_heap
from soldaemon.server.metrics import Metrics
from soldaemon.server.settings import ServerSettings
from soldaemon.server.worker import Job, JobKind, Worker

log = logging.getLogger("soldaemon.server")

MIN_SHARE = 4          # requests a connection may always hold above half load
MAX_HIGH_QUEUED = 2    # high-priority requests queued per connection


class Hub(Protocol):
    """What a connection uses of the shared :class:`soldaemon.server.daemon.Daemon`."""

    settings: ServerSettings
    worker: Worker
    metrics: Metrics
    jobs: set[Job]

    def check_accepting(self) -> None: ...
    def active_connections(self, asking: int) -> int: ...
    def track(self, job: Job) -> None: ...
    def job_ended(self, conn: Connection, job: Job, event: Done | ErrorFrame) -> None: ...
    def hello_body(self) -> dict[str, Any]: ...
    def health_body(self) -> dict[str, Any]: ...
    def debug_body(self, parts: tuple[str, ...]) -> dict[str, Any]: ...


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
    """One client. Request ids and supersession (same ``uri``) are scoped to the connection."""

    _ids = itertools.count(1)

    def __init__(self, daemon: Hub, ws: ServerConnection) -> None:
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
                self.daemon.worker.withdraw(job)
            writer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await writer
            piled_up = self._outbox_bytes
            self._outbox = asyncio.Queue()      # drop what the client never read
            self._outbox_bytes = 0
            if piled_up > 1024 * 1024:   # the unread frames must not stay in the process
                gc.collect()
                return_free_heap()

    def send(self, msg: Delta | Done | ErrorFrame | Status) -> None:
        """Queue a frame for the writer. A client with more than ``max_outbox_frames`` (or
        ``max_outbox_bytes``) unread is closed with 1008, which cancels its work."""
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

    def handle(self, data: bytes | str) -> None:
        """Answer one frame. Never raises: a bad frame gets an error frame (with its id when
        readable)."""
        allowed = self._bucket.take()  # every frame counts, valid or not
        request_id: str | None = None
        try:
            msg = decode_client(data, self.daemon.settings.limits)
            request_id = msg.request.id if isinstance(msg, (Complete, Warm)) else msg.id
            if not allowed:
                raise RateLimited("too many messages on this connection; this one was dropped",
                                  hint=f"send at most {self.daemon.settings.rate_limit_per_s:g} per second")
            self.dispatch(msg)
        except SolError as exc:
            self.daemon.metrics.client_errors.labels(exc.code).inc()
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
            self.daemon.worker.withdraw(job)
        elif isinstance(msg, CompletionEvent):
            self.daemon.metrics.record_event(msg.kind, msg.accepted_chars)
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
        mine, daemon_jobs = len(self.jobs), len(self.daemon.jobs)
        half = limits.max_in_flight // 2     # above it, a connection over its share (at least MIN_SHARE) waits
        share = max(MIN_SHARE, half // max(1, self.daemon.active_connections(self.cid)))
        if mine >= limits.max_in_flight_per_connection or daemon_jobs >= limits.max_in_flight \
                or (daemon_jobs >= half and mine >= share):
            raise Busy("too many requests in flight", hint="cancel or wait for earlier requests")
        for old in list(self.jobs.values()):
            if old.request.uri == req.uri and (kind == "complete" or old.kind == "warm"):
                self.daemon.worker.supersede(old)
        high = sum(1 for j in self.jobs.values() if j.state == "queued" and j.request.priority == "high")
        if req.priority == "high" and high >= MAX_HIGH_QUEUED:
            req = dataclasses.replace(req, priority="normal")
        job = Job.arrive(kind, req, self.deliver, owner=self.cid)
        self.jobs[req.id] = job
        self.daemon.track(job)
        self.daemon.worker.submit(job)

    # Runs on the event loop thread: the worker posts its events there.

    def deliver(self, job: Job, event: Delta | Done | ErrorFrame) -> None:
        if isinstance(event, Delta):
            if not job.cancel.cancelled:  # the client no longer wants it
                self.send(event)
            return
        if self.jobs.get(job.id) is job:
            del self.jobs[job.id]
        self.daemon.job_ended(self, job, event)
        self.send(event)
