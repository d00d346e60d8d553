"""The remote engine: completions computed by an inference engine elsewhere
(vLLM, Text Generation Inference, a llama.cpp server) through the
OpenAI-compatible ``POST /v1/completions`` streaming API, behind the same
:class:`soldaemon.api.Engine` contract as the local runtime.

What stays in the daemon (so editors see no difference): request checks, the
FIM prompt (the model family's template, token budgets, stable windows; see
:mod:`soldaemon.pipeline`), type-through, the streamed preview's hold-back
rule, the incremental :class:`~soldaemon.postprocess.StopChecker` and
post-processing, supersede and cancel, timings. The engine only samples.

The prompt goes out as text with the FIM control tokens spelled out
(``backend.prompt_format: text``, every engine parses them as special tokens)
or as token ids (``tokens``: vLLM and the native llama.cpp server; the
llama-cpp-python server takes strings only).

Cancel closes the upstream socket (``shutdown``) within
:data:`WATCH_INTERVAL_S`, from a watcher thread, so the engine sees the client
go away and stops generating. The same happens as soon as the StopChecker
knows post-processing will cut the rest, and when ``budget_ms`` runs out.

Failures become :class:`~soldaemon.errors.SolError` subclasses with
``retryable`` set: the engine cannot be reached (``remote_unavailable``, also
while backing off), is too slow (``remote_timeout``), or answers with an HTTP
error or garbage (``remote_http``, ``remote_bad_response``). Consecutive
failures back off exponentially (:class:`Backoff`): during the wait requests
fail at once instead of hammering the engine, or go to the local model when
``backend.fallback_local`` is set.

Threads: ``complete``/``warm`` run on the daemon's worker thread;
``diagnosis``/``info`` on the event loop thread, so they only read state and
never block (the reachability probe runs on its own thread).
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import socket
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from .api import CancelToken, CompletionRequest, Delta, Done, Engine, Event, FinishReason, Timings
from .config import Config
from .errors import ConfigError, RemoteBadResponse, RemoteHttpError, RemoteTimeout, RemoteUnavailable, SolError, Unavailable
from .fim import FimPrompt, FimTemplate, detect_template
from .pipeline import (
    Previewer,
    Shown,
    build_fim_prompt,
    context_selector,
    remember,
    type_through,
    type_through_events,
    validate_request,
)
from .postprocess import StopChecker, decide_multiline, postprocess
from .sensitive import outbound

log = logging.getLogger("soldaemon.remote")

WATCH_INTERVAL_S = 0.002       # how often the watcher looks at cancel and the budget; s
MAX_ERROR_BODY = 64 * 1024     # bytes of an error answer read for its message
MAX_LINE = 1 << 20             # bytes of one SSE line / non-streamed answer








# --------------------------------------------------------------------------
# Endpoint, back-off
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where the engine listens. ``shown`` is the URL without any
    ``user:password@`` part: the only form that reaches logs and health."""

    https: bool
    host: str
    port: int
    base: str                      # path prefix up to and including /v1, e.g. "/v1"
    shown: str
    userinfo: str | None = None    # "user:password" from the URL (sent as Basic auth)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http(s)://host[:port][/prefix][/v1]`` → the endpoint whose API
        paths are ``<prefix>/v1/...``. Raises ConfigError."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"backend.url = {url!r}: expected an http:// or https:// URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConfigError(f"backend.url: invalid port in {parts.hostname}") from None
        path = parts.path.rstrip("/")
        base = path if path.endswith("/v1") else path + "/v1"
        host = parts.hostname
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        userinfo = None
        if parts.username is not None:
            userinfo = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
        return cls(parts.scheme == "https", host, port, base, f"{parts.scheme}://{netloc}{base}", userinfo)

    def connection(self, timeout: float) -> http.client.HTTPConnection:
        if self.https:
            return http.client.HTTPSConnection(self.host, self.port, timeout=timeout)
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)


