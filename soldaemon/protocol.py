"""The websocket wire protocol, version 1 (docs/protocol.md): pure encode/decode, no I/O.
Unknown fields are ignored; unknown message types are an error."""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, NoReturn

from soldaemon.api import CompletionRequest, ContextChunk, Delta, Done, FinishReason, Timings
from soldaemon.errors import (BadField, BadJson, BadUtf8, ProtocolError, SolError, TooLarge, UnknownType,
                              UnsupportedVersion)

PROTOCOL_VERSION = 1


@dataclass(frozen=True)
class Limits:
    """Bounds applied while decoding (lengths in characters), and the defaults of a
    ``complete`` message's fields (the config's ``completion:``)."""

    max_message_bytes: int = 1024 * 1024       # one frame, bytes
    max_id_chars: int = 128
    max_uri_chars: int = 4096
    max_language_chars: int = 64
    max_text_chars: int = 1_000_000             # prefix, suffix, one context chunk
    max_context_chunks: int = 32
    max_tokens: int = 2048                      # cap on complete.max_tokens
    max_n: int = 8
    max_budget_ms: float = 120_000.0            # ms
    default_max_tokens: int = 128
    default_budget_ms: float | None = None
    default_multiline: str = "auto"
    default_temperature: float = 0.0
    default_top_p: float = 1.0


DEFAULT_LIMITS = Limits()

# Client → daemon messages

EventKind = Literal["shown", "accepted", "partial", "rejected"]
DebugPart = Literal["heatmap", "prefetch"]
EVENT_KINDS: tuple[EventKind, ...] = ("shown", "accepted", "partial", "rejected")
DEBUG_PARTS: tuple[DebugPart, ...] = ("heatmap", "prefetch")


@dataclass(frozen=True)
class Complete:
    """Stream a completion: ``delta`` frames, then one ``done`` or ``error`` with the same id."""

    request: CompletionRequest


@dataclass(frozen=True)
class Warm:
    """Prefill the prompt into the KV cache; ends with a ``done`` without items, or an ``error``."""

    request: CompletionRequest


@dataclass(frozen=True)
class Cancel:
    """Stop request ``id``; its ``done`` carries finish reason ``cancelled``."""

    id: str


@dataclass(frozen=True)
class CompletionEvent:
    """What the editor did with a completion (counted in metrics); no reply."""

    id: str
    kind: EventKind
    item: int = 0                          # index into done.items
    accepted_chars: int | None = None      # for "partial"


@dataclass(frozen=True)
class Health:
    """Ask for a ``status`` frame of kind ``health``."""

    id: str | None = None


@dataclass(frozen=True)
class Debug:
    """Ask for a ``status`` frame of kind ``debug`` with the named snapshots."""

    id: str | None = None
    parts: tuple[DebugPart, ...] = DEBUG_PARTS


ClientMessage = Complete | Warm | Cancel | CompletionEvent | Health | Debug

# Daemon → client messages (besides api.Delta and api.Done)


@dataclass(frozen=True)
class ErrorFrame:
    """An error; ``id`` names the request it ends (None: none could be read)."""

    id: str | None
    code: str
    message: str
    retryable: bool = False
    hint: str | None = None


StatusKind = Literal["hello", "health", "debug", "state"]


@dataclass(frozen=True)
class Status:
    """``hello`` on connect, ``state`` on each change, ``health`` and ``debug`` answering their
    requests (``id`` echoed)."""

    kind: StatusKind
    body: Mapping[str, Any] = field(default_factory=dict)
    id: str | None = None


ServerMessage = Delta | Done | ErrorFrame | Status


def error_frame(exc: BaseException, request_id: str | None = None) -> ErrorFrame:
    """The error frame of any exception (this boundary's one mapper): a :class:`SolError` keeps
    its code, message and hint; anything else is ``internal`` with no detail."""
    if isinstance(exc, ProtocolError) and request_id is None:
        request_id = exc.request_id
    if isinstance(exc, SolError):
        return ErrorFrame(request_id, exc.code, exc.message, exc.retryable, exc.hint)
    return ErrorFrame(request_id, "internal", "internal error; see the daemon log", False, None)


# Decoding client messages


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


