"""Sol's residency policy: which decoder weight units stay on the device under a memory
budget, and the per-layer heatmap that ranks them. No torch: the weight store
(:mod:`soldaemon.runtime.memory.weightstore`) measures and records; this module decides.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Sequence

from soldaemon.errors import BudgetTooSmall


@dataclass(frozen=True)
class UnitInfo:
    """One offloadable part of a layer, as the planner sees it."""

    uid: int              # index in the store's units
    layer: int
    part: str             # "layer" | "attn" | "mlp"
    nbytes: int           # device bytes when resident
    copy_bytes: int       # bytes copied per use


@dataclass(frozen=True)
class ResidencyPlan:
    """What :func:`plan_residency` decided, with its bytes and predicted latency cost."""

    budget_bytes: int | None          # None: no cap
    resident: frozenset[int]          # unit ids kept on the device
    offloaded: tuple[int, ...]        # unit ids in host memory, execution order
    fixed_bytes: int                  # embedding, lm_head, final norm, layer norms (never offloaded)
    kv_reserve_bytes: int             # KV caches the budget must leave room for
    slot_bytes: int                   # staging slots + fallback buffer (0 when nothing is offloaded)
    resident_bytes: int               # the resident units
    copy_bytes_per_forward: int       # bytes streamed per forward (model dtype)
    bandwidth_gbs: float | None       # measured host→device copy bandwidth, GB/s
    compute_ms_per_forward: float | None  # measured, for the overlap estimate
    predicted_copy_ms: float | None   # copy time per forward if nothing overlapped, ms
    predicted_extra_ms: float | None  # extra ms per forward after prefetch overlap, ms

    @property
    def planned_bytes(self) -> int:
        return self.fixed_bytes + self.kv_reserve_bytes + self.slot_bytes + self.resident_bytes

    def describe(self, units: Sequence[UnitInfo]) -> dict[str, Any]:
        layers = sorted({units[u].layer for u in self.offloaded})
        return {
            "budget_mb": None if self.budget_bytes is None else round(self.budget_bytes / 2**20, 1),
            "planned_mb": round(self.planned_bytes / 2**20, 1),
            "resident_units": len(self.resident), "offloaded_units": len(self.offloaded),
            "offloaded_layers": layers,
            "copy_mb_per_forward": round(self.copy_bytes_per_forward / 2**20, 1),
            "bandwidth_gbs": None if self.bandwidth_gbs is None else round(self.bandwidth_gbs, 2),
            "predicted_copy_ms": _r(self.predicted_copy_ms),
            "predicted_extra_ms": _r(self.predicted_extra_ms),
        }


def _r(x: float | None, nd: int = 2) -> float | None:
    return None if x is None else round(x, nd)


def plan_residency(units: Sequence[UnitInfo], *, budget_bytes: int | None, fixed_bytes: int,
                   kv_reserve_bytes: int, slot_bytes: int, prefetch_depth: int,
                   heat: dict[int, tuple[int, float]] | None = None, first_layers: int = 2,
                   bandwidth_gbs: float | None = None,
                   compute_ms_per_forward: float | None = None) -> ResidencyPlan:
    """Choose the resident units under ``budget_bytes``: all when they fit; else, after
    ``prefetch_depth + 2`` staging buffers of ``slot_bytes``, greedily the first
    ``first_layers`` layers (they compute while the rest is fetched), then hotter
    ``heat[layer] = (calls, stall_ms)``, then lower layers. Raises :class:`BudgetTooSmall`
    when the fixed part, KV reserve and buffers alone exceed the budget."""
    everything = sum(u.nbytes for u in units)
    base = fixed_bytes + kv_reserve_bytes
    ring = (prefetch_depth + 2) * slot_bytes
    heat = heat or {}

    def rank(u: UnitInfo) -> tuple[int, int, float, int]:
        calls, stall = heat.get(u.layer, (0, 0.0))
        return (0 if u.layer < first_layers else 1, -calls, -stall, u.layer)

    if budget_bytes is None or base + everything <= budget_bytes:
        resident = frozenset(u.uid for u in units)
        return ResidencyPlan(budget_bytes, resident, (), fixed_bytes, kv_reserve_bytes, 0, everything,
                             0, bandwidth_gbs, compute_ms_per_forward, 0.0, 0.0)
    room = budget_bytes - base - ring
    if room < 0:
        mb = 2**20
        raise BudgetTooSmall(
            f"memory_budget {budget_bytes / mb:.0f} MB is below the minimum {(base + ring) / mb:.0f} MB: "
            f"embedding/lm_head/norms {fixed_bytes / mb:.0f} MB + KV caches {kv_reserve_bytes / mb:.0f} MB "
            f"+ {prefetch_depth + 2} staging buffers {ring / mb:.0f} MB")
    kept: set[int] = set()
    for u in sorted(units, key=rank):
        if u.nbytes <= room:
            kept.add(u.uid)
            room -= u.nbytes
    offloaded = tuple(u.uid for u in sorted(units, key=lambda u: (u.layer, u.uid)) if u.uid not in kept)
    copy_bytes = sum(units[i].copy_bytes for i in offloaded)
    copy_ms = extra_ms = None
    if bandwidth_gbs:
        copy_ms = copy_bytes / (bandwidth_gbs * 1e9) * 1e3
        # prefetch hides copies behind compute at best; without it every copy is on the path
        hidden = compute_ms_per_forward if (prefetch_depth > 0 and compute_ms_per_forward) else 0.0
        extra_ms = max(0.0, copy_ms - hidden)
    return ResidencyPlan(budget_bytes, frozenset(kept), offloaded, fixed_bytes, kv_reserve_bytes, ring,
                         sum(units[i].nbytes for i in kept), copy_bytes, bandwidth_gbs,
                         compute_ms_per_forward, copy_ms, extra_ms)


@dataclass
class ForwardRecord:
    """One forward's per-layer record (lists indexed by layer)."""

    t: float                          # time.monotonic() at its end, s
    ms: list[float] | None            # compute per layer (CPU: measured; CUDA: None, kernels are async)
    outcomes: list[str] | None        # "resident" | "hit" | "late" | "miss" | "fallback"; None: all resident
    copied: list[int] | None          # bytes copied to run each layer
    stall_ms: list[float] | None      # time the forward waited for each layer's weights