class Backoff:
    """Exponential back-off over consecutive failures: after failure k
    (1-based) the engine is not tried for ``first_s * 2**(k-1)`` seconds,
    at most ``max_s``. A success resets it. Thread-safe."""

    def __init__(self, first_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.clock = clock
        self.failures = 0
        self.last_error = ""
        self._until = 0.0
        self._lock = threading.Lock()

    def failed(self, why: str) -> float:
        """Record a failure; return the wait before the next try (s)."""
        with self._lock:
            self.failures += 1
            self.last_error = why
            wait = min(self.max_s, self.first_s * 2 ** (self.failures - 1))
            self._until = self.clock() + wait
            return wait

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0
            self._until = 0.0

    def remaining(self) -> float:
        """Seconds until the engine may be tried again (0: now)."""
        return max(0.0, self._until - self.clock())


# --------------------------------------------------------------------------
# One streamed completion
# --------------------------------------------------------------------------


@dataclass
class Piece:
    """One parsed stream event: text to append, and when the engine says so,
    why it ended and its token counts."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class _CouldNotConnect(Exception):
    """Connecting or sending failed before the engine answered (retry-safe)."""


class UpstreamStream:
    """One ``POST /v1/completions`` with ``stream: true``. :meth:`open`
    connects and reads the status; :meth:`pieces` yields parsed events;
    :meth:`close` may be called from any thread at any time and makes a
    blocked read return at once (the engine sees the connection close)."""

    def __init__(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str], *,
                 connect_timeout_s: float, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.body = json.dumps(body).encode()
        self.headers = headers
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.closed = False                 # closed by us (cancel, stop, budget)
        self._conn: http.client.HTTPConnection | None = None
        self._sock: socket.socket | None = None
        self._resp: http.client.HTTPResponse | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        """Connect, send, read the status line. Raises _CouldNotConnect
        (nothing reached the engine, or it dropped the connection before
        answering), RemoteTimeout, RemoteHttpError."""
        conn = self.endpoint.connection(self.connect_timeout_s)
        with self._lock:
            if self.closed:
                return
            self._conn = conn
        try:
            conn.connect()
        except (socket.timeout, TimeoutError) as exc:
            raise _CouldNotConnect(f"connect timed out after {self.connect_timeout_s:g} s") from exc
        except OSError as exc:
            raise _CouldNotConnect(_os_reason(exc)) from exc
        sock = conn.sock
        with self._lock:
            self._sock = sock
            closed = self.closed
        if closed:
            self._shutdown()
            return
        sock.settimeout(self.timeout_s)
        try:
            conn.request("POST", self.endpoint.base + "/completions", self.body, self.headers)
            resp = conn.getresponse()
        except (socket.timeout, TimeoutError):
            if self.closed:
                return
            raise RemoteTimeout(f"the engine at {self.endpoint.shown} did not answer within {self.timeout_s:g} s",
                                hint="it may be overloaded; raise backend.timeout_s or check the engine") from None
        except (http.client.RemoteDisconnected, ConnectionError, http.client.BadStatusLine) as exc:
            if self.closed:
                return
            raise _CouldNotConnect(f"the connection was dropped before an answer ({_os_reason(exc)})") from exc
        except OSError as exc:
            if self.closed:
                return
            raise _CouldNotConnect(_os_reason(exc)) from exc
        self._resp = resp
        if resp.status != 200:
            raise _http_error(self.endpoint, resp)

    def pieces(self) -> Iterator[Piece]:
        """The stream's events until ``[DONE]`` or the engine's end. Ends
        quietly when :meth:`close` was called. Raises RemoteUnavailable (the
        stream broke before the engine finished), RemoteTimeout,
        RemoteBadResponse."""
        resp = self._resp
        if resp is None or self.closed:
            return
        ctype = (resp.getheader("Content-Type") or "").split(";")[0].strip().lower()
        if ctype == "application/json":  # the engine ignored stream: true; one answer
            yield _parse_chunk(self.endpoint, self._read_all(resp))
            return
        if ctype != "text/event-stream":
            snippet = self._read_all(resp)[:120]
            raise RemoteBadResponse(
                f"the engine at {self.endpoint.shown} answered Content-Type {ctype or 'none'!r}, not an "
                f"event stream: {snippet!r}", hint="check backend.url: it must be an OpenAI-compatible engine")
        finished = False
        data: list[bytes] = []
        buf = b""
        while True:
            try:
                block = resp.read1(65536)
            except (socket.timeout, TimeoutError):
                if self.closed:
                    return
                raise RemoteTimeout(f"the engine at {self.endpoint.shown} sent nothing for {self.timeout_s:g} s "
                                    "in the middle of a completion",
                                    hint="it may be overloaded; raise backend.timeout_s or check the engine") from None
            except (OSError, http.client.HTTPException, ValueError) as exc:
                if self.closed:
                    return
                raise RemoteUnavailable(f"the stream from {self.endpoint.shown} broke mid-completion "
                                        f"({_os_reason(exc)})", hint="the engine may have stopped; retry") from None
            if not block:
                if self.closed:
                    return
                if finished:
                    return
                raise RemoteUnavailable(f"the engine at {self.endpoint.shown} closed the stream mid-completion",
                                        hint="the engine may have stopped or restarted; retry")
            buf += block
            while True:
                nl = buf.find(b"\n")
                if nl < 0:
                    if len(buf) > MAX_LINE:
                        raise RemoteBadResponse(f"the engine at {self.endpoint.shown} sent a stream line over "
                                                f"{MAX_LINE} bytes")
                    break
                line, buf = buf[:nl].rstrip(b"\r"), buf[nl + 1:]
                if line.startswith(b"data:"):
                    data.append(line[5:].removeprefix(b" "))
                    continue
                if line or not data:  # comments (": ping"), event:/id:/retry: fields
                    continue
                payload, data = b"\n".join(data), []
                if payload.strip() == b"[DONE]":
                    return
                piece = _parse_chunk(self.endpoint, payload)
                finished = finished or piece.finish_reason is not None
                yield piece

    def close(self) -> None:
        """Stop reading and drop the connection (idempotent, any thread)."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
        self._shutdown()

    def _shutdown(self) -> None:
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on another thread
            except OSError:
                pass

    def release(self) -> None:
        """Free the connection (the reading thread, when done with it)."""
        self.close()
        conn = self._conn
        if conn is not None:
            conn.close()

    def _read_all(self, resp: http.client.HTTPResponse) -> bytes:
        try:
            return resp.read(MAX_LINE)
        except (OSError, http.client.HTTPException) as exc:
            raise RemoteUnavailable(f"reading the answer of {self.endpoint.shown} failed ({_os_reason(exc)})") from None


def _os_reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, socket.gaierror):
        return f"cannot resolve the host ({exc.strerror or exc})"
    text = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if text != type(exc).__name__ else text


