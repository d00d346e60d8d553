"""The daemon's side of the state files: the private state directory and the daemon record
(``daemon.json``), which only the daemon writes. Reading them is :mod:`soldaemon.discovery`."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from pathlib import Path

from soldaemon.discovery import make_private_dir, record_path
from soldaemon.paths import state_dir


def ensure_state_dir(path: Path | None = None) -> Path:
    """The state directory, created 0700 when missing, checked and tightened either way."""
    return make_private_dir(path or state_dir())


def write_private(path: Path, text: str, *, overwrite: bool = True) -> None:
    """Write ``text`` to ``path`` (0600) through a fresh private temporary file (``O_EXCL |
    O_NOFOLLOW``: never an existing file or a planted link), fsynced, then renamed over ``path``;
    ``overwrite=False`` links it instead and leaves a file already there."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if overwrite:
            os.replace(tmp, path)
        else:
            with contextlib.suppress(FileExistsError):
                os.link(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def write_daemon_record(url: str, token_path: Path) -> Path:
    """Write ``daemon.json`` atomically (:func:`write_private`)."""
    path = record_path()
    ensure_state_dir(path.parent)
    write_private(path, json.dumps({"pid": os.getpid(), "url": url, "token_file": str(token_path)}))
    return path


def remove_daemon_record(path: Path) -> None:
    """Remove ``path`` if it is this process's record."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        if json.loads(path.read_text()).get("pid") == os.getpid():
            path.unlink()
