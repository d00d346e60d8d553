"""One streamed ``POST /v1/completions`` and the parsing of its server-sent
events; HTTP failures become the remote errors of :mod:`soldaemon.errors`."""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
from dataclasses import dataclass
from typing import Any, Iterator

from soldaemon.errors import RemoteBadResponse, RemoteHttpError, RemoteTimeout, RemoteUnavailable
from soldaemon.remote.endpoint import Endpoint

log = logging.getLogger("soldaemon.remote")

MAX_ERROR_BODY = 64 * 1024     # bytes of an error answer read for its message
MAX_LINE = 1 << 20             # bytes of one SSE line / non-streamed answer


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
