"""The server's settings, and the Sol diagnosis keys that ``health`` and ``soldaemon status``
show."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from soldaemon.paths import state_dir
from soldaemon.protocol import DEFAULT_LIMITS, Limits

if TYPE_CHECKING:
    from soldaemon.config import CompletionConfig, ServerConfig

SOL_DIAGNOSIS_KEYS = ("active", "ttft_optimized", "prefetch_hit_rate", "kv_fold_ratio", "offloaded_layers")


@dataclass(frozen=True)
class ServerSettings:
    """Everything the server needs, built once from ``config.server``."""

    host: str = "127.0.0.1"
    port: int = 8765                               # 0: any free port
    allow_remote: bool = False
    allowed_origins: tuple[str, ...] = ()
    token_path: Path = field(default_factory=lambda: state_dir() / "token")
    rate_limit_per_s: float = 200.0                # frames/s per connection; burst = 2×
    drain_timeout_s: float = 5.0                   # s
    max_in_flight_per_connection: int = 32
    max_in_flight: int = 256
    max_outbox_frames: int = 20_000                # unread frames before a connection is closed
    max_outbox_bytes: int = 8 * 1024 * 1024        # unread bytes before a connection is closed
    max_connections: int = 64                      # more are refused (503) at the handshake
    handshake_timeout_s: float = 3.0               # s from the TCP accept to a finished handshake
    max_handshakes: int = 64                       # handshakes in progress; past it the oldest is closed
    max_handshakes_per_peer: int = 16              # the same, per peer address
    idle_exit_s: float = 0.0                       # s without a connection before exiting; 0: never
    # the frame size limit, and the defaults of fields a complete message leaves out (config completion:)
    limits: Limits = DEFAULT_LIMITS

    @classmethod
    def from_config(cls, server: ServerConfig, completion: CompletionConfig) -> ServerSettings:
        limits = Limits(max_message_bytes=server.max_message_bytes, default_max_tokens=completion.max_tokens,
                        default_budget_ms=completion.budget_ms, default_multiline=completion.multiline,
                        default_temperature=completion.temperature, default_top_p=completion.top_p)
        return cls(host=server.host, port=server.port, allow_remote=server.allow_remote,
                   allowed_origins=tuple(server.allowed_origins), token_path=server.token_path(),
                   rate_limit_per_s=server.rate_limit_per_s, drain_timeout_s=server.drain_timeout_s,
                   idle_exit_s=server.idle_exit_s, limits=limits)
