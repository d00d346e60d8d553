"""Finding the running daemon: the one rule ``soldaemon status``, ``soldaemon
doctor`` and sol-lsp share (the VS Code extension leaves it to sol-lsp), and
the *read* side of the state files the daemon writes.

:func:`find_daemon`:

1. the URL given (``--url``, or sol-lsp's ``url`` setting), when given;
2. else the running daemon's record, ``daemon.json`` in the state directory
   (written by ``soldaemon serve`` once ready; ignored unless its pid is a
   live ``soldaemon … serve`` process of this user, :func:`is_our_daemon`;
   refused when another user could have written it, or it names a
   non-loopback URL without ``allow_remote``);
3. else no daemon runs: :class:`~soldaemon.errors.Unavailable` ("no daemon
   running"), and nothing is sent anywhere. A configured port is not an
   address to send the token to: while the daemon is down any local user
   can listen there. (:class:`Fallback` carries the caller's token file and
   ``allow_remote``; its ``url`` is for callers that name one on purpose.)

The token comes from the token file given, else the record's, else the
caller's — read with :func:`read_token`, so an unsafe token file is refused.

The state directory and ``daemon.json`` are trusted only when nobody else
could have written them: another local user who can write the state
directory could plant a record naming their own port and any private file of
ours as the "token file", and a client that trusted it would send that
file's contents to them as a Bearer token. So the directory must be ours and
not writable by group or others (:func:`check_private_dir`); the record must
be a regular file of ours, not group/other-writable, naming a loopback URL
unless remote access is allowed (:func:`read_daemon_record`); the token file
must be ours, mode 0600, no link, and hold one URL-safe token line
(:func:`read_token`). Every refusal is a :class:`~soldaemon.errors.ConfigError`
whose hint is the command that fixes it. The writing side (creating the
directory, the record and the token) is :mod:`soldaemon.server.statefiles`
and :mod:`soldaemon.server.auth`.

Light on purpose: sol-lsp imports it, so it loads no config (no YAML
reader), no websocket server, prometheus or torch — only
:mod:`soldaemon.errors` and :mod:`soldaemon.paths` (and psutil where
``/proc`` is missing, when a record is read).
"""

from __future__ import annotations

import errno
import ipaddress
import json
import logging
import os
import re
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from soldaemon.errors import ConfigError, Unavailable
from soldaemon.paths import state_dir

__all__ = ["DaemonRecord", "Fallback", "StartLock", "Target", "check_private_dir", "check_token_file",
           "default_token_path", "find_daemon", "is_loopback_host", "is_our_daemon", "make_private_dir", "pid_exists",
           "read_daemon_record", "read_token", "record_path", "ws_url"]

log = logging.getLogger("soldaemon.discovery")

RECORD_NAME = "daemon.json"
TOKEN_NAME = "token"
START_LOCK_NAME = "start.lock"
# a token is one line of URL-safe base64: a private key or any other private
# file named as the token file is never sent as one
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]{32,512}")
# an argv word that runs soldaemon: the script, ``soldaemon.cli``, ``-c`` code importing it
_NAMES_US = re.compile(r"(?<![\w-])soldaemon(?![\w-])")


# --------------------------------------------------------------------------
# Addresses
# --------------------------------------------------------------------------


