"""Prefetch: copies of an offloaded layer's weights into a staging slot of the weight store's
ring. On CUDA a side stream ordered by events, with no host synchronisation; on a CPU a
background thread the forward waits for, up to ``fallback_timeout_ms``."""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class CopyJob:
    """A copy of one layer's offloaded tensors into a slot."""

    layer: int
    slot: int
    issued: float                                 # time.perf_counter()
    done: threading.Event = field(default_factory=threading.Event)
    cuda_event: Any = None                        # torch.cuda.Event on CUDA
    cancelled: bool = False
    used: bool = False                            # a forward has read it (its bytes were counted)
    consumed: Any = None                          # CUDA: event after the last compute that read the slot
    views: dict[str, torch.Tensor] = field(default_factory=dict)

    def ready(self) -> bool:
        if self.cuda_event is not None:
            return bool(self.cuda_event.query())
        return self.done.is_set()


@dataclass
class PrefetchStats:
    hits: int = 0          # weights were in the slot when the layer needed them
    late: int = 0          # prefetch issued, arrived within fallback_timeout_ms (the forward waited)
    misses: int = 0        # not prefetched: copied synchronously (first use)
    fallbacks: int = 0     # prefetch not ready within fallback_timeout_ms: synchronous copy
    stall_ms: float = 0.0  # time forwards waited for weights
    bytes_copied: int = 0

    @property
    def uses(self) -> int:
        return self.hits + self.late + self.misses + self.fallbacks

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.uses if self.uses else None


# -- copiers: who moves the bytes ---------------------------------------------


# (LayerWeights field name, host tensor to copy from) per offloaded tensor
Sources = list[tuple[str, torch.Tensor]]


class Copier:
    """Moves one job's bytes into its slot views; ``previous``: the job that
    held the slot before (its last reader must finish first)."""

    def submit(self, job: CopyJob, srcs: Sources, delay_s: float, previous: CopyJob | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class ThreadCopier(Copier):
    """CPU: one background thread, jobs in FIFO order (none overwrites a slot still filling)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[CopyJob, list[tuple[str, torch.Tensor]], float] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="sol-prefetch", daemon=True)
        self._thread.start()

    def submit(self, job: CopyJob, srcs: Sources, delay_s: float, previous: CopyJob | None) -> None:
        self._q.put((job, srcs, delay_s))

    def _run(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            job, srcs, delay_s = item
            try:
                if not job.cancelled:
                    if delay_s:
                        time.sleep(delay_s)
                    with torch.inference_mode():
                        for name, src in srcs:
                            job.views[name].copy_(src)
            finally:
                job.done.set()

    def close(self) -> None:
        self._q.put(None)
        self._thread.join(timeout=5)


class StreamCopier(Copier):
    """CUDA: copies from pinned memory on a side stream, after the event of the slot's last
    reader, recording an event the compute stream waits on. No host synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def submit(self, job: CopyJob, srcs: Sources, delay_s: float, previous: CopyJob | None) -> None:
        consumed = getattr(previous, "consumed", None) if previous is not None else None
        compute = torch.cuda.current_stream(self.device)   # read before entering the side stream
        with torch.cuda.stream(self.stream):
            if consumed is not None:
                self.stream.wait_event(consumed)
            else:  # the slot's last reader may still be queued on the compute stream
                self.stream.wait_stream(compute)
            if delay_s:
                torch.cuda._sleep(int(delay_s * 1e9))  # ≈ cycles at ~1 GHz: a test hook only
            for name, src in srcs:
                job.views[name].copy_(src, non_blocking=True)
            job.cuda_event = torch.cuda.Event()
            job.cuda_event.record(self.stream)
        job.done.set()


def wait_copy(job: CopyJob, timeout_s: float | None) -> bool:
    """CPU copies: wait until ``job``'s copy has landed; False on timeout. Raises ValueError for a
    CUDA copy, which the host never waits for (:func:`order_after`)."""
    if job.cuda_event is not None:
        raise ValueError("wait_copy is for the CPU copier: order a CUDA copy with order_after()")
    return job.done.wait(timeout_s)


def order_after(job: CopyJob, stream: Any) -> None:
    """CUDA: make ``stream``'s later work wait for ``job``'s copy (on the device, not the host)."""
    if job.cuda_event is not None:
        stream.wait_event(job.cuda_event)
