"""The memory scheduler's rules as plain functions over the free memory and
the clock it reads (:mod:`soldaemon.runtime.memory.scheduler`)."""

from __future__ import annotations

from typing import Any, Protocol


class Threshold(Protocol):
    """A byte threshold as MB or a fraction of a total (config's MemoryBudget)."""

    def resolve_bytes(self, total: int) -> float: ...


def kv_memory_short(free: int, total: int, below: Threshold) -> bool:
    """Whether parked KV should be quantized: ``free`` bytes under ``below``."""
    return free < below.resolve_bytes(total)


def kv_folding_free_below(sol: Any, *, records_queries: bool) -> Threshold | None:
    """The free-memory threshold under which parked sessions are quantized; None when folding
    is off or the backend records no queries to score by."""
    if float(getattr(sol, "kv_folding_entropy_threshold", 0.0)) > 0 and records_queries:
        return getattr(sol, "kv_folding_free_below", None)
    return None


def idle_release_on(device_type: str, asked: bool | None) -> bool:
    """Whether idle release runs: on CUDA unless asked otherwise (on a CPU it frees nothing)."""
    return (device_type == "cuda") if asked is None else asked


def idle_release_due(now: float, last_active: float, idle_release_s: float, *, released: bool,
                     pins: int) -> bool:
    """Whether to release device memory now: enabled, not released, not pinned, idle for
    ``idle_release_s`` (s)."""
    return not (idle_release_s <= 0 or released or pins or now - last_active < idle_release_s)


def should_replan(budget_bytes: int | None, pins: int) -> bool:
    """After a restore, re-plan residency only under a budget and while nothing pins layers."""
    return budget_bytes is not None and not pins


ROW_COPY_MARGIN = 1 << 30     # free RAM left beside the blocked copy (KV caches, prompts, the editor)


def blocked_copy_allowed(asked: bool, budget_set: bool, available: int, copy_bytes: int,
                         margin: int = ROW_COPY_MARGIN) -> tuple[bool, str]:
    """Whether the kernel plan may keep a blocked second copy of the weights, and why: asked
    for, no ``sol.memory_budget``, and room with ``margin``."""
    if not asked:
        return False, "model.blocked_copy: false"
    if budget_set:
        return False, "sol.memory_budget is set"
    if available < copy_bytes + margin:
        return False, (f"{available / 2**20:.0f} MB free, the copy needs {copy_bytes / 2**20:.0f} MB "
                       f"plus {margin / 2**20:.0f} MB to spare")
    return True, f"{copy_bytes / 2**20:.0f} MB of {available / 2**20:.0f} MB free"