def is_loopback_host(host: str) -> bool:
    """True when ``host`` only listens locally: ``localhost`` or a loopback
    IPv4/IPv6 address (``127.0.0.0/8``, ``::1``). Any other name or address
    (``0.0.0.0``, ``::``, a hostname) is not loopback."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def url_is_loopback(url: str) -> bool:
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return False
    return host is not None and is_loopback_host(host)


def ws_url(host: str, port: int) -> str:
    """The websocket URL of ``host:port`` (an IPv6 host in brackets)."""
    return f"ws://[{host}]:{port}" if ":" in host else f"ws://{host}:{port}"


# --------------------------------------------------------------------------
# The state directory and the daemon's record
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class DaemonRecord:
    url: str
    token_path: Path
    pid: int


def record_path() -> Path:
    return state_dir() / RECORD_NAME


def default_token_path() -> Path:
    """``state_dir()/token`` (resolved now, so it follows ``SOLDAEMON_STATE_DIR``)."""
    return state_dir() / TOKEN_NAME


def refuse_unless_ours(path: Path, info: os.stat_result, what: str) -> None:
    """Raise :class:`ConfigError` when ``path`` (``info`` its ``lstat``) is
    another user's or writable by group/others."""
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"{what} {path} belongs to another user (uid {info.st_uid})",
                          hint="remove it (as its owner or root), or set SOLDAEMON_STATE_DIR to a private directory")
    if info.st_mode & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        raise ConfigError(f"{what} {path} is writable by other users (mode {mode:o}): anyone could plant files there",
                          hint=f"run: chmod go-w {path}")


def check_private_dir(path: Path) -> None:
    """Raise :class:`ConfigError` when ``path`` (an existing directory) is
    another user's or writable by group/others."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the state directory {path} is not a directory", hint=f"remove {path}")
    refuse_unless_ours(path, info, "the state directory")


def make_private_dir(path: Path) -> Path:
    """The state directory ``path``, created 0700 when missing and checked
    (:func:`check_private_dir`). One that others may read or enter (0755:
    the rotated ``daemon.log`` and ``doctor.txt`` readable by every local
    user) is tightened to 0700, with a warning that says so."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, mode & 0o700)
        log.warning("the state directory %s was readable by other users (mode %o); it is now mode %o",
                    path, mode, mode & 0o700)
    return path


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 checks without sending;
    EPERM: it exists, another user's). Not a reason to trust or signal it:
    :func:`is_our_daemon` is."""
    if pid <= 0:
        return pid == 0
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def _process(pid: int) -> tuple[int, list[str]] | None:
    """``(uid, argv)`` of a live process, ``None`` when there is none (or
    it cannot be read). ``/proc`` where there is one, else psutil."""
    proc = Path(f"/proc/{pid}")
    if Path("/proc/self").exists():
        try:
            uid = proc.stat().st_uid
            argv = (proc / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
        except OSError:
            return None
        return uid, [a for a in argv if a]
    import psutil

    try:
        p = psutil.Process(pid)
        return int(p.uids().real), list(p.cmdline())
    except (psutil.Error, OSError):
        return None


def is_our_daemon(pid: int) -> bool:
    """Whether ``pid`` is a live ``soldaemon … serve`` process of this user:
    its owner is us, and its command line runs ``soldaemon`` (the console
    script, ``-m soldaemon.cli``, or ``-c`` code importing it) with
    ``serve``. A pid reused by another
    user's process, or by any process that is not a daemon, is not."""
    if pid <= 1:
        return False
    found = _process(pid)
    if found is None:
        return False
    uid, argv = found
    if hasattr(os, "getuid") and uid != os.getuid():
        return False
    # a path by its last part (a checkout named soldaemon/ holds other programs), code whole
    return "serve" in argv and any(_NAMES_US.search(a if " " in a else os.path.basename(a)) for a in argv)


