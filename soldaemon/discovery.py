"""Finding the running daemon: the one rule ``soldaemon status`` and sol-lsp
share (the VS Code extension follows the same order in TypeScript).

:func:`find_daemon`:

1. the URL given (``--url``, or sol-lsp's ``url`` setting), when given;
2. else the running daemon's record, ``daemon.json`` in the state directory
   (written by ``soldaemon serve`` once ready; ignored when its pid is gone;
   refused when another user could have written it, or it names a
   non-loopback URL without ``server.allow_remote`` — see
   :mod:`soldaemon.server.statefiles`);
3. else ``server.host``/``server.port`` of sol_config.yaml.

The token comes from the token file given, else the record's, else
``server.token_file``/the state directory — read with
:func:`soldaemon.server.auth.read_token`, so an unsafe token file is refused.

Light on purpose: sol-lsp imports it, so no websocket server, prometheus,
psutil or torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from soldaemon.server.auth import read_token
from soldaemon.config import Config, load_config
from soldaemon.paths import state_dir
from soldaemon.server.statefiles import StartLock, check_private_dir, read_daemon_record

# StartLock and read_daemon_record: for sol-lsp's launcher (lsp/ imports this
# module, not statefiles).
__all__ = ["StartLock", "Target", "check_private_dir", "find_daemon", "read_daemon_record", "state_dir", "ws_url"]


@dataclass(frozen=True)
class Target:
    """Where to connect and with what token. ``source`` says where the URL
    came from (for messages); ``pid`` is the daemon's when known."""

    url: str
    token: str
    token_path: Path
    source: str
    pid: int | None = None


def ws_url(host: str, port: int) -> str:
    """The websocket URL of ``host:port`` (an IPv6 host in brackets)."""
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"


def find_daemon(config: Config | str | None = None, *, url: str | None = None,
                token_path: Path | None = None) -> Target:
    """See the module docstring. ``config`` is the loaded config, or the
    sol_config.yaml to load (``None``: the usual search), loaded only when
    needed. Raises :class:`soldaemon.errors.Unavailable` when there is no
    token file (no daemon ever started) and
    :class:`soldaemon.errors.ConfigError` for a bad config, record or token
    file."""
    loaded: list[Config] = [config] if isinstance(config, Config) else []

    def cfg() -> Config:
        if not loaded:
            loaded.append(load_config(config if isinstance(config, str) else None))
        return loaded[0]

    if url is not None:
        source, pid = "settings", None
    else:
        record = read_daemon_record(allow_remote=cfg().server.allow_remote)
        if record is not None:
            url, source, pid = record.url, f"daemon.json (pid {record.pid})", record.pid
            token_path = token_path or record.token_path
        else:
            url, source, pid = ws_url(cfg().server.host, cfg().server.port), "sol_config.yaml", None
    if token_path is None:
        token_path = cfg().server.token_path()
    return Target(url, read_token(token_path), token_path, source, pid)