def _http_error(endpoint: Endpoint, resp: http.client.HTTPResponse) -> RemoteHttpError:
    try:
        raw = resp.read(MAX_ERROR_BODY)
    except (OSError, http.client.HTTPException):
        raw = b""
    detail = raw.decode("utf-8", "replace").strip()
    try:
        obj = json.loads(raw)
        err = obj.get("error", obj.get("detail", obj.get("message"))) if isinstance(obj, dict) else None
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            detail = str(err)
    except ValueError:
        pass
    detail = detail[:300]
    hints = {
        401: "the engine wants an API key: set backend.api_key_env or backend.api_key_file",
        403: "the engine refused the API key: check backend.api_key_env / backend.api_key_file",
        404: "check backend.url (the engine's base URL; the daemon adds /v1/completions) and backend.model_name",
        400: "the engine refused the request: check backend.model_name and that the prompt fits its context",
        429: "the engine is overloaded; retry later",
    }
    hint = hints.get(resp.status, "the engine failed; see its log" if resp.status >= 500 else None)
    return RemoteHttpError(resp.status, f"the engine at {endpoint.shown} answered HTTP {resp.status} "
                           f"{resp.reason}" + (f": {detail}" if detail else ""), hint=hint)


def _parse_chunk(endpoint: Endpoint, payload: bytes) -> Piece:
    """One JSON event of the completions stream → a Piece. Raises
    RemoteBadResponse / RemoteHttpError (an ``error`` event)."""
    try:
        obj = json.loads(payload)
    except ValueError:
        raise RemoteBadResponse(f"the engine at {endpoint.shown} sent a stream event that is not JSON: "
                                f"{payload[:80]!r}", hint="check backend.url: it must be an OpenAI-compatible "
                                "completions engine") from None
    if not isinstance(obj, dict):
        raise RemoteBadResponse(f"the engine at {endpoint.shown} sent a stream event that is not an object: "
                                f"{payload[:80]!r}")
    if "error" in obj:
        err = obj["error"]
        message = err.get("message", err) if isinstance(err, dict) else err
        status = err.get("code") if isinstance(err, dict) else None
        return_status = status if isinstance(status, int) and 400 <= status <= 599 else 500
        raise RemoteHttpError(return_status, f"the engine at {endpoint.shown} reported an error mid-stream: "
                              f"{str(message)[:300]}", hint="see the engine's log")
    choices = obj.get("choices")
    usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else None
    if choices == [] and usage is not None:  # the usage-only last event (stream_options.include_usage)
        return Piece("", None, usage)
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict) \
            or not isinstance(choices[0].get("text"), str):
        raise RemoteBadResponse(f"the engine at {endpoint.shown} sent an event without choices[0].text: "
                                f"{payload[:120]!r}", hint="it must speak the OpenAI /v1/completions API "
                                "(chat-only endpoints are not enough)")
    reason = choices[0].get("finish_reason")
    return Piece(choices[0]["text"], reason if isinstance(reason, str) else None, usage)


