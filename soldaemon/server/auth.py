"""Who may talk to the daemon (docs/protocol.md §2): the per-user bearer token on every request,
Origin allow-listing, a loopback ``Host`` while on loopback (against DNS rebinding), and
loopback binding unless allowed. The daemon's side; clients read the token with
:func:`soldaemon.discovery.read_token`."""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path
from typing import Sequence

from soldaemon.discovery import check_private_dir, check_token_file, is_loopback_host
from soldaemon.errors import ConfigError
from soldaemon.server.handshake import host_is_loopback
from soldaemon.server.statefiles import write_private

TOKEN_BYTES = 32  # random bytes; the file holds their URL-safe base64 (43 chars)


def check_bind(host: str, allow_remote: bool) -> None:
    """Raise :class:`ConfigError` for a non-loopback ``host`` unless ``allow_remote``."""
    if not allow_remote and not is_loopback_host(host):
        raise ConfigError(
            f"refusing to listen on {host!r}: not a loopback address, so anyone who can reach "
            "this machine could use the daemon",
            hint="listen on 127.0.0.1 (the default), or set server.allow_remote: true "
                 "(or pass --allow-remote) if you really mean it",
        )


def load_or_create_token(path: Path) -> str:
    """The token in ``path``, created first if missing (parent 0700). Creation writes a private
    temporary file and hard-links it into place, so readers never see a partial file and two
    daemons starting at once agree on one token. Raises :class:`ConfigError` for a file not
    private to this user or one that cannot be written."""
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
        # not over a file already there: another daemon won the race, and its token is used
        write_private(path, secrets.token_urlsafe(TOKEN_BYTES) + "\n", overwrite=False)
    except OSError as exc:
        raise ConfigError(f"cannot create the token file {path}: {exc.strerror or exc}",
                          hint="check that the state directory is writable, or set server.token_file") from None
    return check_token_file(path)


def bearer_ok(authorization: str | None, token: str) -> bool:
    """True when the header value is ``Bearer <token>``; constant-time in the token's content."""
    if not authorization:
        return False
    scheme, _, presented = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(presented.strip().encode("utf-8", "replace"), token.encode("utf-8"))


def origin_ok(origin: str | None, allowed: Sequence[str]) -> bool:
    """No ``Origin`` (a non-browser client) passes; otherwise it must be listed (case-insensitive,
    no trailing slash). ``"null"`` is refused unless listed."""
    if origin is None:
        return True
    wanted = origin.strip().rstrip("/").lower()
    return any(wanted == a.strip().rstrip("/").lower() for a in allowed)


def host_header_ok(host_header: str | None, listening_on_loopback: bool) -> bool:
    """On loopback the ``Host`` header must name a loopback host (against DNS rebinding);
    anything goes when remote access is on (the token still applies)."""
    return not listening_on_loopback or host_is_loopback(host_header)


def authorization_header(token: str) -> tuple[str, str]:
    """The handshake header a client sends."""
    return ("Authorization", f"Bearer {token}")
