"""One streamed ``POST /v1/completions`` over httpx and its SSE parsing (lines bounded by
:data:`MAX_LINE`: the answer is untrusted); HTTP failures become the remote errors."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

from soldaemon.errors import RemoteBadResponse, RemoteHttpError, RemoteTimeout, RemoteUnavailable
from soldaemon.remote.endpoint import Endpoint

log = logging.getLogger("soldaemon.remote")

MAX_ERROR_BODY = 64 * 1024     # bytes of an error answer read for its message
MAX_LINE = 1 << 20             # bytes of one SSE line / non-streamed answer

# httpcore's trace events after which a connection's socket exists
_SOCKET_EVENTS = ("connection.connect_tcp.complete", "connection.start_tls.complete")


@dataclass
class Piece:
    """One parsed stream event: text to append, maybe why it ended and token counts."""

    text: str
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None


class CouldNotConnect(Exception):
    """Connecting or sending failed before the engine answered (retry-safe)."""


class UpstreamStream:
    """:meth:`open`, then :meth:`pieces`; :meth:`close`, from any thread at any time, shuts the
    socket so a blocked read returns at once."""

    def __init__(self, endpoint: Endpoint, body: dict[str, Any], headers: dict[str, str], *,
                 connect_timeout_s: float, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.body = json.dumps(body).encode()
        self.headers = headers
        self.connect_timeout_s = connect_timeout_s
        self.timeout_s = timeout_s
        self.closed = False                 # closed by us (cancel, stop, budget)
        self._sock: socket.socket | None = None
        self._resp: httpx.Response | None = None
        self._lock = threading.Lock()

    def open(self) -> None:
        """Connect, send, read the status line. Raises CouldNotConnect (no
        answer came), RemoteTimeout or RemoteHttpError."""
        if self.closed:
            return
        client = self.endpoint.client
        request = client.build_request(
            "POST", self.endpoint.url("/completions"), content=self.body, headers=self.headers,
            timeout=httpx.Timeout(self.timeout_s, connect=self.connect_timeout_s, pool=self.connect_timeout_s),
            extensions={"trace": self._traced})
        try:
            resp = client.send(request, stream=True)
        except (httpx.ConnectTimeout, httpx.PoolTimeout) as exc:
            raise CouldNotConnect(f"connect timed out after {self.connect_timeout_s:g} s") from exc
        except httpx.TimeoutException:
            if self.closed:
                return
            raise RemoteTimeout(f"the engine at {self.endpoint.shown} did not answer within {self.timeout_s:g} s",
                                hint="it may be overloaded; raise backend.timeout_s or check the engine") from None
        except httpx.TransportError as exc:   # the caller treats a stream closed meanwhile as cancelled
            if self.closed:
                return
            why = failure_reason(exc)
            if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
                why = f"the connection was dropped before an answer ({why})"
            raise CouldNotConnect(why) from exc
        self._resp = resp
        if resp.status_code != 200:
            raise _http_error(self.endpoint, resp)

    def _traced(self, event: str, info: dict[str, Any]) -> None:
        """httpcore's trace hook: keep the socket (shut at once if :meth:`close` came first)."""
        if event not in _SOCKET_EVENTS:
            return
        sock = info["return_value"].get_extra_info("socket")
        with self._lock:
            self._sock = sock
            closed = self.closed
        if closed:
            self._shutdown()

    def pieces(self) -> Iterator[Piece]:
        """The events until ``[DONE]`` (quietly none after :meth:`close`). Raises
        RemoteUnavailable, RemoteTimeout or RemoteBadResponse."""
        resp = self._resp
        if resp is None or self.closed:
            return
        ctype = resp.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype == "application/json":  # the engine ignored stream: true; one answer
            yield parse_chunk(self.endpoint, self._read_all(resp))
            return
        if ctype != "text/event-stream":
            snippet = self._read_all(resp)[:120]
            raise RemoteBadResponse(
                f"the engine at {self.endpoint.shown} answered Content-Type {ctype or 'none'!r}, not an "
                f"event stream: {snippet!r}", hint="check backend.url: it must be an OpenAI-compatible engine")
        finished = False
        data: list[bytes] = []
        buf = b""
        blocks = resp.iter_raw()
        while True:
            try:
                block = next(blocks, None)         # None: the engine ended the body
            except httpx.TimeoutException:
                if self.closed:
                    return
                raise RemoteTimeout(f"the engine at {self.endpoint.shown} sent nothing for {self.timeout_s:g} s "
                                    "in the middle of a completion",
                                    hint="it may be overloaded; raise backend.timeout_s or check the engine") from None
            except (httpx.TransportError, httpx.StreamError) as exc:
                if self.closed:
                    return
                raise RemoteUnavailable(f"the stream from {self.endpoint.shown} broke mid-completion "
                                        f"({failure_reason(exc)})", hint="the engine may have stopped; retry") from None
            if block is None:
                if self.closed or finished:
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
                piece = parse_chunk(self.endpoint, payload)
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
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # wakes a read blocked on another thread

    def release(self) -> None:
        """Free the connection (the reading thread, when done with it)."""
        self.close()
        resp = self._resp
        if resp is not None:
            resp.close()

    def _read_all(self, resp: httpx.Response) -> bytes:
        try:
            return read_at_most(resp, MAX_LINE)
        except (httpx.TransportError, httpx.StreamError) as exc:
            raise RemoteUnavailable(f"reading the answer of {self.endpoint.shown} failed "
                                    f"({failure_reason(exc)})") from None