# --------------------------------------------------------------------------
# Health probe
# --------------------------------------------------------------------------


@dataclass
class Reachability:
    """What the daemon last learnt about the engine."""

    reachable: bool | None = None  # None: not known yet
    checked: float = 0.0           # time.monotonic() of the last probe or request outcome
    error: str | None = None       # why it was unreachable
    models: tuple[str, ...] = ()   # ids listed by GET /v1/models


class Probe:
    """``GET <base>/models``, cached ``interval_s``: :meth:`snapshot` never
    blocks; a stale value starts one background probe."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str], interval_s: float, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.state = Reachability()
        self._running = False
        self._lock = threading.Lock()
        self.on_reachable: Callable[[], None] = lambda: None

    def snapshot(self) -> Reachability:
        with self._lock:
            stale = time.monotonic() - self.state.checked > self.interval_s
            start = stale and not self._running
            if start:
                self._running = True
        if start:
            threading.Thread(target=self._run, name="sol-remote-probe", daemon=True).start()
        return self.state

    def probe_now(self) -> Reachability:
        """Probe on this thread (bounded by the timeouts) and return it."""
        with self._lock:
            self._running = True
        self._run()
        return self.state

    def note(self, reachable: bool, error: str | None = None) -> None:
        """A request's outcome counts as a probe."""
        self.state = Reachability(reachable, time.monotonic(), error, self.state.models)

    def _run(self) -> None:
        try:
            models, error = self._get_models()
            if error is None:
                self.state = Reachability(True, time.monotonic(), None, models)
                self.on_reachable()
            else:
                self.state = Reachability(False, time.monotonic(), error, self.state.models)
        finally:
            with self._lock:
                self._running = False

    def _get_models(self) -> tuple[tuple[str, ...], str | None]:
        conn = self.endpoint.connection(self.timeout_s)
        try:
            conn.request("GET", self.endpoint.base + "/models", headers=self.headers)
            resp = conn.getresponse()
            body = resp.read(MAX_ERROR_BODY)
            if resp.status != 200:
                return (), f"GET /v1/models answered HTTP {resp.status} {resp.reason}"
            data = json.loads(body).get("data", [])
            return tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")), None
        except (OSError, http.client.HTTPException) as exc:
            return (), _os_reason(exc)
        except (ValueError, AttributeError):
            return (), "GET /v1/models did not answer an OpenAI model list"
        finally:
            conn.close()


# --------------------------------------------------------------------------
# The engine
# --------------------------------------------------------------------------


@dataclass
class RemoteStats:
    requests: int = 0
    prompt_tokens: int = 0         # summed over requests (daemon's count)
    cached_tokens: int = 0         # of which the engine reported reused (when it reports it)
    failures: int = 0              # requests ended by an engine failure
    fallbacks: int = 0             # requests answered by the local model
    upstream_closed: int = 0       # streams the daemon closed early (cancel, stop, budget)


@dataclass
class _Attempt:
    """One candidate's generation: the text so far and how it ended."""

    raw: str = ""
    finish: FinishReason = "stop"
    chunks: int = 0
    usage: dict[str, Any] | None = None
    first_ns: int = 0
    first_wall_ns: int = 0
    closed_by: str | None = field(default=None)   # "cancel" | "budget" | "stop"


class _Watch:
    """Beside the reading thread, for one request: closes the stream it
    follows as soon as the request is cancelled or out of budget (checked
    every :data:`WATCH_INTERVAL_S`). ``fired`` says which. A context
    manager: the thread runs inside the ``with``."""

    def __init__(self, cancel: CancelToken, deadline: int | None) -> None:
        self.cancel, self.deadline = cancel, deadline
        self.stream: UpstreamStream | None = None
        self.fired: str | None = None          # "cancel" | "budget"
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sol-remote-watch", daemon=True)

    def __enter__(self) -> _Watch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()

    def follow(self, stream: UpstreamStream) -> None:
        """Watch ``stream`` from now on (closed at once if already fired)."""
        self.stream = stream
        if self.fired is not None:
            stream.close()

    def _run(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_S):
            if self.cancel.cancelled or _past(self.deadline):
                self.fired = "cancel" if self.cancel.cancelled else "budget"
                stream = self.stream
                if stream is not None:
                    stream.close()
                log.debug("closed the upstream stream (%s)", self.fired)
                return


