"""The state directory and the running daemon's record (``daemon.json``),
trusted only when nobody else could have written them.

Another local user who can write the state directory can plant a
``daemon.json`` naming their own port and any private file of ours as the
"token file"; a client that trusts it sends that file's contents to them as
a Bearer token. So:

- the state directory must be ours and not writable by group or others
  (:func:`check_private_dir`; created 0700 by :func:`ensure_state_dir`);
- ``daemon.json`` must be a regular file of ours, not group/other-writable,
  and its URL must be loopback unless remote access is allowed
  (:func:`read_daemon_record`);
- it is written through a fresh ``O_EXCL | O_NOFOLLOW`` temporary file,
  fsynced, then renamed (:func:`write_daemon_record`).

Every refusal is a :class:`~soldaemon.errors.ConfigError` whose hint is the
command that fixes it.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import stat
import urllib.parse
from dataclasses import dataclass
from pathlib import Path

from soldaemon.config import is_loopback_host
from soldaemon.errors import ConfigError
from soldaemon.paths import state_dir

RECORD_NAME = "daemon.json"


@dataclass(frozen=True)
class DaemonRecord:
    url: str
    token_path: Path
    pid: int


def record_path() -> Path:
    return state_dir() / RECORD_NAME


def _not_ours(path: Path, info: os.stat_result, what: str) -> ConfigError | None:
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return ConfigError(f"{what} {path} belongs to another user (uid {info.st_uid})",
                           hint=f"remove it (as its owner or root), or set SOLDAEMON_STATE_DIR to a private directory")
    if info.st_mode & 0o022:
        mode = stat.S_IMODE(info.st_mode)
        return ConfigError(f"{what} {path} is writable by other users (mode {mode:o}): anyone could plant files there",
                           hint=f"run: chmod go-w {path}")
    return None


def check_private_dir(path: Path) -> None:
    """Raise :class:`ConfigError` when ``path`` (an existing directory) is
    another user's or writable by group/others."""
    info = path.stat()
    if not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"the state directory {path} is not a directory", hint=f"remove {path}")
    problem = _not_ours(path, info, "the state directory")
    if problem is not None:
        raise problem


def ensure_state_dir(path: Path | None = None) -> Path:
    """The state directory, created 0700 when missing; checked either way."""
    directory = path or state_dir()
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    check_private_dir(directory)
    return directory


def write_daemon_record(url: str, token_path: Path) -> Path:
    """Write ``daemon.json`` atomically: a new private temporary file
    (``O_EXCL | O_NOFOLLOW``: never an existing file or a planted link),
    fsynced, renamed into place."""
    path = record_path()
    ensure_state_dir(path.parent)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "url": url, "token_file": str(token_path)}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
    return path


def remove_daemon_record(path: Path) -> None:
    """Remove ``path`` if it is this process's record."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()


def pid_exists(pid: int) -> bool:
    """Whether a process ``pid`` exists (signal 0 checks without sending).
    Not psutil: sol-lsp reads the record, and stays light."""
    if pid <= 0:
        return pid == 0
    try:
        os.kill(pid, 0)
    except OSError as exc:
        return exc.errno == errno.EPERM     # exists, but another user's
    return True


def url_is_loopback(url: str) -> bool:
    try:
        host = urllib.parse.urlsplit(url).hostname
    except ValueError:
        return False
    return host is not None and is_loopback_host(host)


def read_daemon_record(*, allow_remote: bool = False) -> DaemonRecord | None:
    """The record of a daemon whose process still exists; ``None`` when
    there is none (or it is stale or unreadable). Raises
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
    problem = _not_ours(path, info, "the daemon record")
    if problem is not None:
        raise problem
    try:
        data = json.loads(path.read_text())
        record = DaemonRecord(str(data["url"]), Path(data["token_file"]), int(data["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not pid_exists(record.pid):
        return None
    if not allow_remote and not url_is_loopback(record.url):
        raise ConfigError(f"{path} names a daemon at {record.url}, which is not a loopback address",
                          hint=f"run: rm {path}  (or set server.allow_remote: true if you really run it remotely)")
    return record


START_LOCK_NAME = "start.lock"


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
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        check_private_dir(self.path.parent)
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
