"""Sol's memory scheduler, the engine's side of residency: plans it under ``sol.memory_budget``,
releases device memory when idle (on CUDA when NVML shows another process wants it, elsewhere
after ``idle_release_s``) and restores it on the next request, pins ``priority: high`` requests,
and lets KV folding quantize only while memory is short. The rules are
:mod:`soldaemon.policy.memory`'s; this module reads clocks and devices and moves the weights."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from typing import Any, Callable, Iterator

import torch

from soldaemon.policy.memory import (
    idle_release_due, idle_release_on, kv_folding_free_below, kv_memory_short, should_replan,
)
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.runtime.memory.weightstore import WeightStore, measure_copy_bandwidth

log = logging.getLogger("soldaemon.residency")


def budget_bytes(budget: Any, device: torch.device) -> int | None:
    """``sol.memory_budget`` (a MemoryBudget or None) in bytes; a fraction is of the GPU or RAM."""
    if budget is None:
        return None
    if budget.mb is not None:
        return int(budget.resolve_bytes(0))
    if device.type == "cuda":
        total = torch.cuda.get_device_properties(device).total_memory
    else:
        import psutil

        total = psutil.virtual_memory().total
    return int(budget.resolve_bytes(total))


def device_free_bytes(device: torch.device) -> tuple[int, int]:
    """(free, total) bytes of the GPU's memory, or RAM's (available, total) on a CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


PRESSURE_MIN_IDLE_S = 5.0     # a release on memory pressure waits this long after the last request
PRESSURE_FREE_SHARE = 0.05    # pressure: the device's free memory under this share of its total ...
PRESSURE_FREE_MIN = 1 << 30   # ... or under 1 GiB, whichever is more, while another process holds some


def under_pressure(free: int, total: int, others: int) -> bool:
    """Whether another process wants the GPU's memory: it holds ``others`` bytes and the device's
    ``free`` bytes are nearly gone."""
    return others > 0 and free < max(PRESSURE_FREE_MIN, PRESSURE_FREE_SHARE * total)


def nvml_pressure(device: torch.device) -> Callable[[], bool] | None:
    """A reader of :func:`under_pressure` through NVML (the device found by UUID, whatever
    CUDA_VISIBLE_DEVICES says), or None where NVML or the device cannot be read."""
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        handle = pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except Exception as exc:  # no NVML, no driver, an old pynvml: the timer decides
        log.info("memory pressure cannot be read through NVML (%s): idle release runs on its timer", exc)
        return None
    me = os.getpid()

    def read() -> bool:
        try:
            mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
            procs = (list(pynvml.nvmlDeviceGetComputeRunningProcesses(handle))
                     + list(pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)))
        except Exception:  # a transient NVML error: no pressure seen this time
            return False
        others = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid != me)
        return under_pressure(int(mem.free), int(mem.total), others)

    return read


