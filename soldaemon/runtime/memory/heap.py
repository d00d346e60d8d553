"""The C heap handed back to the system: glibc keeps freed arena pages mapped, so resident memory
grows though live data does not. :func:`return_free_heap` (``malloc_trim(0)``) runs when the
worker goes idle, after load-time packing and timing, and after closing a stalled client; it does
nothing on a C library without ``malloc_trim`` (musl, macOS, Windows)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
from typing import Any, Callable


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