_OUTCOME_KEYS = {"hit": "hits", "late": "late", "miss": "misses", "fallback": "fallbacks"}


class Heatmap:
    """Per-layer activity over the last ``window_s`` seconds, one record per forward. Written
    by the forward thread, read by the server's loop thread (under its own lock)."""

    def __init__(self, n_layers: int, window_s: float) -> None:
        self.n_layers = n_layers
        self.window_s = window_s
        self._records: deque[ForwardRecord] = deque()
        self._lock = threading.Lock()

    def add(self, rec: ForwardRecord) -> None:
        with self._lock:
            self._records.append(rec)
            self._trim(rec.t)

    def _trim(self, now: float) -> None:
        horizon = now - self.window_s
        recs = self._records
        while recs and recs[0].t < horizon:
            recs.popleft()

    def per_layer(self) -> list[dict[str, Any]]:
        with self._lock:
            self._trim(time.monotonic())
            records = list(self._records)
        rows: list[dict[str, Any]] = [{"layer": i, "calls": 0, "compute_ms": 0.0, "bytes_copied": 0, "hits": 0, "late": 0,
                 "misses": 0, "fallbacks": 0, "stall_ms": 0.0} for i in range(self.n_layers)]
        timed = [0] * self.n_layers
        for rec in records:
            for i, r in enumerate(rows):
                r["calls"] += 1
                if rec.ms is not None:
                    r["compute_ms"] += rec.ms[i]
                    timed[i] += 1
                if rec.outcomes is not None:
                    key = _OUTCOME_KEYS.get(rec.outcomes[i])
                    if key:
                        r[key] += 1
                if rec.copied is not None:
                    r["bytes_copied"] += rec.copied[i]
                if rec.stall_ms is not None:
                    r["stall_ms"] += rec.stall_ms[i]
        return [{**r, "compute_ms": round(r["compute_ms"], 3), "stall_ms": round(r["stall_ms"], 3),
                 "mean_ms": round(r["compute_ms"] / n, 4) if n else None} for r, n in zip(rows, timed)]

    def heat(self) -> dict[int, tuple[int, float]]:
        """layer → (calls, stall_ms) in the window: the planner's input."""
        return {r["layer"]: (r["calls"], r["stall_ms"]) for r in self.per_layer()}
