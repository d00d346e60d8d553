"""The C heap handed back to the system when the daemon goes idle.

A completion allocates and frees activations, logits and cache rows; glibc's
allocator keeps the freed pages of its arenas mapped, so the 0.5B's resident
memory grows by a few hundred MB over its first completions although the
live data does not. :func:`return_free_heap` asks the allocator to give the
free pages back (``malloc_trim(0)``, about 10 ms for the 0.5B on a 2-core
machine). The worker calls it after a second without requests (a request
that arrives meanwhile waits for the trim's end), the engine after packing
weights and timing kernels at load, the server after closing a client that
stopped reading.
On a C library without ``malloc_trim`` (musl, macOS, Windows) it does
nothing.
"""

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
    """Hand the allocator's free pages back to the system; False where the
    C library cannot (nothing was done)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True
