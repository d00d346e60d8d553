"""One ``flock`` per model cache directory (``.<name>.lock`` beside it): writers hold it
exclusively, readers shared. Re-entrant within a thread; exclusive inside shared upgrades it.
Each thread holds its own open file, so threads of one process exclude each other as processes do.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import threading
from pathlib import Path
from typing import Iterator

_held: dict[tuple[Path, int], tuple[int, int, int]] = {}   # (lock path, thread) → (fd, depth, flock mode)
_guard = threading.Lock()


@contextlib.contextmanager
def cache_lock(directory: Path, *, exclusive: bool) -> Iterator[None]:
    """Hold the lock of cache ``directory`` (waiting for it)."""
    path = directory.with_name(f".{directory.name}.lock")
    key = (path, threading.get_ident())
    mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
    with _guard:
        held = _held.get(key)
    if held is not None:
        fd, depth, had = held
        if mode == fcntl.LOCK_EX and had == fcntl.LOCK_SH:
            fcntl.flock(fd, fcntl.LOCK_EX)            # upgrade; callers re-check the cache after it
        with _guard:
            _held[key] = (fd, depth + 1, fcntl.LOCK_EX if fcntl.LOCK_EX in (mode, had) else fcntl.LOCK_SH)
        try:
            yield
        finally:
            with _guard:
                _held[key] = (fd, depth, had)
            if mode == fcntl.LOCK_EX and had == fcntl.LOCK_SH:
                fcntl.flock(fd, fcntl.LOCK_SH)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        fcntl.flock(fd, mode)
        with _guard:
            _held[key] = (fd, 1, mode)
        yield
    finally:
        with _guard:
            _held.pop(key, None)
        os.close(fd)                                   # drops the flock


def replace_dir(tmp: Path, dest: Path) -> None:
    """Move the complete directory ``tmp`` to ``dest`` by one atomic rename (call under the
    exclusive lock); a ``dest`` still there is renamed aside and removed, never merged into."""
    import shutil

    aside = None
    if dest.exists() or dest.is_symlink():
        aside = dest.with_name(f".{dest.name}.{os.getpid()}.old")
        shutil.rmtree(aside, ignore_errors=True)
        os.replace(dest, aside)
    os.replace(tmp, dest)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)
