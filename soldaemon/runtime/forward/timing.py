"""Host clocks around device work: CUDA kernels run asynchronously, so every cost the runtime
decides with (``DraftLength``'s forward costs, a draft model's step) reads the clock after
:func:`synchronize`."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

import torch

T = TypeVar("T")

# device type → how to wait for its queued work
SYNCHRONIZERS: dict[str, Callable[[torch.device], None]] = {
    "cuda": lambda device: torch.cuda.synchronize(device),
    "cpu": lambda device: None,
}


def synchronize(device: torch.device) -> None:
    """Return once every kernel queued on ``device`` has finished."""
    SYNCHRONIZERS.get(device.type, lambda d: None)(device)


def elapsed_ms(t0_ns: int, device: torch.device) -> float:
    """ms from ``t0_ns`` (``time.perf_counter_ns()``, read after a
    :func:`synchronize`) until the device's queued work is done."""
    synchronize(device)
    return (time.perf_counter_ns() - t0_ns) / 1e6


def timed(fn: Callable[[], T], device: torch.device) -> tuple[T, float]:
    """``fn()`` and its ms, from a :func:`synchronize` to the end of the device work it queued."""
    synchronize(device)
    t0 = time.perf_counter_ns()
    out = fn()
    return out, elapsed_ms(t0, device)
