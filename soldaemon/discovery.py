"""Finding the running daemon (for ``soldaemon status``, ``doctor`` and sol-lsp) and reading its
state files. A configured port is never sent the token (anyone may listen there while the
daemon is down); state files are trusted only if nobody else could have written them.
Light, for sol-lsp: imports only :mod:`soldaemon.errors`, :mod:`soldaemon.paths` (psutil
without ``/proc``)."""

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
# a token is one line of URL-safe base64
_TOKEN_CHARS = re.compile(r"[A-Za-z0-9_\-]{32,512}")
# an argv word that runs soldaemon: the script, ``soldaemon.cli``, ``-c`` code importing it
_NAMES_US = re.compile(r"(?<![\w-])soldaemon(?![\w-])")


def is_loopback_host(host: str) -> bool:
    """Whether ``host`` is ``localhost`` or a loopback address (not ``0.0.0.0``)."""
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
    """Raise :class:`ConfigError` when ``path`` (``info``: its ``lstat``) is another user's or
    writable by others; the hint is the fix."""
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        raise ConfigError(f"{what} {path} belongs to another user (uid {info.st_uid})",
                          hint="remove it (as its owner or root), or set SOLDAEMON_STATE_DIR to a private directory")
    if info.st_mode & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        raise ConfigError(f"{what} {path} is writable by other users (mode {mode:o}): anyone could plant files there",
                          hint=f"run: chmod go-w {path}")


def check_private_dir(path: Path) -> None:
    """Raise :class:`ConfigError` unless ``path`` is our directory that others cannot write."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the state directory {path} is not a directory", hint=f"remove {path}")
    refuse_unless_ours(path, info, "the state directory")


def make_private_dir(path: Path) -> Path:
    """The state directory ``path``, created 0700 when missing, checked, and tightened to 0700
    (with a warning) when others may read it."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(path)
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        os.chmod(path, mode & 0o700)
        log.warning("the state directory %s was readable by other users (mode %o); it is now mode %o",
                    path, mode, mode & 0o700)
    return path


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (not whether to trust it: :func:`is_our_daemon`)."""
    if pid <= 0:
        return pid == 0
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM
    return True


def _process(pid: int) -> tuple[int, list[str]] | None:
    """``(uid, argv)`` of a live process, or None (from ``/proc``, else psutil)."""
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
    """Whether ``pid`` is a live ``soldaemon … serve`` process of this user (console script,
    ``-m soldaemon.cli`` or ``-c`` code)."""
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
    """The record of a daemon still running as ours, or None (none, stale or unreadable).
    Raises :class:`ConfigError` when someone else could have written it, or it names a
    non-loopback URL without ``allow_remote``."""
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


def check_token_file(path: Path) -> str:
    """The token in ``path``. Raises :class:`FileNotFoundError`, or :class:`ConfigError` when
    others could read it or it holds no token (so no other private file is sent as one)."""
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
    """The token for a client. Raises :class:`Unavailable` when there is no token file yet,
    :class:`ConfigError` when it is unsafe."""
    try:
        return check_token_file(path)
    except FileNotFoundError:
        raise Unavailable(f"no token file at {path}",
                          hint="start the daemon first: soldaemon serve") from None


@dataclass(frozen=True)
class Fallback:
    """What the caller knows besides the record (never an address: the token goes only to a
    recorded daemon)."""

    token_path: Path | None = None          # None: default_token_path()
    allow_remote: bool = False              # a record may name a non-loopback URL


@dataclass(frozen=True)
class Target:
    """Where to connect and with what token."""

    url: str
    token: str
    token_path: Path
    source: str                             # where the URL came from, for messages
    pid: int | None = None                  # the daemon's, when known


def find_daemon(fallback: Fallback = Fallback(), *, url: str | None = None,
                token_path: Path | None = None) -> Target:
    """The daemon to connect to: ``url``, else a live ``daemon.json`` record; the token from
    ``token_path``, else the record's, else the fallback's.
    Raises :class:`Unavailable` (no daemon, no token file) or :class:`ConfigError`."""
    if url is not None:
        source, pid = "settings", None
    else:
        record = read_daemon_record(allow_remote=fallback.allow_remote)
        if record is None:
            raise Unavailable(f"no daemon running (no live daemon record at {record_path()})",
                              hint="start the daemon: soldaemon serve")
        url, source, pid = record.url, f"daemon.json (pid {record.pid})", record.pid
        token_path = token_path or record.token_path
    if token_path is None:
        token_path = fallback.token_path or default_token_path()
    return Target(url, read_token(token_path), token_path, source, pid)


class StartLock:
    """``start.lock`` in the state directory, held (``flock``) by the one client starting a
    daemon; the kernel drops it when its holder exits."""

    def __init__(self, directory: Path | None = None) -> None:
        self.path = (directory or state_dir()) / START_LOCK_NAME
        self._fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock without waiting: False when another process holds it. Raises
        ConfigError for a state directory that is not private."""
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
        """Whether another process holds the lock now."""
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
