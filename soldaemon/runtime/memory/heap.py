"""The C heap handed back to the system: glibc keeps freed arena pages mapped, so resident memory
grows though live data does not. :func:`return_free_heap` (``malloc_trim(0)``) runs when the
worker goes idle, after a request that left resident memory :data:`GROWTH_BYTES` above the last
hand-back (:class:`HeapKeeper`), after load-time packing and timing, and after closing a stalled
client; it does nothing on a C library without ``malloc_trim`` (musl, macOS, Windows)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Callable

import psutil

GROWTH_BYTES = 64 << 20   # resident growth since the last hand-back that makes a request's end trim


@functools.cache
def _malloc_trim() -> Callable[[int], Any] | None:
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        trim = libc.malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def return_free_heap() -> bool:
    """Hand the allocator's free pages back to the system; False where the C library cannot."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


class HeapKeeper:
    """Bounds a burst's resident memory: :meth:`after_request` hands the free heap back when
    resident memory is :data:`GROWTH_BYTES` above what it was after the last hand-back (a few
    ms, after the answer went out), so a run of prompts does not keep its peak mapped until
    the next idle second."""

    def __init__(self, growth_bytes: int = GROWTH_BYTES) -> None:
        self.growth_bytes = growth_bytes
        self._process = psutil.Process()
        self._base = self._resident()

    def _resident(self) -> int:
        return int(self._process.memory_info().rss)

    def after_request(self) -> bool:
        """Hand the free heap back if resident memory grew past the bound; True when it did."""
        if self._resident() - self._base < self.growth_bytes:
            return False
        return self.returned(return_free_heap())

    def returned(self, done: bool = True) -> bool:
        """Count the heap as handed back now (the idle hand-back calls this)."""
        self._base = self._resident()
        return done