def read_at_most(resp: httpx.Response, limit: int) -> bytes:
    """The first ``limit`` bytes of a streamed response's raw body."""
    got = b""
    for block in resp.iter_raw():
        got += block
        if len(got) >= limit:
            break
    return got[:limit]


def failure_reason(exc: BaseException) -> str:
    """Why a request failed in a few words (the OS reason under httpx's)."""
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, OSError):
        cause = cause.__cause__ or cause.__context__
    if cause is None:
        return str(exc) or type(exc).__name__
    if isinstance(cause, ConnectionRefusedError):
        return "connection refused"
    if isinstance(cause, socket.gaierror):
        return f"cannot resolve the host ({cause.strerror or cause})"
    text = getattr(cause, "strerror", None) or str(cause) or type(cause).__name__
    return f"{type(cause).__name__}: {text}" if text != type(cause).__name__ else text


def _http_error(endpoint: Endpoint, resp: httpx.Response) -> RemoteHttpError:
    try:
        raw = read_at_most(resp, MAX_ERROR_BODY)
    except (httpx.TransportError, httpx.StreamError):
        raw = b""
    detail = raw.decode("utf-8", "replace").strip()
    with contextlib.suppress(ValueError):
        obj = json.loads(raw)
        err = obj.get("error", obj.get("detail", obj.get("message"))) if isinstance(obj, dict) else None
        if isinstance(err, dict):
            err = err.get("message", err)
        if err is not None:
            detail = str(err)
    detail = detail[:300]
    hints = {
        401: "the engine wants an API key: set backend.api_key_env or backend.api_key_file",
        403: "the engine refused the API key: check backend.api_key_env / backend.api_key_file",
        404: "check backend.url (the engine's base URL; the daemon adds /v1/completions) and backend.model_name",
        400: "the engine refused the request: check backend.model_name and that the prompt fits its context",
        429: "the engine is overloaded; retry later",
    }
    hint = hints.get(resp.status_code, "the engine failed; see its log" if resp.status_code >= 500 else None)
    return RemoteHttpError(resp.status_code, f"the engine at {endpoint.shown} answered HTTP {resp.status_code} "
                           f"{resp.reason_phrase}" + (f": {detail}" if detail else ""), hint=hint)


def parse_chunk(endpoint: Endpoint, payload: bytes) -> Piece:
    """One JSON event as a Piece; raises RemoteBadResponse, or RemoteHttpError for an ``error``."""
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