class RemoteEngine:
    """The Engine protocol over an OpenAI-compatible completions engine.

    ``tokenizer`` must be the remote model family's (FIM template and token
    budgets); ``local`` loads the fallback engine (called at most once, on a
    background thread) when ``backend.fallback_local`` is set."""

    def __init__(self, config: Config, tokenizer: Any, tokenizer_name: str, *,
                 local: Callable[[], Engine] | None = None) -> None:
        bc = config.backend
        if bc.url is None:
            raise ConfigError("backend.kind is \"remote\" but backend.url is not set")
        self.config = config
        self.endpoint = Endpoint.parse(bc.url)
        self.tokenizer = tokenizer
        self.tokenizer_name = tokenizer_name
        self.template: FimTemplate = detect_template(tokenizer)
        self.context_selector = context_selector(config.model)   # model.context: relevance
        self._headers = {"Content-Type": "application/json", "Accept": "text/event-stream",
                         "User-Agent": "soldaemon"}
        key = read_api_key(bc.api_key_env, str(bc.api_key_file) if bc.api_key_file else None)
        if key:
            self._headers["Authorization"] = f"Bearer {key}"
        elif self.endpoint.userinfo is not None:
            import base64

            self._headers["Authorization"] = "Basic " + base64.b64encode(self.endpoint.userinfo.encode()).decode()
        self.backoff = Backoff(bc.backoff_s, bc.max_backoff_s)
        probe_headers = {k: v for k, v in self._headers.items() if k in ("Authorization", "User-Agent")}
        self.probe = Probe(self.endpoint, probe_headers, bc.health_interval_s, min(bc.timeout_s, 5.0))
        self.probe.on_reachable = self.backoff.succeeded
        self.stats = RemoteStats()
        self._shown: Shown = {}
        self._local_loader = local if bc.fallback_local else None
        self._local: Engine | None = None
        self._local_error: BaseException | None = None
        self._local_ready = threading.Event()
        self._local_started = False
        self._lock = threading.Lock()

    # -- the Engine protocol -------------------------------------------------

    def info(self) -> dict[str, Any]:
        bc = self.config.backend
        models = self.probe.state.models
        return {
            "model": bc.model_name or (models[0] if len(models) == 1 else None) or f"remote ({self.tokenizer_name} family)",
            "device": f"remote {self.endpoint.shown}",
            "backend": "remote",
            "url": self.endpoint.shown,
            "fim": self.template.family,
            "tokenizer": self.tokenizer_name,
            "prompt_format": bc.prompt_format,
            "n_ctx": self.config.model.max_context,
            "fallback_local": bc.fallback_local,
        }

    def diagnosis(self) -> dict[str, Any]:
        state = self.probe.snapshot()
        local = self._local
        s = self.stats
        return {
            "active": bool(state.reachable) or local is not None,
            "ttft_optimized": False,          # the Sol runtime is not on this path (type-through is)
            "prefetch_hit_rate": None,
            "kv_fold_ratio": 0.0,
            "offloaded_layers": 0,
            "backend": "remote",
            "remote_url": self.endpoint.shown,
            "remote_reachable": state.reachable,
            "remote_checked_s_ago": round(time.monotonic() - state.checked, 1) if state.checked else None,
            "remote_error": state.error,
            "remote_models": list(state.models),
            "remote_backoff_s": round(self.backoff.remaining(), 2),
            "remote_failures": s.failures,
            "remote_fallbacks": s.fallbacks,
            "remote_upstream_closed": s.upstream_closed,
            "fallback_local": self._fallback_state(),
            "kv_hit_ratio": round(s.cached_tokens / s.prompt_tokens, 4) if s.prompt_tokens else 0.0,
            "fallback_count": 0,              # Sol's prefetch fallbacks: no prefetch here
        }

    def _fallback_state(self) -> str:
        if self._local_loader is None:
            return "off"
        if self._local is not None:
            return "ready"
        if self._local_error is not None:
            return "failed"
        return "loading" if self._local_started else "not loaded"

    def debug_snapshots(self) -> dict[str, Any]:
        """No memory scheduler on this path: both snapshots are empty."""
        return {"heatmap": {}, "prefetch": {}}

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Build the prompt only. Engines keep their own prefix caches (vLLM's
        automatic prefix caching, llama.cpp's cache_prompt), filled by real
        completions; a warm-up request per keystroke would spend a shared
        engine's capacity on text nobody reads."""
        prompt, prompt_ms = self.build_prompt(req)
        return Timings(prompt_ms=prompt_ms, total_ms=prompt_ms, prompt_tokens=len(prompt.ids))

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        t_start = time.perf_counter_ns()
        arrival = req.received_ns or t_start
        arrival_wall = time.time_ns() - (time.perf_counter_ns() - arrival)
        validate_request(req)
        rest = type_through(self._shown, req)
        if rest is not None:
            remember(self._shown, req, rest)
            yield from type_through_events(req, rest, t_start)
            return
        if self._local_loader is not None and self.backoff.remaining() > 0:
            yield from self._fallback(req, cancel, self.backoff.last_error)
            return
        prompt, prompt_ms = self.build_prompt(req)
        multiline = decide_multiline(prompt.prefix_text, req.suffix, req.multiline)
        max_lines = self.config.completion.max_lines if multiline else 1
        deadline = arrival + int(req.budget_ms * 1e6) if req.budget_ms else None
        previewer = Previewer(multiline)
        items: list[str] = []
        finish: FinishReason = "stop"
        generated = 0
        cached = 0
        first_ns = first_wall = 0
        for candidate in range(req.n):
            checker = StopChecker(req.prefix, req.suffix, multiline, max_lines)
            body = self._body(req, prompt, candidate)
            try:
                attempt = _Attempt()
                for text in self._generate(body, attempt, checker, cancel, deadline):
                    if candidate == 0:
                        new = previewer.push(text)
                        if new:
                            yield Delta(req.id, new)
            except (RemoteUnavailable, RemoteTimeout, RemoteHttpError, RemoteBadResponse) as exc:
                self.stats.failures += 1
                if (self._local_loader is not None and exc.retryable and candidate == 0
                        and not previewer.emitted and not cancel.cancelled):
                    log.warning("remote engine failed (%s); answering %s from the local model", exc.message, req.id)
                    yield from self._fallback(req, cancel, exc.message)
                    return
                raise
            if candidate == 0:
                first_ns, first_wall = attempt.first_ns, attempt.first_wall_ns
            finish = attempt.finish
            usage = attempt.usage or {}
            generated += int(usage.get("completion_tokens") or attempt.chunks)
            details = usage.get("prompt_tokens_details")
            if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
                cached += details["cached_tokens"]
            items.append(postprocess(attempt.raw, prefix=req.prefix, suffix=req.suffix,
                                     multiline=multiline, max_lines=max_lines))
            if finish in ("cancelled", "budget"):
                break
        if finish == "cancelled":
            finish = cancel.reason
        end = time.perf_counter_ns()
        timings = Timings(
            queue_ms=(t_start - arrival) / 1e6, prompt_ms=prompt_ms,
            ttft_ms=(first_ns - arrival) / 1e6 if first_ns else (end - arrival) / 1e6,
            decode_ms=(end - first_ns) / 1e6 if first_ns else 0.0, total_ms=(end - arrival) / 1e6,
            prompt_tokens=len(prompt.ids), cached_tokens=min(cached, len(prompt.ids) * req.n),
            generated_tokens=generated, ttft_start_ns=arrival_wall, ttft_end_ns=first_wall or time.time_ns(),
        )
        self.stats.requests += 1
        self.stats.prompt_tokens += timings.prompt_tokens
        self.stats.cached_tokens += timings.cached_tokens
        if finish in ("stop", "length") and items:
            remember(self._shown, req, items[0])
        log.info("complete id=%s finish=%s remote prompt=%d gen=%d prompt_ms=%.1f ttft_ms=%.1f decode_ms=%.1f "
                 "total_ms=%.1f", req.id, finish, timings.prompt_tokens, timings.generated_tokens,
                 timings.prompt_ms, timings.ttft_ms, timings.decode_ms, timings.total_ms)
        yield Done(req.id, tuple(items), finish, timings)

    # -- stages --------------------------------------------------------------

    def build_prompt(self, req: CompletionRequest) -> tuple[FimPrompt, float]:
        """The prompt sent upstream; secret files never are (soldaemon.sensitive)."""
        req = outbound(req)
        return build_fim_prompt(self.template, self.tokenizer, self.config.model, req,
                                self.config.model.max_context, selector=self.context_selector)

    def prompt_text(self, prompt: FimPrompt) -> str:
        """The prompt as the engine's tokenizer should read it: the text
        with the control tokens spelled out. A leading bos is left out: the
        engine adds its own."""
        ids = prompt.ids
        if ids and self.template.bos_id is not None and ids[0] == self.template.bos_id:
            ids = ids[1:]
        return str(self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False))

    def _body(self, req: CompletionRequest, prompt: FimPrompt, candidate: int) -> dict[str, Any]:
        bc = self.config.backend
        body: dict[str, Any] = {
            "prompt": list(prompt.ids) if bc.prompt_format == "tokens" else self.prompt_text(prompt),
            "max_tokens": req.max_tokens,
            "temperature": req.temperature,
            "top_p": req.top_p,
            "stream": True,
            "stream_options": {"include_usage": True},
            # the family's end tokens as text: engines that render special
            # tokens stop on them; the others stop on their own eos, and the
            # StopChecker closes the stream at the end of the hole anyway
            "stop": self._stop_strings(),
        }
        if bc.model_name:
            body["model"] = bc.model_name
        if req.seed is not None:
            body["seed"] = req.seed + candidate
        return body

    def _stop_strings(self) -> list[str]:
        names = self.tokenizer.convert_ids_to_tokens(list(self.template.stop_ids))
        return sorted({str(n) for n in names if n})[:4]  # the OpenAI API allows up to 4

    def _generate(self, body: dict[str, Any], attempt: _Attempt, checker: StopChecker, cancel: CancelToken,
                  deadline: int | None) -> Iterator[str]:
        """Stream one completion; yield the raw text after each piece.
        Fills ``attempt``. Retries connecting per ``backend.retries``. A
        cancel or the budget closes the stream at any point, connecting and
        waiting for the engine's first byte included."""
        with _Watch(cancel, deadline) as watch:
            stream = self._open(body, cancel, deadline, watch)
            if stream is None:  # cancelled or out of budget before the engine answered
                attempt.finish = "cancelled" if cancel.cancelled else "budget"
                return
            try:
                for piece in stream.pieces():
                    if piece.usage is not None:
                        attempt.usage = piece.usage
                    if piece.text:
                        if not attempt.first_ns:
                            attempt.first_ns, attempt.first_wall_ns = time.perf_counter_ns(), time.time_ns()
                        attempt.chunks += 1
                        attempt.raw += piece.text
                        yield attempt.raw
                        if checker.check(attempt.raw):  # post-processing cuts the rest: stop the engine
                            attempt.closed_by = "stop"
                            stream.close()
                            break
                    if piece.finish_reason is not None:
                        attempt.finish = "length" if piece.finish_reason == "length" else "stop"
                self.probe.note(True)
            except (RemoteUnavailable, RemoteTimeout) as exc:
                if not stream.closed:
                    self.backoff.failed(exc.message)
                    self.probe.note(False, exc.message)
                raise
            finally:
                stream.release()
        if attempt.closed_by is None and watch.fired is not None:
            attempt.closed_by = watch.fired
        if attempt.closed_by is not None:
            attempt.finish = {"cancel": "cancelled", "budget": "budget", "stop": "stop"}[attempt.closed_by]  # type: ignore[assignment]
            self.stats.upstream_closed += 1

    def _open(self, body: dict[str, Any], cancel: CancelToken, deadline: int | None,
              watch: _Watch) -> UpstreamStream | None:
        """An open stream, trying ``1 + backend.retries`` times with the
        back-off between attempts. None when cancelled or out of budget
        first. Raises RemoteUnavailable, RemoteTimeout, RemoteHttpError."""
        bc = self.config.backend
        tries = 1 + bc.retries
        for attempt in range(tries):
            wait = self.backoff.remaining()
            if wait > 0:
                if attempt == 0 or not _sleep(wait, cancel, deadline):
                    if cancel.cancelled or _past(deadline):
                        return None
                    raise RemoteUnavailable(
                        f"the engine at {self.endpoint.shown} is unreachable ({self.backoff.last_error}); "
                        f"backing off, next try in {wait:.1f} s",
                        hint="start or fix the engine; set backend.fallback_local to answer locally meanwhile")
            if cancel.cancelled or _past(deadline):
                return None
            stream = UpstreamStream(self.endpoint, body, self._headers,
                                    connect_timeout_s=bc.connect_timeout_s, timeout_s=bc.timeout_s)
            watch.follow(stream)
            try:
                stream.open()
            except _CouldNotConnect as exc:
                cancelled = stream.closed  # closed by the watch, not by the engine
                stream.release()
                if cancelled:
                    return None
                why = str(exc)
                wait = self.backoff.failed(why)
                self.probe.note(False, why)
                log.warning("remote engine %s: %s (attempt %d of %d; back-off %.1f s)", self.endpoint.shown, why,
                            attempt + 1, tries, wait)
                continue
            except RemoteTimeout as exc:
                stream.release()
                self.backoff.failed(exc.message)
                self.probe.note(False, exc.message)
                raise
            except RemoteHttpError as exc:
                stream.release()
                if exc.retryable:
                    self.backoff.failed(exc.message)
                raise
            if stream.closed:  # cancelled while connecting or waiting for the answer
                stream.release()
                return None
            self.backoff.succeeded()
            return stream
        raise RemoteUnavailable(
            f"the engine at {self.endpoint.shown} is unreachable: {self.backoff.last_error} "
            f"({tries} attempt{'s' if tries > 1 else ''})",
            hint="start or fix the engine; set backend.fallback_local to answer locally meanwhile")

    # -- fallback ------------------------------------------------------------

    def start_local(self) -> None:
        """Begin loading the local fallback engine in the background (once)."""
        with self._lock:
            if self._local_loader is None or self._local_started:
                return
            self._local_started = True
        loader = self._local_loader

        def load() -> None:
            try:
                self._local = loader()
                log.info("local fallback engine ready")
            except BaseException as exc:  # reported to the requests that wait for it
                self._local_error = exc
                log.error("local fallback engine failed to load: %s", exc)
            finally:
                self._local_ready.set()

        threading.Thread(target=load, name="sol-local-fallback", daemon=True).start()

    def _fallback(self, req: CompletionRequest, cancel: CancelToken, why: str) -> Iterator[Event]:
        self.start_local()
        while not self._local_ready.wait(0.05):
            if cancel.cancelled:
                yield Done(req.id, (), cancel.reason, Timings())
                return
        local = self._local
        if local is None:
            raise RemoteUnavailable(f"the engine at {self.endpoint.shown} is unreachable ({why}) and the local "
                                    f"fallback model failed to load: {self._local_error}")
        self.stats.fallbacks += 1
        for event in local.complete(req, cancel):
            if isinstance(event, Done) and event.finish_reason in ("stop", "length") and event.items:
                remember(self._shown, req, event.items[0])
            yield event


