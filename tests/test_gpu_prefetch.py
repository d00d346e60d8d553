"""Issue 27.7: on CUDA a prefetched layer is ordered by stream events only:
the host never waits or polls for the copy, and no second copy of the same
bytes starts after a timeout. The copy/stream objects are stand-ins here
(what a CPU can check: who waits on what); the device run's memory step
runs the real streams."""

from __future__ import annotations

import pytest

from soldaemon.runtime.memory.prefetch import CopyJob, order_after, wait_copy


class Event:
    def __init__(self, done: bool) -> None:
        self.done = done

    def query(self) -> bool:
        return self.done

    def synchronize(self) -> None:
        raise AssertionError("the host waited for a CUDA copy")


class Stream:
    def __init__(self) -> None:
        self.waited: list[Event] = []

    def wait_event(self, event: Event) -> None:
        self.waited.append(event)


def test_a_cuda_copy_is_ordered_on_the_stream_not_waited_for() -> None:
    job = CopyJob(layer=3, slot=1, issued=0.0)
    job.cuda_event = Event(done=False)
    stream = Stream()
    order_after(job, stream)
    assert stream.waited == [job.cuda_event]
    with pytest.raises(ValueError, match="order_after"):
        wait_copy(job, 0.05)                       # the old host poll-then-fallback path is refused


def test_a_cpu_copy_is_still_waited_for_with_its_timeout() -> None:
    job = CopyJob(layer=0, slot=0, issued=0.0)
    assert wait_copy(job, 0.01) is False           # not done: the caller falls back
    job.done.set()
    assert wait_copy(job, 0.01) is True
    order_after(job, Stream())                     # no event: nothing to order
