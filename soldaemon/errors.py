"""One error hierarchy for the whole daemon.

Every error a user or a client can see is a :class:`SolError` with a stable
``code`` (used in websocket ``error`` frames, JSON-RPC errors and CLI exit
codes), a message that says what is wrong, and a ``hint`` that says what to do.
No traceback crosses a boundary: each boundary maps ``SolError`` to its own
shape (see ``soldaemon.cli`` for exit codes).
"""

from __future__ import annotations


class SolError(Exception):
    """Base class. ``code`` is stable and documented; ``retryable`` tells a
    client whether sending the same request again may succeed."""

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


# --------------------------------------------------------------------------
# Protocol: one class per stable code. All are BadRequest (the client sent
# something wrong; the connection lives on) except RateLimited (retryable).
# --------------------------------------------------------------------------


class ProtocolError(BadRequest):
    """A frame the daemon cannot accept. ``request_id`` is the offending
    message's ``id`` when it could be read, else ``None``."""

    code = "bad_request"

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
    """The connection sent frames faster than its rate limit; the frame was
    dropped. Retryable after a short wait."""

    code = "rate_limited"


# --------------------------------------------------------------------------
# Remote engine (an OpenAI-compatible completions server)
# --------------------------------------------------------------------------


class RemoteUnavailable(Unavailable):
    """The engine cannot be reached (refused, reset, closed mid-stream), or
    the daemon is backing off after such failures."""

    code = "remote_unavailable"


class RemoteTimeout(Unavailable):
    """The engine did not answer (or stream the next chunk) in time."""

    code = "remote_timeout"


class RemoteHttpError(SolError):
    """The engine answered with an HTTP error status. Retryable for 5xx and
    429 (overloaded, restarting), not for other 4xx (wrong URL, model, key)."""

    code = "remote_http"
    exit_code = 4

    def __init__(self, status: int, message: str, *, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.retryable = status >= 500 or status == 429


class RemoteBadResponse(SolError):
    """The engine answered something that is not the OpenAI completions
    stream (not JSON, wrong schema): usually ``backend.url`` points at
    another service. Not retryable."""

    code = "remote_bad_response"
    exit_code = 4


# --------------------------------------------------------------------------
# Daemon start
# --------------------------------------------------------------------------


class AddressInUse(Unavailable):
    """The port is taken (often: another soldaemon is already running)."""

    code = "address_in_use"


# --------------------------------------------------------------------------
# Machine probes (internal: doctor turns them into findings)
# --------------------------------------------------------------------------


class ProbeUnavailable(Exception):
    """A whole source (NVML, ``nvidia-smi``) cannot be used. ``str(exc)`` is a
    short reason for the user ("NVML Shared Library Not Found", "not found")."""


class CommandFailed(Exception):
    """``nvidia-smi`` ran and exited non-zero (or timed out). ``output`` is
    what it printed; ``returncode`` is ``None`` for a timeout."""

    def __init__(self, returncode: int | None, output: str) -> None:
        super().__init__(output.strip() or f"exit status {returncode}")
        self.returncode = returncode
        self.output = output


# --------------------------------------------------------------------------
# Control flow inside the engine
# --------------------------------------------------------------------------


class Cancelled(Exception):
    """Raised inside prefill when the cancel check fires between chunks."""


# --------------------------------------------------------------------------
# Memory planning
# --------------------------------------------------------------------------


class BudgetTooSmall(ValueError):
    """The memory budget cannot hold even the never-offloaded part."""
