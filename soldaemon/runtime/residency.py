"""Sol's weight residency, by its old import path.

The parts now live by concern:

- policy (no torch): :mod:`soldaemon.policy.residency` — UnitInfo,
  ResidencyPlan, :func:`plan_residency`, the Heatmap; :mod:`soldaemon.policy.memory`
  — when memory is short, when idle weights are released;
- :mod:`.weightstore` — the two tiers and the forward's side of offload;
- :mod:`.prefetch` — the copies into staging slots and their counts;
- :mod:`.memsched` — the engine's side: budget, idle release, priority pins,
  KV folding's switch.

The names below stay importable from here for code written against the one
module this used to be.
"""

from __future__ import annotations

from ..policy.memory import kv_memory_short
from ..policy.residency import ForwardRecord, Heatmap, ResidencyPlan, UnitInfo, plan_residency
from .memsched import MemoryScheduler, budget_bytes, device_free_bytes
from .prefetch import PrefetchStats
from .weightstore import ALWAYS_RESIDENT, ATTN, MLP, WeightStore, measure_copy_bandwidth

__all__ = [
    "ALWAYS_RESIDENT", "ATTN", "MLP", "ForwardRecord", "Heatmap", "MemoryScheduler", "PrefetchStats",
    "ResidencyPlan", "UnitInfo", "WeightStore", "budget_bytes", "device_free_bytes", "kv_memory_short",
    "measure_copy_bandwidth", "plan_residency",
]
