"""The C heap handed back (soldaemon/runtime/memory/heap.py), on the real allocator."""

from __future__ import annotations

import psutil
import pytest

from soldaemon.runtime.memory.heap import HeapKeeper, _malloc_trim

needs_trim = pytest.mark.skipif(_malloc_trim() is None, reason="no malloc_trim in this C library (glibc only)")


def _rss() -> int:
    return int(psutil.Process().memory_info().rss)


@needs_trim
def test_the_keeper_hands_back_freed_heap_pages_once_resident_memory_grew() -> None:
    keeper = HeapKeeper(growth_bytes=32 << 20)
    assert not keeper.after_request(), "nothing grew yet"
    # 64 MB of 100 kB blocks (under glibc's mmap threshold: heap pages), written so they are
    # resident, then freed below a live block that keeps the heap's top from shrinking by itself
    chunks = [b"x" * 100_000 for _ in range(640)]
    pin = b"y" * 100_000
    del chunks
    freed_but_mapped = _rss()
    assert keeper.after_request(), "64 MB above the base: handed back"
    assert freed_but_mapped - _rss() >= 32 << 20, "the freed pages left resident memory"
    assert not keeper.after_request(), "the base moved to after the hand-back"
    del pin


@needs_trim
def test_the_keeper_leaves_the_heap_alone_below_its_bound() -> None:
    keeper = HeapKeeper(growth_bytes=1 << 40)
    live = [b"x" * 100_000 for _ in range(100)]
    assert not keeper.after_request()
    del live
