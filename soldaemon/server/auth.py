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

This is the daemon's side (making the token, checking handshakes); a
client's reading of the token file, with the same safety checks, is
:func:`soldaemon.discovery.read_token`.
"""

from __future__ import annotations

import hmac
import os
import secrets
from pathlib import Path
from typing import Sequence

from soldaemon.discovery import check_private_dir, check_token_file, is_loopback_host
from soldaemon.errors import ConfigError
from soldaemon.server.handshake import host_is_loopback

TOKEN_BYTES = 32  # random bytes; the file holds their URL-safe base64 (43 chars)


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


def load_or_create_token(path: Path) -> str:
    """Return the token in ``path``, creating it first if it does not exist.

    Creation is atomic and race-free: the token is written to a private
    temporary file (mode 0600) and hard-linked into place, so a concurrent
    reader never sees a partial file and two daemons starting at once agree on
    one token. The parent directory is created with mode 0700. Raises
    :class:`ConfigError` for an existing file that is not private to this
    user, or when the file cannot be written."""
    try:
        return check_token_file(path)
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
    return check_token_file(path)


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