def read_daemon_record(*, allow_remote: bool = False) -> DaemonRecord | None:
    """The record of a daemon whose process is still ours
    (:func:`is_our_daemon`); ``None`` when there is none (or it is stale:
    its pid gone or reused, or it is unreadable). Raises
    :class:`ConfigError` when the directory or the file could have been
    written by someone else, or the URL is not loopback and
    ``allow_remote`` is off."""
    path = record_path()
    try:
        check_private_dir(path.parent)
        info = path.lstat()
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path} is not a regular file", hint=f"run: rm {path}")
    refuse_unless_ours(path, info, "the daemon record")
    try:
        data = json.loads(path.read_text())
        record = DaemonRecord(str(data["url"]), Path(data["token_file"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not is_our_daemon(record.pid):
        return None
    if not allow_remote and not url_is_loopback(record.url):
        raise ConfigError(f"{path} names a daemon at {record.url}, which is not a loopback address",
                          hint=f"run: rm {path}  (a daemon you run remotely on purpose: server.allow_remote: true "
                               "for soldaemon status, the url setting for sol-lsp)")
    return record


# --------------------------------------------------------------------------
# The token file
# --------------------------------------------------------------------------


def check_token_file(path: Path) -> str:
    """The token in an existing token file, refusing one that others could
    read or that holds no token. Raises :class:`FileNotFoundError` when
    there is none and :class:`ConfigError` when it is unsafe."""
    info = path.lstat()
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"token file {path} is not a regular file",
                          hint="remove it; the daemon creates a new token at start-up")
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
    if not _TOKEN_CHARS.fullmatch(token):
        raise ConfigError(f"token file {path} holds no valid token",
                          hint=f"delete {path}; a new token is made at the next start")
    return token


def read_token(path: Path) -> str:
    """The token for a client (``soldaemon status``, the language server).
    Raises :class:`Unavailable` when there is no token file yet (no daemon has
    ever started) and :class:`ConfigError` when it is unsafe."""
    try:
        return check_token_file(path)
    except FileNotFoundError:
        raise Unavailable(f"no token file at {path}",
                          hint="start the daemon first: soldaemon serve") from None


# --------------------------------------------------------------------------
# Finding the daemon
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Fallback:
    """What the caller knows besides the record: an address it names on
    purpose (``None``, what every command-line client and sol-lsp pass: no
    record means no daemon), the token file, and whether a record may name
    a non-loopback URL. ``source`` names where it came from, for messages."""

    url: str | None = None
    token_path: Path | None = None          # None: default_token_path()
    allow_remote: bool = False
    source: str = "sol_config.yaml"


@dataclass(frozen=True)
class Target:
    """Where to connect and with what token. ``source`` says where the URL
    came from (for messages); ``pid`` is the daemon's when known."""

    url: str
    token: str
    token_path: Path
    source: str
    pid: int | None = None


def find_daemon(fallback: Fallback = Fallback(), *, url: str | None = None,
                token_path: Path | None = None) -> Target:
    """See the module docstring. Raises :class:`soldaemon.errors.Unavailable`
    when there is no daemon record and no fallback address, or no token file
    (no daemon ever started), and :class:`soldaemon.errors.ConfigError` for
    an unsafe record or token file."""
    if url is not None:
        source, pid = "settings", None
    else:
        record = read_daemon_record(allow_remote=fallback.allow_remote)
        if record is not None:
            url, source, pid = record.url, f"daemon.json (pid {record.pid})", record.pid
            token_path = token_path or record.token_path
        elif fallback.url is not None:
            url, source, pid = fallback.url, fallback.source, None
        else:
            raise Unavailable(f"no daemon running (no live daemon record at {record_path()})",
                              hint="start the daemon: soldaemon serve")
    if token_path is None:
        token_path = fallback.token_path or default_token_path()
    return Target(url, read_token(token_path), token_path, source, pid)


# --------------------------------------------------------------------------
# The start lock
# --------------------------------------------------------------------------


class StartLock:
    """``start.lock`` in the state directory, held (``flock``, exclusive) by
    the one client that is starting a daemon, so that two editors opening at
    once start one daemon, not two. The kernel drops the lock when its
    holder exits, so a crashed client never blocks the next start."""

    def __init__(self, directory: Path | None = None) -> None:
        self.path = (directory or state_dir()) / START_LOCK_NAME
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """We hold it."""
        return self._fd is not None

    def acquire(self) -> bool:
        """Take the lock without waiting; False when another process holds
        it. Raises ConfigError for a state directory that is not private."""
        import fcntl

        if self._fd is not None:
            return True
        make_private_dir(self.path.parent)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def busy(self) -> bool:
        """Another process holds the lock now (it is starting a daemon)."""
        if self._fd is not None:
            return False
        if not self.acquire():
            return True
        self.release()
        return False

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)
