"""Who may talk to the daemon: the per-user token, the Origin and Host checks,
and the bind-address rule. Pure functions over strings and files; the server
calls them from its HTTP handshake hook.

The rules (docs/protocol.md §2):

- a random token lives in ``state_dir()/token`` (mode 0600, directory 0700) and
  must be presented as ``Authorization: Bearer <token>`` on every connection
  and HTTP request;
- a request carrying an ``Origin`` header (every browser sends one) is refused
  unless that origin is allow-listed;
- while listening on loopback, the ``Host`` header must name a loopback host
  (defeats DNS rebinding);
- the daemon listens on a non-loopback address only when explicitly allowed.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Sequence

from soldaemon.config import is_loopback_host
from soldaemon.errors import ConfigError, Unavailable
from soldaemon.server.handshake import host_is_loopback
from soldaemon.server.statefiles import check_private_dir

TOKEN_BYTES = 32  # random bytes; the file holds their URL-safe base64 (43 chars)
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]{32,512}")


def check_bind(host: str, allow_remote: bool) -> None:
    """Raise :class:`ConfigError` when ``host`` is not loopback and remote
    access was not explicitly allowed."""
    if not allow_remote and not is_loopback_host(host):
        raise ConfigError(
            f"refusing to listen on {host!r}: not a loopback address, so anyone who can reach "
            "this machine could use the daemon",
            hint="listen on 127.0.0.1 (the default), or set server.allow_remote: true "
                 "(or pass --allow-remote) if you really mean it",
        )


# --------------------------------------------------------------------------
# The token file
# --------------------------------------------------------------------------


def _check_token_file(path: Path) -> str:
    """Read an existing token file, refusing one that others could read."""
    try:
        info = path.lstat()
    except FileNotFoundError:
        raise
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"token file {path} is not a regular file",
                          hint=f"remove it; the daemon creates a new token at start-up")
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"token file {path} belongs to another user",
                          hint="remove it; the daemon creates a new token at start-up")
    if info.st_mode & 0o077:
        raise ConfigError(
            f"token file {path} is readable by other users (mode {stat.S_IMODE(info.st_mode):o}); "
            "the token may have leaked",
            hint=f"delete {path} (a new token is made at the next start) or run: chmod 600 {path}",
        )
    token = path.read_text(encoding="ascii", errors="replace").strip()
    # a token is one line of URL-safe base64: a private key or any other
    # private file named as the token file is never sent as one
    if not _TOKEN_CHARS.fullmatch(token):
        raise ConfigError(f"token file {path} holds no valid token",
                          hint=f"delete {path}; a new token is made at the next start")
    return token


def load_or_create_token(path: Path) -> str:
    """Return the token in ``path``, creating it first if it does not exist.

    Creation is atomic and race-free: the token is written to a private
    temporary file (mode 0600) and hard-linked into place, so a concurrent
    reader never sees a partial file and two daemons starting at once agree on
    one token. The parent directory is created with mode 0700. Raises
    :class:`ConfigError` for an existing file that is not private to this
    user, or when the file cannot be written."""
    try:
        return _check_token_file(path)
    except FileNotFoundError:
        pass
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the token file's directory {path.parent}: {exc.strerror or exc}",
                          hint="check that the state directory is writable, or set server.token_file") from None
    check_private_dir(path.parent)
    try:
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            with os.fdopen(fd, "w", encoding="ascii") as f:
                f.write(secrets.token_urlsafe(TOKEN_BYTES) + "\n")
                f.flush()
                os.fsync(f.fileno())
            try:
                os.link(tmp, path)
            except FileExistsError:
                pass  # another daemon won the race; use its token
        finally:
            tmp.unlink(missing_ok=True)
    except OSError as exc:
        raise ConfigError(f"cannot create the token file {path}: {exc.strerror or exc}",
                          hint="check that the state directory is writable, or set server.token_file") from None
    return _check_token_file(path)


def read_token(path: Path) -> str:
    """The token for a client (``soldaemon status``, the language server).
    Raises :class:`Unavailable` when there is no token file yet (no daemon has
    ever started) and :class:`ConfigError` when it is unsafe."""
    try:
        return _check_token_file(path)
    except FileNotFoundError:
        raise Unavailable(f"no token file at {path}",
                          hint="start the daemon first: soldaemon serve") from None


# --------------------------------------------------------------------------
# Handshake checks
# --------------------------------------------------------------------------


def bearer_ok(authorization: str | None, token: str) -> bool:
    """True when the ``Authorization`` header value is ``Bearer <token>``.
    Constant-time in the token's content."""
    if not authorization:
        return False
    scheme, _, presented = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token.encode("utf-8"))


def origin_ok(origin: str | None, allowed: Sequence[str]) -> bool:
    """No ``Origin`` header (a non-browser client) is fine; otherwise the
    origin must be listed exactly (compared case-insensitively, no trailing
    slash). ``"null"`` (sandboxed frames, files) is refused unless listed."""
    if origin is None:
        return True
    wanted = origin.strip().rstrip("/").lower()
    return any(wanted == a.strip().rstrip("/").lower() for a in allowed)


def host_header_ok(host_header: str | None, listening_on_loopback: bool) -> bool:
    """While the daemon listens on loopback, the ``Host`` header must name a
    loopback host (any port), so a page on a rebound DNS name cannot reach
    it. Anything goes when remote access is on (the token still applies)."""
    if not listening_on_loopback:
        return True
    return host_is_loopback(host_header)


def authorization_header(token: str) -> tuple[str, str]:
    """The handshake header a client sends."""
    return ("Authorization", f"Bearer {token}")
