"""Integrity of the converted model cache: the marker lists each file's size, a sample digest
(checked before loading) and the full sha256 (checked on a thread while loading).
:func:`write_marker` fsyncs every file and the directory before the rename that publishes it.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

from soldaemon.errors import ModelHashMismatch

MARKER = "soldaemon-complete.json"
SAMPLE_BLOCKS = 64
SAMPLE_BLOCK = 64 * 1024        # bytes
SAMPLE_EDGE = 1024 * 1024       # bytes read at each end
_CHUNK = 8 * 1024 * 1024        # read size of the full hash


def sample_digest(path: Path) -> str:
    """sha256 over the size, both ends and evenly spaced blocks of ``path``."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        h.update(f.read(SAMPLE_EDGE))
        if size > 2 * SAMPLE_EDGE:
            step = (size - 2 * SAMPLE_EDGE) // SAMPLE_BLOCKS
            for i in range(SAMPLE_BLOCKS):
                f.seek(SAMPLE_EDGE + i * step)
                h.update(f.read(SAMPLE_BLOCK))
            f.seek(size - SAMPLE_EDGE)
            h.update(f.read(SAMPLE_EDGE))
    return h.hexdigest()


def full_digest(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def fsync(path: Path) -> None:
    """fsync a file or a directory (after a rename inside it)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_marker(directory: Path, info: dict[str, Any]) -> None:
    """Hash and fsync every file of ``directory``, then write and fsync the marker (``info`` and
    the file records) and the directories. Call last, before the rename into place."""
    files: dict[str, dict[str, Any]] = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        fsync(path)
        files[path.relative_to(directory).as_posix()] = {
            "size": path.stat().st_size, "sample": sample_digest(path), "sha256": full_digest(path)}
    marker = directory / MARKER
    with open(marker, "w") as f:
        json.dump({**info, "files": files}, f)
        f.flush()
        os.fsync(f.fileno())
    for sub in sorted({p.parent for p in directory.rglob("*")} | {directory}):
        fsync(sub)


def recorded_files(directory: Path) -> dict[str, dict[str, Any]] | None:
    """The marker's file records, or ``None`` when it has none."""
    try:
        files = json.loads((directory / MARKER).read_text()).get("files")
    except (OSError, ValueError, AttributeError):
        return None
    return files if isinstance(files, dict) and files else None


def quick_check(directory: Path) -> str | None:
    """What is wrong with ``directory`` by size and sample digest, or ``None``."""
    files = recorded_files(directory)
    if files is None:
        return "the completion marker records no file hashes"
    for name, rec in files.items():
        path = directory / name
        try:
            size = path.stat().st_size
        except OSError:
            return f"{name} is missing"
        if size != rec.get("size"):
            return f"{name} is {size} bytes, the marker says {rec.get('size')}"
        if sample_digest(path) != rec.get("sample"):
            return f"{name} differs from the recorded hash (sampled)"
    return None


def full_check(directory: Path) -> str | None:
    """As :func:`quick_check`, by the full sha256 of every file."""
    files = recorded_files(directory)
    if files is None:
        return "the completion marker records no file hashes"
    for name, rec in files.items():
        try:
            if full_digest(directory / name) != rec.get("sha256"):
                return f"{name} differs from the recorded sha256"
        except OSError:
            return f"{name} is missing"
    return None


def start_full_check(directory: Path) -> concurrent.futures.Future[str | None]:
    """:func:`full_check` on a daemon thread; the future holds its answer."""
    future: concurrent.futures.Future[str | None] = concurrent.futures.Future()

    def run() -> None:
        try:
            future.set_result(full_check(directory))
        except BaseException as exc:  # reported through the future
            future.set_exception(exc)

    threading.Thread(target=run, name="sol-cache-hash", daemon=True).start()
    return future


def corrupt(directory: Path, why: str) -> ModelHashMismatch:
    return ModelHashMismatch(f"the converted model cache {directory} is corrupt: {why}",
                             hint=f"delete {directory}; the next start converts the model again")