class MemoryScheduler:
    """Sol's memory contract for one engine (module doc). ``gen_lock``: the generation lock, held
    while weights move; ``free_bytes()`` → (free, total). ``on_timer``: release after
    ``idle_release_s`` idle (True), or on ``pressure()`` once idle PRESSURE_MIN_IDLE_S (False);
    default: pressure on CUDA where NVML reads it, else the timer."""

    def __init__(self, backend: LeanBackend, sol: Any, gen_lock: threading.Lock, *, kv_reserve_bytes: int,
                 idle_release: bool | None = None,
                 free_bytes: Callable[[], tuple[int, int]] | None = None,
                 pressure: Callable[[], bool] | None = None, on_timer: bool | None = None) -> None:
        self.backend = backend
        self.sol = sol
        self.gen_lock = gen_lock
        self.kv_reserve_bytes = kv_reserve_bytes
        self.store = WeightStore(backend.layers, backend.fixed_weights(), backend.device,
                                 policy=sol.weight_offload_policy, prefetch_depth=sol.prefetch_depth,
                                 fallback_timeout_ms=sol.fallback_timeout_ms,
                                 heatmap_window_s=sol.layer_heatmap_window, kv_policy=self.kv_snapshot)
        self.budget = budget_bytes(sol.memory_budget, backend.device)
        self.bandwidth_gbs: float | None = None
        if self.budget is not None:
            self.bandwidth_gbs = measure_copy_bandwidth(backend.device)
            plan = self.store.make_plan(self.budget, kv_reserve_bytes, bandwidth_gbs=self.bandwidth_gbs)
            self.store.apply_plan(plan)
            log.info("residency plan: %s", plan.describe(self.store.unit_infos))
        backend.read_through(self.store)
        self.idle_release_s = float(sol.idle_release_s)
        self.idle_release = idle_release_on(backend.device.type, idle_release)
        if pressure is None and on_timer is not True and self.idle_release and backend.device.type == "cuda":
            pressure = nvml_pressure(backend.device)
        self.pressure = pressure
        self.on_timer = pressure is None if on_timer is None else on_timer
        self.recapturer: threading.Thread | None = None   # graphs captured again after a restore
        self.last_active = time.monotonic()
        self.releases = 0
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if self.idle_release and (self.idle_release_s > 0 or not self.on_timer):
            self._timer = threading.Thread(target=self._idle_loop, name="sol-idle", daemon=True)
            self._timer.start()
        # the pool quantizes parked sessions only while the backend records queries: the lever
        # update_kv_folding pulls while free memory is under sol.kv_folding_free_below
        self.kv_free_below = kv_folding_free_below(sol, records_queries=True)
        self._free_bytes = free_bytes or (lambda: device_free_bytes(backend.device))
        self.kv_quantizing: bool | None = None    # None: not managed (folding off, or always quantizing)
        self.kv_switches = 0                       # times kv_quantizing changed after the first decision
        self.update_kv_folding()

    @contextlib.contextmanager
    def request(self, priority: str = "normal") -> Iterator[None]:
        """Around one request: note activity, restore released weights (layer 0 first) and, for
        ``priority: high``, pin them until it ends."""
        self.last_active = time.monotonic()
        if self.store.released:
            with self.gen_lock:
                self.restore()
        self.update_kv_folding()
        try:
            with self.store.pinned() if priority == "high" else contextlib.nullcontext():
                yield
        finally:
            self.last_active = time.monotonic()
            self.recapture_soon()

    def recapture_soon(self) -> threading.Thread | None:
        """After a request: start (or return) the thread that runs :meth:`recapture_graphs` when
        the graphs owe captures; None when they owe none or the weights are released."""
        graphs = self.backend.graphs
        if graphs is None or not graphs.owes() or self.store.released:
            return None
        if self.recapturer is not None and self.recapturer.is_alive():
            return self.recapturer
        self.recapturer = threading.Thread(target=self.recapture_graphs, name="sol-recapture", daemon=True)
        self.recapturer.start()
        return self.recapturer

    def recapture_graphs(self) -> int:
        """Outside any request: capture the graphs requests ran eagerly for, each under the
        generation lock alone (:meth:`~soldaemon.runtime.forward.cudagraph.GraphDecoder.recapture`).
        Returns graphs captured."""
        graphs = self.backend.graphs
        if graphs is None or not graphs.owes() or self.store.released:
            return 0
        return graphs.recapture(self.gen_lock)

    def update_kv_folding(self) -> bool | None:
        """Turn query recording (so parked-session quantizing) on while free memory is under
        ``sol.kv_folding_free_below``, off otherwise; takes the generation lock only on a change.
        Returns the state (None: not managed)."""
        if self.kv_free_below is None:
            return None
        free, total = self._free_bytes()
        short = kv_memory_short(free, total, self.kv_free_below)
        if short != self.kv_quantizing:
            with self.gen_lock:                 # no forward is writing the queries meanwhile
                self.backend.record_queries(short)
            if self.kv_quantizing is not None:
                self.kv_switches += 1
            log.info("KV folding: parked sessions %s (free %.0f MB, threshold %.0f MB)",
                     "quantized" if short else "trimmed only", free / 2**20,
                     self.kv_free_below.resolve_bytes(total) / 2**20)
            self.kv_quantizing = short
        return short

    def kv_snapshot(self) -> dict[str, Any]:
        """``debug`` → ``prefetch.kv_policy``: managed, quantizing now, the setting, switches."""
        return {"managed": self.kv_free_below is not None, "quantizing": self.kv_quantizing,
                "free_below": str(self.kv_free_below) if self.kv_free_below is not None else None,
                "switches": self.kv_switches}

    def reserve(self, nbytes: int, what: str) -> None:
        """Keep ``nbytes`` of the budget for something beside these weights (a draft model) and
        re-plan. Raises BudgetTooSmall, nothing changed, when the budget cannot hold both."""
        if self.budget is None:
            self.kv_reserve_bytes += nbytes
            return
        plan = self.store.make_plan(self.budget, self.kv_reserve_bytes + nbytes, bandwidth_gbs=self.bandwidth_gbs)
        self.kv_reserve_bytes += nbytes
        self.store.apply_plan(plan)
        log.info("residency plan with %s (%.0f MB) beside it: %s", what, nbytes / 2**20,
                 plan.describe(self.store.unit_infos))

    def restore(self) -> float:
        """Restore after an idle release, re-planning from the heatmap
        (call with the generation lock held)."""
        if not self.store.released:
            return 0.0
        ms = self.store.restore()
        if should_replan(self.budget, self.store.pins):
            plan = self.store.make_plan(self.budget, self.kv_reserve_bytes, bandwidth_gbs=self.bandwidth_gbs)
            if plan.resident != (self.store.plan.resident if self.store.plan else None):
                self.store.apply_plan(plan)
        self._invalidate_graphs()
        return ms

    def _invalidate_graphs(self) -> None:
        """Restored weights live at new addresses: graphs captured over the old must not replay."""
        graphs = self.backend.graphs
        if graphs is not None:
            graphs.invalidate()

    def release_if_idle(self, now: float | None = None) -> int:
        """Release when idle (on the timer, or under pressure); bytes freed (0: not now). Skips
        when a request holds the generation lock or pins layers."""
        now = time.monotonic() if now is None else now
        pressure = None if self.on_timer else self.pressure   # else: idle a little, and another process wants the memory
        idle_s = self.idle_release_s if pressure is None else PRESSURE_MIN_IDLE_S
        if not (idle_release_due(now, self.last_active, idle_s, released=self.store.released, pins=self.store.pins)
                and (pressure is None or pressure())):
            return 0
        if not self.gen_lock.acquire(blocking=False):
            return 0
        try:
            freed = self.store.release()
            self._invalidate_graphs()
            if freed and self.store.cuda:
                # under the lock: never beside a forward or a graph capture
                torch.cuda.empty_cache()
        finally:
            self.gen_lock.release()
        self.releases += 1
        return freed

    def _idle_loop(self) -> None:
        period = max(0.05, min(5.0, self.idle_release_s / 4))
        while not self._stop.wait(period):
            try:
                self.release_if_idle()
            except Exception:  # never let the timer thread die silently
                log.exception("idle release failed")

    def close(self) -> None:
        self._stop.set()
        if self._timer is not None:
            self._timer.join(timeout=2)
        self.store.close()
