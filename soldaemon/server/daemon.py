"""What connections share: the worker, job registry, metrics, HTTP hook, state and drain.
:class:`Daemon` lives on the event loop thread, so ``Engine.diagnosis`` and
``Engine.debug_snapshots`` are called while a request may run: engines keep them concurrent-safe."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import time
from http import HTTPStatus
from typing import Any, Callable, Literal, Mapping

import psutil
from websockets.asyncio.server import Server, ServerConnection
from websockets.datastructures import Headers
from websockets.http11 import Request, Response

from soldaemon import __version__
from soldaemon.api import Done, Engine
from soldaemon.server.auth import bearer_ok, host_header_ok, origin_ok
from soldaemon.discovery import is_loopback_host
from soldaemon.errors import Unavailable
from soldaemon.server.handshake import RefusalLog, duplicated
from soldaemon.server.metrics import Metrics
from soldaemon.protocol import PROTOCOL_VERSION, ErrorFrame, Status
from soldaemon.server.connection import Connection
from soldaemon.server.settings import SOL_DIAGNOSIS_KEYS, ServerSettings
from soldaemon.server.worker import Job, Worker

log = logging.getLogger("soldaemon.server")

DaemonState = Literal["loading", "ready", "draining"]
WS_PATHS = ("/", "/v1")


class Daemon:
    """State shared by all connections. Lives on the event loop thread."""

    def __init__(self, settings: ServerSettings, token: str, model_label: str,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.settings = settings
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
        self._unused_since = time.monotonic()     # the last connection left (or start)
        self.engine_info: dict[str, Any] = {}
        self._loopback = is_loopback_host(settings.host)
        self.refusals = RefusalLog(log.warning)   # failed handshakes, logged in aggregate
        self.metrics = Metrics(self._live, self._engine_stats)

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
        log.info("model ready in %.1f s: %s (the full engine info: soldaemon status --json)",
                 time.monotonic() - t0, engine_summary(self.engine_info) or self.model_label)
        self.set_state("ready")
        return engine

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
            self.metrics.requests.labels(job.kind, event.code).inc()
            log.info("req conn=%d id=%s kind=%s outcome=error:%s total=%.1fms", conn.cid, job.id, job.kind,
                     event.code, job.age_ms())

    def active_connections(self, asking: int) -> int:
        """Connections with work in flight plus ``asking``: what the fair share divides among."""
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

    def _live(self) -> Mapping[str, int]:
        return {"queue_depth": self.worker.queue_depth, "in_flight": len(self.jobs),
                "connections": len(self.connections)}

    def _engine_stats(self) -> Mapping[str, Any]:
        engine = self.worker.engine
        return _safe_call(engine.diagnosis) if engine is not None else {}

    def hello_body(self) -> dict[str, Any]:
        return {"protocol": PROTOCOL_VERSION, "daemon": __version__, "state": self.state,
                "model": self.engine_info.get("model", self.model_label),
                "limits": dataclasses.asdict(self.settings.limits)}

    def health_body(self) -> dict[str, Any]:
        """The ``health`` status body and ``GET /healthz`` document."""
        engine = self.worker.engine
        raw = _safe_call(engine.diagnosis) if engine is not None else {}
        return {
            "state": self.state, "protocol": PROTOCOL_VERSION, "daemon": __version__,
            "sol_diagnosis": {key: raw.get(key) for key in SOL_DIAGNOSIS_KEYS} if engine is not None else None,
            "device": self.engine_info.get("device"), "model": self.engine_info.get("model", self.model_label),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "engine": self.engine_info, "counters": {k: v for k, v in raw.items() if k not in SOL_DIAGNOSIS_KEYS},
            "machine": self.machine,
            "load": dict(self._live()),
            "events": self.metrics.event_counts(),
            "process": {"pid": os.getpid(), "rss_bytes": psutil.Process().memory_info().rss,
                        "tasks": len(asyncio.all_tasks())},
        }

    def debug_body(self, parts: tuple[str, ...]) -> dict[str, Any]:
        """The engine's ``debug_snapshots()`` for ``parts``; empty objects when it has none."""
        get = getattr(self.worker.engine, "debug_snapshots", None)
        snapshots = _safe_call(get) if callable(get) else {}
        return {part: snapshots.get(part) or {} for part in parts}

    def process_request(self, conn: ServerConnection, request: Request) -> Response | None:
        """HTTP hook before the websocket upgrade: authenticate every request, answer ``/healthz``
        and ``/metrics``, let authenticated upgrades on :data:`WS_PATHS` through (``None``)."""
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
            self._unused_since = time.monotonic()

    async def exit_when_unused(self, stop: asyncio.Event) -> None:
        """Set ``stop`` once no client was connected for ``idle_exit_s``, so a daemon an editor
        started does not live forever; returns at once when ``idle_exit_s`` is 0 (never)."""
        idle_s = self.settings.idle_exit_s
        if idle_s <= 0:
            return
        self._unused_since = time.monotonic()
        while not stop.is_set():
            unused = time.monotonic() - self._unused_since
            if not self.connections and unused >= idle_s:
                log.info("no connection for %.0f s (server.idle_exit_s): exiting", unused)
                stop.set()
                return
            await asyncio.sleep(min(max(idle_s - unused, 0.05), 5.0) if not self.connections else min(idle_s, 5.0))

    async def drain(self, server: Server) -> None:
        """Let in-flight work finish (up to ``drain_timeout_s``), cancel the rest, flush the last
        frames, close every connection with 1001."""
        self.set_state("draining")
        if self.jobs:
            log.info("draining %d request(s), up to %.1f s", len(self.jobs), self.settings.drain_timeout_s)
        if not await self.wait_idle(self.settings.drain_timeout_s):
            log.info("drain timeout: cancelling %d request(s)", len(self.jobs))
            for job in list(self.jobs):
                self.worker.withdraw(job)
            await self.wait_idle(2.0)
        await asyncio.gather(*(conn.flush(1.0) for conn in list(self.connections)))
        server.close(close_connections=True, code=1001, reason="soldaemon is shutting down")
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(server.wait_closed(), 5.0)


def engine_summary(info: Mapping[str, Any]) -> str:
    """One line of the engine info's scalar fields worth a glance, never its tables."""
    keys = ("model", "device", "dtype", "backend", "fim", "n_ctx", "threads", "drafter", "load_s")
    return " ".join(f"{k}={info[k]}" for k in keys if isinstance(info.get(k), (str, int, float)))


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
