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
