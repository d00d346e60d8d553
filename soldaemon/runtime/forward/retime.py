"""A kernel table timed under load, timed again while the daemon serves: once
:func:`~soldaemon.policy.kernel_plan.retime_reason` says "quiet" ``quiet_polls`` times in a row, a
thread times the kernels in small pieces, each inside the engine's generation lock. The new table
replaces the cached one; a different plan is swapped in between requests where it reads the
weights as packed, else used from the next start (health ``engine.precision``, ``doctor``)."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import torch

from soldaemon.policy.kernel_plan import EXACT_VERIFY, KernelPlan, TimingTable, choose_plan, retime_reason, timed_under_load
from soldaemon.runtime.forward.kernels import machine_load, measure_table, plan_key, save_table
from soldaemon.runtime.memory.heap import return_free_heap

log = logging.getLogger("soldaemon.kernels")

# how often the load is read (s), and how many quiet readings in a row make
# "quiet for a while": the 1-minute load average lags, so two minutes of it
POLL_S = 30.0
QUIET_POLLS = 4


@dataclass(frozen=True)
class Retimed:
    """What a background re-timing found."""

    table: TimingTable          # the new table (background=True), now the cached one
    plan: KernelPlan            # the plan it gives
    in_use: bool                # the serving plan's kernels are that plan's (False: the next start uses it)
    seconds: float              # how long the re-timing took, waits for requests included (s)
    rss_peak_mb: float | None   # resident memory the timing's weights added at most (MB; None: not read)
    swapped: bool = False       # in use because it was swapped in while serving
    not_swapped: str | None = None  # why a different plan waits for the next start

    def facts(self) -> dict[str, Any]:
        """health → ``engine.precision.table`` once re-timed (``doctor``)."""
        return {**self.table.facts(), "plan_in_use": self.in_use, "swapped_in": self.swapped,
                "not_swapped": self.not_swapped, "retimed_plan": None if self.in_use else self.plan.describe(),
                "retime_s": round(self.seconds, 1), "retime_rss_peak_mb": self.rss_peak_mb}


def same_kernels(a: KernelPlan, b: KernelPlan) -> bool:
    """The two plans run the same kernels over the same storages (predictions and reasons aside)."""
    return all(getattr(a, f) == getattr(b, f) for f in ("storage", "prefill", "short", "head_storage", "head", "rows"))


def _rss_mb() -> float | None:
    try:
        import psutil

        return float(psutil.Process().memory_info().rss) / 2 ** 20
    except (ImportError, OSError):
        return None


class BackgroundRetime:
    """Times ``table`` (the serving plan's, timed under load) again in a thread once the machine
    is quiet. ``turn()``: held around each timed piece (``LocalModelPart.between_requests``);
    ``load()``: (1-minute load, cores); ``plan``, ``row_copy``, ``exact``: as chosen at start;
    ``swap``: tries a new plan between requests, returning why not or None."""

    def __init__(self, cfg: Any, device: torch.device, compute_dtype: torch.dtype, table: TimingTable,
                 plan: KernelPlan, *, row_copy: bool, exact: frozenset[str] | None = EXACT_VERIFY,
                 turn: Callable[[], contextlib.AbstractContextManager[Any]] = contextlib.nullcontext,
                 load: Callable[[], tuple[float | None, int]] = machine_load, poll_s: float = POLL_S,
                 quiet_polls: int = QUIET_POLLS, measure: Callable[..., TimingTable] = measure_table,
                 swap: Callable[[KernelPlan], str | None] | None = None) -> None:
        self.cfg, self.device, self.compute_dtype = cfg, device, compute_dtype
        self.table, self.plan, self.row_copy, self.exact = table, plan, row_copy, exact
        self.turn, self.load, self.poll_s, self.quiet_polls = turn, load, poll_s, quiet_polls
        self.measure, self.swap = measure, swap
        self.result: Retimed | None = None        # set once, by the thread
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def wanted(table: TimingTable | None, plan: KernelPlan | None, device: torch.device) -> bool:
        """Whether to re-time in the background: a CPU table timed under load."""
        return table is not None and plan is not None and device.type == "cpu" and timed_under_load(table)

    def start(self) -> None:
        self._thread = threading.Thread(target=self.run, name="kernel-retime", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask the thread to end (between pieces) and wait for it a while; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def join(self, timeout: float | None = None) -> None:
        if self._thread is not None:
            self._thread.join(timeout)

    def wait_quiet(self) -> str | None:
        """Block until ``quiet_polls`` quiet readings in a row: the reason; None when stopped."""
        quiet = 0
        while not self._stop.is_set():
            why = retime_reason(self.table, *self.load())
            quiet = quiet + 1 if why is not None else 0
            if quiet >= self.quiet_polls:
                return why
            self._stop.wait(self.poll_s)
        return None

    def run(self) -> Retimed | None:
        """The thread's body: wait for quiet, time, save, compare, maybe swap. Returns (and keeps in
        ``result``) what it found; None when stopped or the timing failed (logged)."""
        why = self.wait_quiet()
        if why is None:
            return None
        log.info("timing the linear kernels again in the background: %s", why)
        t0, rss0 = time.perf_counter(), _rss_mb()
        peak = [rss0]

        @contextlib.contextmanager
        def piece() -> Iterator[None]:
            """One timed piece, inside ``turn``; a stop ends the timing between pieces."""
            rss = _rss_mb()
            if rss is not None and (peak[0] is None or rss > peak[0]):
                peak[0] = rss
            if self._stop.is_set():
                raise _Stopped()
            with self.turn():
                yield

        try:
            fresh = self.measure(self.cfg, self.device, self.compute_dtype, load=self.load, turn=piece,
                                 say=lambda m: log.info("%s", m))
        except _Stopped:
            return None
        except (RuntimeError, ValueError) as exc:
            log.warning("the background kernel timing failed: %s", exc)
            return None
        finally:
            return_free_heap()
        fresh = dataclasses.replace(fresh, replaced_load_1m=self.table.load_1m, background=True)
        save_table(plan_key(self.cfg, self.device, self.compute_dtype), fresh)
        try:
            plan = choose_plan(fresh, self.plan.precision, row_copy=self.row_copy, exact=self.exact)
        except ValueError as exc:
            log.warning("the background kernel timing gives no plan: %s", exc)
            return None
        grew = None if rss0 is None or peak[0] is None else round(peak[0] - rss0, 1)
        same = same_kernels(plan, self.plan)
        why_not = None if same else "nothing to swap it into" if self.swap is None else None
        if not same and self.swap is not None:      # it takes the generation lock itself
            if self._stop.is_set():
                return None
            why_not = self.swap(plan)
        swapped = not same and why_not is None
        self.result = Retimed(fresh, plan, same or swapped, time.perf_counter() - t0, grew, swapped, why_not)
        log.info("kernel timings re-timed in the background in %.0f s (resident memory +%s MB at most): %s",
                 self.result.seconds, grew, "the same plan" if same else
                 f"another plan, swapped in: {plan.describe()}" if swapped else
                 f"another plan, used from the next start ({why_not}): {plan.describe()}")
        return self.result


class _Stopped(Exception):
    """The daemon is closing: the timing ends between pieces."""