class _Reader:
    """Typed field access on a decoded JSON object; a :class:`ProtocolError` names the field,
    never echoing its value."""

    def __init__(self, obj: dict[str, Any], request_id: str | None, limits: Limits) -> None:
        self.obj = obj
        self.request_id = request_id
        self.limits = limits

    def fail(self, cls: type[ProtocolError], message: str) -> NoReturn:
        raise cls(message, request_id=self.request_id)

    def string(self, name: str, max_chars: int, *, default: str | None = None,
               required: bool = False, nullable: bool = False) -> str | None:
        if name not in self.obj:
            if required:
                self.fail(BadField, f"missing field '{name}'")
            return default
        value = self.obj[name]
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.fail(BadField, f"field '{name}' must be a string")
        return self.check_text(name, value, max_chars)

    def check_text(self, name: str, value: str, max_chars: int) -> str:
        if len(value) > max_chars:
            self.fail(TooLarge, f"field '{name}' is longer than {max_chars} characters")
        if _has_surrogate(value):
            self.fail(BadField, f"field '{name}' contains a lone UTF-16 surrogate")
        return value

    def integer(self, name: str, default: int | None, lo: int, hi: int,
                *, nullable: bool = False) -> int | None:
        if name not in self.obj or (nullable and self.obj[name] is None):
            return default
        value = self.obj[name]
        if isinstance(value, bool) or not isinstance(value, int):
            self.fail(BadField, f"field '{name}' must be an integer")
        if not lo <= value <= hi:
            self.fail(BadField, f"field '{name}' must be between {lo} and {hi}")
        return value

    def number(self, name: str, default: float | None, lo: float, hi: float,
               *, nullable: bool = False) -> float | None:
        if name not in self.obj or (nullable and self.obj[name] is None):
            return default
        value = self.obj[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self.fail(BadField, f"field '{name}' must be a number")
        number = float(value)
        if not math.isfinite(number) or not lo <= number <= hi:
            self.fail(BadField, f"field '{name}' must be between {lo:g} and {hi:g}")
        return number

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.string(name, 64, default=default)
        assert value is not None
        if value not in choices:
            self.fail(BadField, f"field '{name}' must be one of {', '.join(choices)}")
        return value


def _read_id(obj: dict[str, Any], limits: Limits) -> str | None:
    """The message id if it is a usable string, else None (for error frames)."""
    value = obj.get("id")
    if isinstance(value, str) and 0 < len(value) <= limits.max_id_chars and not _has_surrogate(value):
        return value
    return None


def _required_id(r: _Reader) -> str:
    value = _id_field(r, required=True)
    assert value is not None
    return value


def _id_field(r: _Reader, required: bool = False) -> str | None:
    """The ``id`` field, never empty; absent or null is None unless ``required``."""
    value = r.string("id", r.limits.max_id_chars, required=required, nullable=not required)
    if value == "":
        r.fail(BadField, "field 'id' must not be empty")
    return value


def _read_context(r: _Reader) -> tuple[ContextChunk, ...]:
    raw = r.obj.get("context", [])
    if raw is None:
        return ()
    if not isinstance(raw, list):
        r.fail(BadField, "field 'context' must be a list")
    if len(raw) > r.limits.max_context_chunks:
        r.fail(TooLarge, f"field 'context' has more than {r.limits.max_context_chunks} chunks")
    chunks: list[ContextChunk] = []
    for index, item in enumerate(raw):
        if not isinstance(item, dict):
            r.fail(BadField, f"context[{index}] must be an object")
        uri, text = item.get("uri", "untitled:"), item.get("text")
        if not isinstance(uri, str) or not isinstance(text, str):
            r.fail(BadField, f"context[{index}] needs string fields 'uri' and 'text'")
        chunks.append(ContextChunk(
            uri=r.check_text(f"context[{index}].uri", uri, r.limits.max_uri_chars),
            text=r.check_text(f"context[{index}].text", text, r.limits.max_text_chars),
        ))
    return tuple(chunks)


def _read_request(r: _Reader) -> CompletionRequest:
    lim = r.limits
    request_id = _required_id(r)
    prefix = r.string("prefix", lim.max_text_chars, required=True)
    suffix = r.string("suffix", lim.max_text_chars, default="")
    uri = r.string("uri", lim.max_uri_chars, default="untitled:")
    language = r.string("language", lim.max_language_chars, nullable=True)
    version = r.integer("version", None, -(2**63), 2**63 - 1, nullable=True)
    max_tokens = r.integer("max_tokens", lim.default_max_tokens, 1, lim.max_tokens)
    budget_ms = r.number("budget_ms", lim.default_budget_ms, 1.0, lim.max_budget_ms, nullable=True)
    multiline = r.choice("multiline", lim.default_multiline, ("auto", "single", "multi"))
    priority = r.choice("priority", "normal", ("normal", "high"))
    temperature = r.number("temperature", lim.default_temperature, 0.0, 2.0)
    top_p = r.number("top_p", lim.default_top_p, 0.0, 1.0)
    n = r.integer("n", 1, 1, lim.max_n)
    seed = r.integer("seed", None, 0, 2**63 - 1, nullable=True)
    assert prefix is not None and suffix is not None and uri is not None
    assert max_tokens is not None and temperature is not None and top_p is not None and n is not None
    req = CompletionRequest(
        id=request_id, prefix=prefix, suffix=suffix, uri=uri, version=version,
        language=language, context=_read_context(r), max_tokens=max_tokens,
        budget_ms=budget_ms, multiline=multiline,  # type: ignore[arg-type]
        priority=priority,  # type: ignore[arg-type]
        temperature=temperature, top_p=top_p, n=n, seed=seed,
    )
    validate_request(req, lim)
    return req


def validate_request(req: CompletionRequest, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise :class:`BadField` when ``req``'s sampling fields break the protocol's rules
    (decoded and in-process requests alike)."""
    def fail(message: str) -> NoReturn:
        raise BadField(message, request_id=req.id)

    if not 1 <= req.max_tokens <= limits.max_tokens:
        fail(f"field 'max_tokens' must be in 1..{limits.max_tokens}, got {req.max_tokens}")
    if not 1 <= req.n <= limits.max_n:
        fail(f"field 'n' must be in 1..{limits.max_n}, got {req.n}")
    if req.top_p <= 0.0:
        fail("field 'top_p' must be greater than 0")
    if req.top_p > 1.0:
        fail(f"field 'top_p' must be at most 1, got {req.top_p}")
    if req.n > 1 and req.temperature <= 0.0:
        fail("field 'n' greater than 1 needs 'temperature' greater than 0")


def _read_event(r: _Reader) -> CompletionEvent:
    request_id = _required_id(r)
    kind = r.choice("kind", "", EVENT_KINDS)
    item = r.integer("item", 0, 0, r.limits.max_n - 1)
    accepted = r.integer("accepted_chars", None, 0, r.limits.max_text_chars, nullable=True)
    assert item is not None
    return CompletionEvent(request_id, kind, item, accepted)  # type: ignore[arg-type]


def _read_debug(r: _Reader) -> Debug:
    request_id = _id_field(r)
    raw = r.obj.get("parts", list(DEBUG_PARTS))
    if not isinstance(raw, list) or not all(isinstance(p, str) for p in raw):
        r.fail(BadField, "field 'parts' must be a list of strings")
    if len(raw) > len(DEBUG_PARTS) * 2 or any(p not in DEBUG_PARTS for p in raw):
        r.fail(BadField, f"field 'parts' may name only {', '.join(DEBUG_PARTS)}")
    parts = tuple(p for p in DEBUG_PARTS if p in raw)
    return Debug(request_id, parts)


def decode_client(data: bytes | str, limits: Limits = DEFAULT_LIMITS) -> ClientMessage:
    """Decode one client frame; raises only :class:`ProtocolError`, with the ``id`` when
    readable."""
    try:
        return _decode_client(data, limits)
    except ProtocolError:
        raise
    except Exception as exc:  # a bug here must still be a clean error frame
        raise BadJson(f"undecodable message ({type(exc).__name__})") from exc


def _decode_client(data: bytes | str, limits: Limits) -> ClientMessage:
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", "surrogatepass"))
    if size > limits.max_message_bytes:
        raise TooLarge(f"message is larger than {limits.max_message_bytes} bytes")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise BadUtf8("message is not valid UTF-8") from None
    try:
        obj = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError):
        raise BadJson("message is not valid JSON") from None
    if not isinstance(obj, dict):
        raise BadJson("message must be a JSON object")
    r = _Reader(obj, _read_id(obj, limits), limits)
    if "v" in obj:
        v = obj["v"]
        if isinstance(v, bool) or not isinstance(v, int) or v != PROTOCOL_VERSION:
            r.fail(UnsupportedVersion, f"protocol version must be {PROTOCOL_VERSION}")
    kind = obj.get("type")
    if not isinstance(kind, str):
        r.fail(BadField, "field 'type' must be a string")
    read = _READERS.get(kind)
    if read is None:
        r.fail(UnknownType, "unknown message type")
    return read(r)


_READERS: dict[str, Callable[[_Reader], ClientMessage]] = {
    "complete": lambda r: Complete(_read_request(r)), "warm": lambda r: Warm(_read_request(r)),
    "cancel": lambda r: Cancel(_required_id(r)), "event": _read_event,
    "health": lambda r: Health(_id_field(r)), "debug": _read_debug,
}


# Encoding


def _dumps(obj: dict[str, Any]) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


_TIMING_FIELDS = tuple(f.name for f in dataclasses.fields(Timings))


def server_to_json(msg: ServerMessage) -> dict[str, Any]:
    if isinstance(msg, Delta):
        return {"type": "delta", "id": msg.id, "text": msg.text}
    if isinstance(msg, Done):
        done: dict[str, Any] = {"type": "done", "id": msg.id, "items": list(msg.items),
                                "finish_reason": msg.finish_reason, "timings": {
                                    k: round(v, 3) if isinstance(v, float) else v
                                    for k, v in dataclasses.asdict(msg.timings).items()}}
        if msg.ends:
            done["ends"] = list(msg.ends)
        if msg.streamed is not None:
            done["streamed"] = msg.streamed
        return done
    if isinstance(msg, ErrorFrame):
        out: dict[str, Any] = {"type": "error", "id": msg.id, "code": msg.code,
                               "message": msg.message, "retryable": msg.retryable}
        if msg.hint:
            out["hint"] = msg.hint
        return out
    body = dict(msg.body)
    body.update({"type": "status", "kind": msg.kind})
    if msg.id is not None:
        body["id"] = msg.id
    return body


def encode_server(msg: ServerMessage) -> str:
    """One JSON text frame for a daemon → client message."""
    return _dumps(server_to_json(msg))


def _request_to_json(req: CompletionRequest) -> dict[str, Any]:
    out: dict[str, Any] = {"id": req.id, "prefix": req.prefix, "suffix": req.suffix, "uri": req.uri,
                           "max_tokens": req.max_tokens, "multiline": req.multiline,
                           "priority": req.priority}
    if req.version is not None:
        out["version"] = req.version
    if req.language is not None:
        out["language"] = req.language
    if req.context:
        out["context"] = [{"uri": c.uri, "text": c.text} for c in req.context]
    if req.budget_ms is not None:
        out["budget_ms"] = req.budget_ms
    if req.temperature != 0.0 or req.n != 1:
        out.update(temperature=req.temperature, top_p=req.top_p, n=req.n)
    if req.seed is not None:
        out["seed"] = req.seed
    return out


def encode_client(msg: ClientMessage) -> str:
    """One JSON text frame for a client → daemon message (for clients)."""
    obj: dict[str, Any]
    if isinstance(msg, (Complete, Warm)):
        obj = {"type": "complete" if isinstance(msg, Complete) else "warm", **_request_to_json(msg.request)}
    elif isinstance(msg, Cancel):
        obj = {"type": "cancel", "id": msg.id}
    elif isinstance(msg, CompletionEvent):
        obj = {"type": "event", "id": msg.id, "kind": msg.kind, "item": msg.item}
        if msg.accepted_chars is not None:
            obj["accepted_chars"] = msg.accepted_chars
    elif isinstance(msg, Health):
        obj = {"type": "health"}
    else:
        obj = {"type": "debug", "parts": list(msg.parts)}
    if isinstance(msg, (Health, Debug)) and msg.id is not None:
        obj["id"] = msg.id
    obj["v"] = PROTOCOL_VERSION
    return _dumps(obj)


FINISH_REASONS: tuple[FinishReason, ...] = ("stop", "length", "budget", "cancelled", "superseded", "error")


def decode_server(data: bytes | str) -> ServerMessage:
    """Decode a daemon frame (for clients). Raises :class:`BadJson` or :class:`BadField` for
    anything but a version-1 daemon message."""
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        raise BadJson("daemon sent invalid JSON") from None
    if not isinstance(obj, dict):
        raise BadJson("daemon frame is not a JSON object")
    kind = obj.get("type")
    try:
        if kind == "delta":
            return Delta(str(obj["id"]), str(obj["text"]))
        if kind == "done":
            reason = obj["finish_reason"]
            if reason not in FINISH_REASONS:
                raise BadField(f"unknown finish reason {reason!r}")
            return Done(str(obj["id"]), tuple(str(i) for i in obj["items"]), reason,
                        Timings(**{k: v for k, v in (obj.get("timings") or {}).items() if k in _TIMING_FIELDS}),
                        tuple(str(e) for e in obj.get("ends") or ()),
                        None if obj.get("streamed") is None else str(obj["streamed"]))
        if kind == "error":
            return ErrorFrame(obj.get("id"), str(obj["code"]), str(obj["message"]),
                              bool(obj.get("retryable", False)), obj.get("hint"))
        if kind == "status":
            body = {k: v for k, v in obj.items() if k not in ("type", "kind", "id")}
            return Status(obj["kind"], body, obj.get("id"))
    except (KeyError, TypeError, ValueError) as exc:
        raise BadField(f"malformed {kind} frame: {exc}") from None
    raise BadField(f"unknown daemon frame type {kind!r}")
