"""The LSP base protocol, read strictly (pygls' reader would serve an HTTP request as an
editor): only ``Content-Length`` and ``Content-Type`` headers, each at most once, a length of
1 .. :data:`MAX_FRAME_BYTES`, then JSON. Anything else raises :class:`FramingError` and the
server exits, since the stream cannot be resynchronised."""

from __future__ import annotations

import json
import logging
import re
import threading
from typing import Any, Awaitable, Callable, Protocol

MAX_FRAME_BYTES = 64 * 1024 * 1024      # one message; a 1 MB document is ~1 MB of JSON
MAX_HEADER_LINE = 256                   # bytes
_HEADER = re.compile(rb"([A-Za-z][A-Za-z0-9-]*): ([\x20-\x7e]*)\r\n")
_ALLOWED = {b"content-length", b"content-type"}


class FramingError(ValueError):
    """The byte stream is not LSP base-protocol frames."""


class AsyncReader(Protocol):
    def readline(self) -> Awaitable[bytes]: ...

    def readexactly(self, n: int) -> Awaitable[bytes]: ...


async def read_frame(reader: AsyncReader) -> bytes | None:
    """One frame's body, or None at a clean end; raises :class:`FramingError`."""
    headers: dict[bytes, bytes] = {}
    while True:
        line = await reader.readline()
        if not line:
            if headers:
                raise FramingError("the stream ended inside a header block")
            return None
        if line == b"\r\n":
            break
        if len(line) > MAX_HEADER_LINE:
            raise FramingError(f"header line longer than {MAX_HEADER_LINE} bytes")
        match = _HEADER.fullmatch(line)
        if match is None:
            raise FramingError(f"not an LSP header line: {line[:60]!r}")
        name = match.group(1).lower()
        if name not in _ALLOWED or name in headers:
            raise FramingError(f"{'duplicate' if name in headers else 'unexpected'} header {match.group(1)[:40]!r}")
        headers[name] = match.group(2)
    raw = headers.get(b"content-length")
    if raw is None:
        raise FramingError("a frame without Content-Length")
    if not raw.isdigit() or len(raw) > 10:
        raise FramingError(f"bad Content-Length {raw[:20]!r}")
    length = int(raw)
    if not 1 <= length <= MAX_FRAME_BYTES:
        raise FramingError(f"Content-Length {length} outside 1..{MAX_FRAME_BYTES}")
    body = await reader.readexactly(length)
    if len(body) != length:
        raise FramingError("the stream ended inside a frame")
    return body


async def run_strict(stop_event: threading.Event, reader: AsyncReader, protocol: Any,
                     log: logging.Logger, error_handler: Callable[[Exception, type], Any]) -> None:
    """pygls' ``run_async`` loop over :func:`read_frame`: hand each frame to
    ``protocol.handle_message`` until the stream ends or is not LSP."""
    while not stop_event.is_set():
        try:
            body = await read_frame(reader)
        except FramingError as exc:
            log.error("refusing the client's input: %s; closing", exc)
            return
        if body is None:
            return
        try:
            message = json.loads(body, object_hook=protocol.structure_message)
        except ValueError as exc:
            log.error("refusing the client's input: a frame that is not JSON (%s); closing", exc)
            return
        try:
            protocol.handle_message(message)
        except Exception as exc:  # a handler bug: reported, the server lives on
            error_handler(exc, type(exc))