def _past(deadline: int | None) -> bool:
    return deadline is not None and time.perf_counter_ns() >= deadline


def _sleep(seconds: float, cancel: CancelToken, deadline: int | None) -> bool:
    """Wait ``seconds`` unless cancelled or past the deadline (then False)."""
    end = time.monotonic() + seconds
    while True:
        if cancel.cancelled or _past(deadline):
            return False
        left = end - time.monotonic()
        if left <= 0:
            return True
        time.sleep(min(left, 0.01))


def read_api_key(env_name: str | None, file: str | None) -> str | None:
    """The API key: ``$env_name`` when set and non-empty, else the first line
    of ``file``. Raises ConfigError when neither gives one although asked."""
    if env_name:
        value = os.environ.get(env_name, "").strip()
        if value:
            return value
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                value = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"backend.api_key_file '{file}': cannot read: {exc.strerror or exc}") from None
        if not value:
            raise ConfigError(f"backend.api_key_file '{file}' is empty")
        return value
    if env_name:
        raise ConfigError(f"backend.api_key_env names ${env_name}, but it is not set or empty",
                          hint=f"export {env_name}=... before starting the daemon, or set backend.api_key_file")
    return None


def load_remote_engine(config: Config, *, progress: bool = True) -> RemoteEngine:
    """The remote engine for ``config.backend``: the tokenizer of the model
    family (``backend.tokenizer``, else ``model.path``'s, else the embedded
    model's), one reachability probe (an engine that is down at start-up is
    logged, not fatal: it may come later), and with ``fallback_local`` the
    local model loaded lazily (at once in the background when the engine is
    down now)."""
    from .model.loader import load_tokenizer

    bc = config.backend
    source = bc.tokenizer or config.model.path
    tokenizer, name = load_tokenizer(str(source) if source else None, progress=progress)

    def local() -> Engine:
        from .runtime.engine import load_engine

        return load_engine(config, progress=False)

    engine = RemoteEngine(config, tokenizer, name, local=local)
    state = engine.probe.probe_now()
    if state.reachable:
        log.info("remote engine %s reachable; models: %s", engine.endpoint.shown, ", ".join(state.models) or "?")
        if bc.model_name and state.models and bc.model_name not in state.models:
            log.warning("backend.model_name %r is not among the engine's models (%s)", bc.model_name,
                        ", ".join(state.models))
    else:
        log.warning("remote engine %s not reachable now (%s); requests will try it", engine.endpoint.shown,
                    state.error)
        if bc.fallback_local:
            engine.start_local()
    return engine
