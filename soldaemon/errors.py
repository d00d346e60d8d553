"""One error hierarchy: every error a user or client can see is a :class:`SolError` with a
stable ``code``, a message (what is wrong) and a ``hint`` (what to do); each boundary maps it
to its own shape (error frame, JSON-RPC error, exit code), never a traceback."""

from __future__ import annotations


class SolError(Exception):
    """Base class. ``code`` is stable and documented; ``retryable``: the same request may
    succeed if sent again."""

    code: str = "internal"
    exit_code: int = 1
    retryable: bool = False

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        if self.hint:
            return f"{self.message}\n  hint: {self.hint}"
        return self.message


class ConfigError(SolError):
    """The configuration file is unreadable or a value is invalid."""

    code = "config"
    exit_code = 2


class ModelError(SolError):
    """The model cannot be found, verified, converted or loaded."""

    code = "model"
    exit_code = 3


class ModelPartsMissing(ModelError):
    code = "model_parts_missing"


class ModelHashMismatch(ModelError):
    code = "model_hash_mismatch"


class NoFimTokens(ModelError):
    code = "model_no_fim"


class OutOfMemory(ModelError):
    code = "out_of_memory"


class BadRequest(SolError):
    """A client sent something invalid; the connection lives on."""

    code = "bad_request"
    exit_code = 2


class Busy(SolError):
    code = "busy"
    retryable = True


class Unavailable(SolError):
    """The daemon (or a backend) cannot be reached or is not ready."""

    code = "unavailable"
    exit_code = 4
    retryable = True


# Protocol: one class per stable code, all BadRequest but RateLimited (retryable)


class ProtocolError(BadRequest):
    """A frame the daemon cannot accept; ``request_id``: its ``id`` when readable."""

    def __init__(self, message: str, *, request_id: str | None = None, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.request_id = request_id


class BadUtf8(ProtocolError):
    code = "bad_utf8"


class BadJson(ProtocolError):
    code = "bad_json"


class BadField(ProtocolError):
    """A field is missing, has the wrong type, or is out of range."""

    code = "bad_field"


class TooLarge(ProtocolError):
    """A frame or a field is over its size limit."""

    code = "too_large"


class UnknownType(ProtocolError):
    code = "unknown_type"


class UnsupportedVersion(ProtocolError):
    code = "unsupported_version"


class UnknownId(ProtocolError):
    """A ``cancel`` names no request in flight on this connection."""

    code = "unknown_id"


class DuplicateId(ProtocolError):
    """A ``complete``/``warm`` reuses the id of a request still in flight."""

    code = "duplicate_id"


class RateLimited(Busy):
    """A frame over the connection's rate limit, dropped (retryable)."""

    code = "rate_limited"


# Remote engine (an OpenAI-compatible completions server)


class RemoteUnavailable(Unavailable):
    """The engine cannot be reached, or the daemon is backing off after that."""

    code = "remote_unavailable"


class RemoteTimeout(Unavailable):
    """The engine did not answer (or stream the next chunk) in time."""

    code = "remote_timeout"


class RemoteHttpError(SolError):
    """The engine answered an HTTP error status (retryable for 5xx and 429)."""

    code = "remote_http"
    exit_code = 4

    def __init__(self, status: int, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.retryable = status >= 500 or status == 429


class RemoteBadResponse(SolError):
    """The engine's answer is not an OpenAI completions stream (not retryable)."""

    code = "remote_bad_response"
    exit_code = 4


# Daemon start


class AddressInUse(Unavailable):
    """The port is taken (often: another soldaemon is already running)."""

    code = "address_in_use"


# Machine probes (internal: doctor turns them into findings)


class ProbeUnavailable(Exception):
    """A whole source (NVML) cannot be used; ``str(exc)``: why, briefly."""


# Control flow inside the engine


class Cancelled(Exception):
    """Raised inside prefill when the cancel check fires between chunks."""


# Memory planning


class BudgetTooSmall(ValueError):
    """The memory budget cannot hold even the never-offloaded part."""
