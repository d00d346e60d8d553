"""Sol's weight residency: which decoder weights live on the device, which
live in host memory and are copied in ahead of use.

Two tiers per offloadable *unit* (a whole layer, or with
``weight_offload_policy: block`` its attention and MLP halves):

- **device** — the tensors the forward reads. On CUDA: GPU memory. On a
  CPU-only machine the same mechanism runs with the "device" tier being the
  resident tensors plus the staging slots, so the tests exercise it.
- **host** — a copy made when a unit is first offloaded (CUDA: pinned host
  memory, so copies are asynchronous DMA). An offloaded unit's device
  storage is freed (``untyped_storage().resize_(0)``), so the saving is real.

Offloaded layers are computed from a ring of ``prefetch_depth + 1`` staging
slots: while the forward computes offloaded layer j, the copier fills the
slots of the next ``prefetch_depth`` offloaded layers (CUDA: a side stream,
ordered by events; CPU: a background thread). A prefetch not ready within
``fallback_timeout_ms`` is abandoned for a synchronous copy into a separate
fallback buffer (``fallback_count``, a ``SOL_FALLBACK`` log line): the
output never changes, only the time does.

Policy (:func:`plan_residency`, pure, no torch) and mechanism
(:class:`WeightStore`) meet through :class:`ResidencyPlan`. The budget is
checked against measured allocations — the bytes of the tensors the store
actually holds on the device tier (and, on CUDA, ``memory_allocated``
deltas) — not estimates.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterator, Sequence

import torch

from ..errors import BudgetTooSmall

log = logging.getLogger("soldaemon.residency")

# LayerWeights fields that are never offloaded (a few KB: the norms).
ALWAYS_RESIDENT = ("ln1", "ln2")
ATTN = ("wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "sq", "sk", "sv", "so")   # s*: int8 storage's scales
MLP = ("wg", "wu", "wd", "sg", "su", "sd")
_ALIGN = 64  # bytes: slot views start on this boundary


# --------------------------------------------------------------------------
# Policy: which units stay resident (pure; tested without a device)
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class UnitInfo:
    """One offloadable part of a layer, as the planner sees it."""

    uid: int              # index in WeightStore.units
    layer: int
    part: str             # "layer" | "attn" | "mlp"
    nbytes: int           # device bytes when resident, all weight variants together
    copy_bytes: int       # bytes copied per use (the model-dtype variant)


@dataclass(frozen=True)
class ResidencyPlan:
    """What :func:`plan_residency` decided, with the bytes and the predicted
    latency cost of the decision."""

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
    """Choose the resident units under ``budget_bytes``.

    Everything stays resident when it fits (no slots needed). Otherwise
    ``prefetch_depth + 2`` buffers of ``slot_bytes`` (the ring + the
    fallback buffer) are reserved and units are kept in this order while
    they fit: the first ``first_layers`` layers (TTFT: they compute while
    the rest is fetched), then by heat — ``heat[layer] = (calls, stall_ms)``
    over the heatmap window, hotter first — then by layer index. Smaller
    units (block policy) fill what larger ones leave.

    Raises :class:`BudgetTooSmall` naming the parts when the fixed part,
    the KV reserve and the slots alone exceed the budget."""
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
        # A ring of prefetches hides copies behind compute at best; with no
        # prefetch every copy is on the critical path.
        hidden = compute_ms_per_forward if (prefetch_depth > 0 and compute_ms_per_forward) else 0.0
        extra_ms = max(0.0, copy_ms - hidden)
    return ResidencyPlan(budget_bytes, frozenset(kept), offloaded, fixed_bytes, kv_reserve_bytes, ring,
                         sum(units[i].nbytes for i in kept), copy_bytes, bandwidth_gbs,
                         compute_ms_per_forward, copy_ms, extra_ms)


# --------------------------------------------------------------------------
# The layer heatmap
# --------------------------------------------------------------------------


@dataclass
class _Forward:
    """One forward's per-layer record (lists indexed by layer)."""

    t: float                          # time.monotonic() at its end, s
    ms: list[float] | None            # compute per layer (CPU: measured; CUDA: None, kernels are async)
    outcomes: list[str] | None        # "resident" | "hit" | "late" | "miss" | "fallback"; None: all resident
    copied: list[int] | None          # bytes copied to run each layer
    stall_ms: list[float] | None      # time the forward waited for each layer's weights


_OUTCOME_KEYS = {"hit": "hits", "late": "late", "miss": "misses", "fallback": "fallbacks"}


class Heatmap:
    """Per-layer activity over the last ``window_s`` seconds: calls, compute
    time, bytes copied, prefetch outcomes (residency is added by the store's
    snapshot). One record per forward; written by the forward thread, read
    by the server's loop thread."""

    def __init__(self, n_layers: int, window_s: float) -> None:
        self.n_layers = n_layers
        self.window_s = window_s
        self._records: deque[_Forward] = deque()
        self._lock = threading.Lock()

    def add(self, rec: _Forward) -> None:
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
        out: list[dict[str, Any]] = []
        for r, n in zip(rows, timed):
            out.append({**r, "compute_ms": round(r["compute_ms"], 3), "stall_ms": round(r["stall_ms"], 3),
                        "mean_ms": round(r["compute_ms"] / n, 4) if n else None})
        return out

    def heat(self) -> dict[int, tuple[int, float]]:
        """layer → (calls, stall_ms) in the window: the planner's input."""
        return {r["layer"]: (r["calls"], r["stall_ms"]) for r in self.per_layer()}


# --------------------------------------------------------------------------
# Mechanism
# --------------------------------------------------------------------------


@dataclass
class _Unit:
    info: UnitInfo
    names: tuple[str, ...]
    # variant (0 = model dtype, 1 = half decode copy) → name → the tensor
    # object the backend (and, for variant 0, the HF module) holds. Offload
    # swaps its data for an empty tensor; restore swaps fresh device data in.
    tensors: list[dict[str, torch.Tensor]]
    resident: bool = True
    host: list[dict[str, torch.Tensor]] | None = None   # made at first offload, kept


@dataclass
class _Job:
    """A copy of one layer's offloaded tensors (one variant) into a slot."""

    layer: int
    variant: int
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
    misses: int = 0        # not prefetched: copied synchronously (first use, other variant)
    fallbacks: int = 0     # prefetch not ready within fallback_timeout_ms: synchronous copy
    stall_ms: float = 0.0  # time forwards waited for weights
    bytes_copied: int = 0

    @property
    def uses(self) -> int:
        return self.hits + self.late + self.misses + self.fallbacks

    @property
    def hit_rate(self) -> float | None:
        return self.hits / self.uses if self.uses else None


def measure_copy_bandwidth(device: torch.device, nbytes: int = 64 << 20, reps: int = 3) -> float:
    """Host→device copy bandwidth in GB/s (best of ``reps``): from pinned
    memory on CUDA, RAM→RAM on a CPU."""
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best = float("inf")
    for _ in range(reps):
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        dst.copy_(src, non_blocking=cuda)
        if cuda:
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / 1e9


class WeightStore:
    """The decoder layers' weights across the two tiers (see module doc).

    Built by the engine over a :class:`~.backend.LeanBackend`'s weight lists;
    ``backend.residency = store`` makes the forward read through it. All
    layers start resident; :meth:`apply_plan` moves units between tiers.
    Methods other than the snapshots are called with the engine's generation
    lock held (no forward in flight)."""

    def __init__(self, weight_sets: Sequence[Sequence[Any]], fixed: Sequence[torch.Tensor], device: torch.device,
                 *, policy: str = "layer", prefetch_depth: int = 2, fallback_timeout_ms: float = 50.0,
                 heatmap_window_s: float = 60.0) -> None:
        """``weight_sets[v][i]``: layer i's LayerWeights in variant v (0: the
        model dtype; 1: the optional half-precision decode copy).
        ``fixed``: tensors never offloaded (embedding, lm_head, final norm)."""
        if policy not in ("layer", "block"):
            raise ValueError(f"weight_offload_policy must be 'layer' or 'block', got {policy!r}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.weight_sets = [list(ws) for ws in weight_sets]
        self.n_variants = len(self.weight_sets)
        self.n_layers = len(self.weight_sets[0])
        self.policy = policy
        self.prefetch_depth = prefetch_depth
        self.fallback_timeout_s = fallback_timeout_ms / 1e3
        self.copy_delay_s = 0.0        # test hook: every prefetch copy sleeps this long first
        self.heatmap = Heatmap(self.n_layers, heatmap_window_s)
        self.stats = PrefetchStats()
        self.plan: ResidencyPlan | None = None
        self.released = False           # idle release in effect
        self._pins = 0
        parts = {"layer": (("layer", ATTN + MLP),), "block": (("attn", ATTN), ("mlp", MLP))}[policy]
        self.units: list[_Unit] = []
        self._layer_units: list[list[int]] = [[] for _ in range(self.n_layers)]
        for i in range(self.n_layers):
            for part, names in parts:
                present = tuple(n for n in names if getattr(self.weight_sets[0][i], n) is not None)
                dev = [{n: getattr(ws[i], n) for n in present} for ws in self.weight_sets]
                nbytes = _unique_bytes([t for d in dev for t in d.values()])
                copy_bytes = sum(_nbytes(t) for t in dev[0].values())
                uid = len(self.units)
                self.units.append(_Unit(UnitInfo(uid, i, part, nbytes, copy_bytes), present, dev))
                self._layer_units[i].append(uid)
        self._fixed = list(fixed) + [getattr(ws[i], n) for ws in self.weight_sets
                                     for i in range(self.n_layers) for n in ALWAYS_RESIDENT]
        # the biggest layer's offloadable bytes in any variant: one slot
        self.slot_bytes = max(sum(_aligned(_nbytes(getattr(ws[i], n))) for uid in self._layer_units[i]
                                  for n in self.units[uid].names)
                              for ws in self.weight_sets for i in range(self.n_layers))
        self._slots: list[torch.Tensor] = []          # [slot_bytes] uint8 each, the ring
        self._fallback: torch.Tensor | None = None   # [slot_bytes] uint8
        self._jobs: list[_Job | None] = []           # per slot: the copy it holds or is receiving
        self._order: list[int] = []                   # offloaded layers in execution order
        self._rank: dict[int, int] = {}               # layer → index in _order
        self._fwd_variant = 0
        self._fwd: _Forward | None = None
        self._copier: _Copier | None = None
        self.all_resident = True
        # bumped whenever a unit's device storage changes (offload/restore):
        # anything that captured weight addresses (CUDA graphs) must re-capture
        self.epoch = 0
        self._cuda_base = torch.cuda.memory_allocated(device) if self.cuda else 0
        # the memory scheduler's KV folding policy, shown in the prefetch snapshot
        self.kv_policy: Callable[[], dict[str, Any]] | None = None

    # -- sizes ------------------------------------------------------------------

    @property
    def unit_infos(self) -> list[UnitInfo]:
        return [u.info for u in self.units]

    @property
    def fixed_bytes(self) -> int:
        return _unique_bytes(self._fixed)

    def device_bytes(self) -> int:
        """Measured: bytes of every tensor storage the store holds on the
        device tier (resident units, fixed tensors, slots, fallback buffer),
        each storage counted once."""
        tensors = list(self._fixed) + list(self._slots)
        if self._fallback is not None:
            tensors.append(self._fallback)
        for u in self.units:
            if u.resident:
                tensors.extend(t for d in u.tensors for t in d.values())
        return _unique_bytes(tensors)

    def host_bytes(self) -> int:
        return _unique_bytes([t for u in self.units if u.host for d in u.host for t in d.values()])

    # -- planning -----------------------------------------------------------------

    def make_plan(self, budget_bytes: int | None, kv_reserve_bytes: int, *,
                  bandwidth_gbs: float | None = None, first_layers: int = 2) -> ResidencyPlan:
        compute = self._compute_ms_per_forward()
        return plan_residency(self.unit_infos, budget_bytes=budget_bytes, fixed_bytes=self.fixed_bytes,
                              kv_reserve_bytes=kv_reserve_bytes, slot_bytes=self.slot_bytes,
                              prefetch_depth=self.prefetch_depth, heat=self.heatmap.heat(),
                              first_layers=first_layers, bandwidth_gbs=bandwidth_gbs,
                              compute_ms_per_forward=compute)

    def _compute_ms_per_forward(self) -> float | None:
        rows = self.heatmap.per_layer()
        means = [r["mean_ms"] for r in rows]
        if any(m is None for m in means):
            return None
        return float(sum(means))

    def apply_plan(self, plan: ResidencyPlan) -> None:
        """Move units so that exactly ``plan.resident`` is on the device:
        offloads first (freeing memory), then restores in layer order.
        Afterwards device_bytes() <= the budget (offloads free before
        restores allocate)."""
        if self._pins:
            raise RuntimeError("cannot re-plan while a high-priority request pins the layers")
        self._drain()
        self._jobs = [None] * len(self._slots)   # slot contents were laid out for the old plan
        self.plan = plan
        for uid in plan.offloaded:
            self._offload(self.units[uid])
        self._set_ring(bool(plan.offloaded))
        for uid in sorted(plan.resident, key=lambda u: self.units[u].info.layer):
            self._restore(self.units[uid])
        self.released = False
        self._refresh()

    def _refresh(self) -> None:
        self.epoch += 1
        offl = [i for i in range(self.n_layers) if any(not self.units[u].resident for u in self._layer_units[i])]
        self._order = offl
        self._rank = {layer: j for j, layer in enumerate(offl)}
        self.all_resident = not offl

    @property
    def offloaded_layers(self) -> int:
        return len(self._order)

    def _offload(self, u: _Unit) -> None:
        if not u.resident:
            return
        if u.host is None:
            u.host = [{n: _host_copy(t, self.cuda) for n, t in d.items()} for d in u.tensors]
        for d in u.tensors:
            for t in d.values():
                # the backend's LayerWeights and the HF module hold this very
                # object: with its data swapped out the storage is freed
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        u.resident = False

    def _restore(self, u: _Unit) -> None:
        if u.resident:
            return
        assert u.host is not None
        for d, h in zip(u.tensors, u.host):
            for n, t in d.items():
                t.data = h[n].to(self.device, non_blocking=self.cuda, copy=True)
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        u.resident = True

    def _set_ring(self, on: bool) -> None:
        if on and not self._slots:
            n = self.prefetch_depth + 1
            self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(n)]
            self._fallback = torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
            self._jobs = [None] * n
            self._copier = _StreamCopier(self.device) if self.cuda else _ThreadCopier()
        elif not on and self._slots:
            self._drain()
            if self._copier is not None:
                self._copier.close()
            self._slots, self._fallback, self._jobs, self._copier = [], None, [], None

    def _drain(self) -> None:
        """Wait for every copy in flight (before slots are freed or re-planned)."""
        for job in self._jobs:
            if job is not None:
                _wait(job, None)

    # -- idle release, restore, pinning -------------------------------------------

    def release(self, keep_layers: int = 0) -> int:
        """Idle release: offload every unit of layers >= ``keep_layers`` and
        free the staging slots down to the ring the next request needs.
        Returns the device bytes freed (measured). No-op while pinned."""
        if self._pins or self.released:
            return 0
        before = self.device_bytes()
        self._drain()
        for u in self.units:
            if u.info.layer >= keep_layers:
                self._offload(u)
        self._set_ring(False)
        self._set_ring(True)
        self.released = True
        self._refresh()
        freed = before - self.device_bytes()
        log.info("idle release: %.1f MB of device memory freed (%d layers kept)", freed / 2**20, keep_layers)
        return freed

    def restore(self) -> float:
        """Bring back the current plan's resident set after an idle release,
        layer 0 first (the first layers are what the next prompt's TTFT
        waits on). Returns ms spent."""
        if not self.released:
            return 0.0
        t0 = time.perf_counter()
        plan = self.plan
        resident = plan.resident if plan else frozenset(u.info.uid for u in self.units)
        self._drain()
        for uid in sorted(resident, key=lambda u: self.units[u].info.layer):
            self._restore(self.units[uid])
        self._set_ring(bool(plan and plan.offloaded))
        self.released = False
        self._refresh()
        ms = (time.perf_counter() - t0) * 1e3
        log.info("restore after idle release: %.1f ms", ms)
        return ms

    @contextlib.contextmanager
    def pinned(self) -> Iterator[None]:
        """For a ``priority: high`` request: restore now, and neither idle
        release nor re-planning may move its layers until it ends."""
        self.restore()
        self._pins += 1
        try:
            yield
        finally:
            self._pins -= 1

    @property
    def pins(self) -> int:
        return self._pins

    # -- the forward's side ----------------------------------------------------------

    def begin_forward(self, variant: int) -> None:
        """Called by the forward before layer 0 (offloaded path only)."""
        self._fwd_variant = variant
        L = self.n_layers
        self._fwd = _Forward(0.0, None if self.cuda else [0.0] * L, ["resident"] * L, [0] * L, [0.0] * L)
        for j in range(min(self.prefetch_depth, len(self._order))):
            self._issue(j)

    def layer(self, i: int) -> tuple[Any, float, str, int]:
        """Layer i's weights for this forward: (LayerWeights, stall ms,
        outcome, bytes copied). Offloaded parts come from a slot."""
        v = self._fwd_variant
        w = self.weight_sets[v][i]
        j = self._rank.get(i)
        if j is None:
            return w, 0.0, "resident", 0
        # while layer i computes, the next prefetch_depth offloaded layers are in flight
        if self.prefetch_depth and j + self.prefetch_depth < len(self._order):
            self._issue(j + self.prefetch_depth)
        slot = j % len(self._slots)
        job = self._jobs[slot]
        t0 = time.perf_counter()
        outcome = "hit"
        nbytes = 0
        if job is None or job.layer != i or job.variant != v or job.cancelled:
            outcome = "miss"
            job = self._copy_now(i, v, slot)
        elif not job.ready():
            if _wait(job, self.fallback_timeout_s):
                outcome = "late"
            else:
                outcome = "fallback"
                job = self._fallback_copy(i, v, waited_s=time.perf_counter() - t0)
        if not job.used:   # a copy's bytes are counted at its first use
            nbytes = self._layer_copy_bytes(i, v)
            job.used = True
        if self.cuda and job.cuda_event is not None:
            torch.cuda.current_stream(self.device).wait_event(job.cuda_event)
        stall = (time.perf_counter() - t0) * 1e3
        fields = {n: t for u in self._layer_units[i] for n, t in
                  (self.units[u].tensors[v].items() if self.units[u].resident else
                   ((n, job.views[n]) for n in self.units[u].names))}
        return replace(w, **fields), stall, outcome, nbytes

    def end_layer(self, i: int, ms: float | None, stall_ms: float, outcome: str, copied: int) -> None:
        """Layer i's kernels are issued (CPU: computed)."""
        if outcome != "resident":
            j = self._rank[i]
            job = self._jobs[j % len(self._slots)] if outcome != "fallback" else None
            if job is not None and self.cuda:
                job.consumed = torch.cuda.Event()
                job.consumed.record(torch.cuda.current_stream(self.device))
            s = self.stats
            s.stall_ms += stall_ms
            s.bytes_copied += copied
            if outcome == "hit":
                s.hits += 1
            elif outcome == "late":
                s.late += 1
            elif outcome == "miss":
                s.misses += 1
            else:
                s.fallbacks += 1
        rec = self._fwd
        assert rec is not None and rec.outcomes is not None and rec.copied is not None and rec.stall_ms is not None
        if rec.ms is not None and ms is not None:
            rec.ms[i] = ms
        rec.outcomes[i], rec.copied[i], rec.stall_ms[i] = outcome, copied, stall_ms

    def end_forward(self) -> None:
        """After the last layer: record the heatmap and start fetching the
        first offloaded layers for the next forward (same variant)."""
        if self._fwd is not None:
            self._fwd.t = time.monotonic()
            self.heatmap.add(self._fwd)
            self._fwd = None
        if self._order:
            for j in range(min(self.prefetch_depth, len(self._order))):
                self._issue(j)

    def note_resident_forward(self, ms_by_layer: list[float] | None) -> None:
        """The all-resident fast path's heatmap record (one call per forward)."""
        self.heatmap.add(_Forward(time.monotonic(), ms_by_layer, None, None, None))

    # -- copies ---------------------------------------------------------------------

    def _layer_copy_bytes(self, i: int, v: int) -> int:
        return sum(_nbytes(t) for name, t in self._sources(i, v))

    def _sources(self, i: int, v: int) -> list[tuple[str, torch.Tensor]]:
        out: list[tuple[str, torch.Tensor]] = []
        for uid in self._layer_units[i]:
            u = self.units[uid]
            if not u.resident:
                assert u.host is not None
                out.extend(u.host[v].items())
        return out

    def _views(self, buf: torch.Tensor, srcs: list[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        views: dict[str, torch.Tensor] = {}
        off = 0
        for name, t in srcs:
            n = _nbytes(t)
            views[name] = buf[off:off + n].view(t.dtype).view(t.shape)
            off += _aligned(n)
        return views

    def _issue(self, j: int) -> None:
        """Start copying the j-th offloaded layer (this forward's variant)
        into its slot, unless the slot already holds or is receiving it."""
        i, v = self._order[j], self._fwd_variant
        slot = j % len(self._slots)
        old = self._jobs[slot]
        if old is not None and old.layer == i and old.variant == v and not old.cancelled:
            return
        if old is not None:
            old.cancelled = True
        srcs = self._sources(i, v)
        job = _Job(i, v, slot, time.perf_counter(), views=self._views(self._slots[slot], srcs))
        self._jobs[slot] = job
        assert self._copier is not None
        self._copier.submit(job, srcs, self.copy_delay_s, old)

    def _copy_now(self, i: int, v: int, slot: int) -> _Job:
        """Synchronous copy into ``slot`` (nothing was prefetched for it)."""
        old = self._jobs[slot]
        if old is not None:
            old.cancelled = True
            _wait(old, None)   # it may be mid-copy into this slot
        srcs = self._sources(i, v)
        job = _Job(i, v, slot, -1.0, views=self._views(self._slots[slot], srcs))
        for name, src in srcs:
            job.views[name].copy_(src, non_blocking=self.cuda)
        job.done.set()
        self._jobs[slot] = job
        return job

    def _fallback_copy(self, i: int, v: int, waited_s: float) -> _Job:
        assert self._fallback is not None
        srcs = self._sources(i, v)
        job = _Job(i, v, -1, -1.0, views=self._views(self._fallback, srcs))
        for name, src in srcs:
            job.views[name].copy_(src, non_blocking=self.cuda)
        job.done.set()
        log.warning("SOL_FALLBACK layer=%d prefetch not ready after %.1f ms (fallback_timeout_ms=%.1f): "
                    "synchronous copy", i, waited_s * 1e3, self.fallback_timeout_s * 1e3)
        return job

    # -- snapshots (any thread) ---------------------------------------------------

    def snapshot_heatmap(self) -> dict[str, Any]:
        resident = {u.info.layer for u in self.units if u.resident}
        partial = {u.info.layer for u in self.units if not u.resident}
        rows = self.heatmap.per_layer()
        for r in rows:
            layer = r["layer"]
            r["residency"] = ("offloaded" if layer not in resident else
                              "partial" if layer in partial else "resident")
        return {"window_s": self.heatmap.window_s, "policy": self.policy, "layers": rows}

    def snapshot_prefetch(self) -> dict[str, Any]:
        s = self.stats
        return {
            "depth": self.prefetch_depth, "fallback_timeout_ms": self.fallback_timeout_s * 1e3,
            "hit_rate": None if s.hit_rate is None else round(s.hit_rate, 4),
            "hits": s.hits, "late": s.late, "misses": s.misses, "fallbacks": s.fallbacks,
            "stall_ms": round(s.stall_ms, 2), "bytes_copied": s.bytes_copied,
            "offloaded_layers": self.offloaded_layers, "released": self.released, "pins": self._pins,
            "device_mb": round(self.device_bytes() / 2**20, 2),
            "cuda_allocated_delta_mb": (round((torch.cuda.memory_allocated(self.device) - self._cuda_base) / 2**20, 2)
                                        if self.cuda else None),
            "host_mb": round(self.host_bytes() / 2**20, 2),
            "plan": self.plan.describe(self.unit_infos) if self.plan else None,
            "kv_policy": self.kv_policy() if self.kv_policy is not None else None,
        }

    def close(self) -> None:
        self._set_ring(False)


# --------------------------------------------------------------------------
# Copiers: who moves the bytes
# --------------------------------------------------------------------------


class _Copier:
    def submit(self, job: _Job, srcs: list[tuple[str, torch.Tensor]], delay_s: float, previous: _Job | None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        pass


class _ThreadCopier(_Copier):
    """CPU: one background thread, jobs in FIFO order (so a job never
    overwrites a slot the previous job for that slot is still filling)."""

    def __init__(self) -> None:
        self._q: queue.Queue[tuple[_Job, list[tuple[str, torch.Tensor]], float] | None] = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="sol-prefetch", daemon=True)
        self._thread.start()

    def submit(self, job: _Job, srcs: list[tuple[str, torch.Tensor]], delay_s: float, previous: _Job | None) -> None:
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


class _StreamCopier(_Copier):
    """CUDA: copies from pinned memory on a side stream; the copy waits on
    the event of the compute that last read the slot, and records an event
    the compute stream waits on. No host synchronisation."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.stream = torch.cuda.Stream(device)

    def submit(self, job: _Job, srcs: list[tuple[str, torch.Tensor]], delay_s: float, previous: _Job | None) -> None:
        consumed = getattr(previous, "consumed", None) if previous is not None else None
        with torch.cuda.stream(self.stream):
            if consumed is not None:
                self.stream.wait_event(consumed)
            else:  # the slot's last reader may still be queued on the compute stream
                self.stream.wait_stream(torch.cuda.current_stream(self.device))
            if delay_s:
                torch.cuda._sleep(int(delay_s * 1e9))  # ≈ cycles at ~1 GHz: a test hook only
            for name, src in srcs:
                job.views[name].copy_(src, non_blocking=True)
            job.cuda_event = torch.cuda.Event()
            job.cuda_event.record(self.stream)
        job.done.set()


def _wait(job: _Job, timeout_s: float | None) -> bool:
    """Wait until ``job``'s copy has landed; False on timeout."""
    if job.cuda_event is None:
        return job.done.wait(timeout_s)
    if timeout_s is None:
        job.cuda_event.synchronize()
        return True
    end = time.perf_counter() + timeout_s
    while not job.cuda_event.query():
        if time.perf_counter() > end:
            return False
        time.sleep(20e-6)
    return True


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _unique_bytes(tensors: Sequence[torch.Tensor | None]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None:
            continue
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    out.copy_(t)
    return out


# --------------------------------------------------------------------------
# The engine's side: budget, idle release, priority
# --------------------------------------------------------------------------


def budget_bytes(budget: Any, device: torch.device) -> int | None:
    """``sol.memory_budget`` (a config MemoryBudget or None) in bytes. A
    fraction is of the GPU's total memory, or of RAM on a CPU."""
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
    """(free, total) bytes of the device's memory: the GPU's, or RAM's
    (available, total) on a CPU."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        return int(free), int(total)
    import psutil

    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def kv_memory_short(free: int, total: int, below: Any) -> bool:
    """Whether parked KV should be quantized: ``free`` bytes under
    ``below`` (a config MemoryBudget: MB or a fraction of ``total``)."""
    return free < below.resolve_bytes(total)


class MemoryScheduler:
    """Sol's memory contract for one engine: plan residency under the
    budget, release device memory after ``idle_release_s`` without requests
    and bring it back (layer 0 first) on the next one, pin a
    ``priority: high`` request's layers for its duration, and let KV
    folding quantize parked sessions only while memory is short.

    ``gen_lock`` is the engine's generation lock: release and restore hold
    it, so no forward runs while weights move. ``free_bytes`` () → (free,
    total) is how memory is read (default :func:`device_free_bytes`)."""

    def __init__(self, backend: Any, sol: Any, gen_lock: threading.Lock, *, kv_reserve_bytes: int,
                 idle_release: bool | None = None,
                 free_bytes: Callable[[], tuple[int, int]] | None = None) -> None:
        self.backend = backend
        self.sol = sol
        self.gen_lock = gen_lock
        self.kv_reserve_bytes = kv_reserve_bytes
        self.store = WeightStore(backend.weight_sets(), backend.fixed_weights(), backend.device,
                                 policy=sol.weight_offload_policy, prefetch_depth=sol.prefetch_depth,
                                 fallback_timeout_ms=sol.fallback_timeout_ms,
                                 heatmap_window_s=sol.layer_heatmap_window)
        self.budget = budget_bytes(sol.memory_budget, backend.device)
        self.bandwidth_gbs: float | None = None
        if self.budget is not None:
            self.bandwidth_gbs = measure_copy_bandwidth(backend.device)
            plan = self.store.make_plan(self.budget, kv_reserve_bytes, bandwidth_gbs=self.bandwidth_gbs)
            self.store.apply_plan(plan)
            log.info("residency plan: %s", plan.describe(self.store.unit_infos))
        backend.residency = self.store
        # On a CPU the host and device tiers are the same RAM: releasing
        # frees nothing, so idle release is a CUDA feature unless asked.
        self.idle_release_s = float(sol.idle_release_s)
        self.idle_release = (backend.device.type == "cuda") if idle_release is None else idle_release
        self.last_active = time.monotonic()
        self.releases = 0
        self._stop = threading.Event()
        self._timer: threading.Thread | None = None
        if self.idle_release and self.idle_release_s > 0:
            self._timer = threading.Thread(target=self._idle_loop, name="sol-idle", daemon=True)
            self._timer.start()
        # KV folding (sol.kv_folding_entropy_threshold > 0) quantizes parked
        # sessions only while free memory is under sol.kv_folding_free_below.
        # The lever is the session pool's contract: it scores, and so
        # quantizes, only when the backend records queries; without them a
        # parked session is only trimmed.
        self.kv_free_below = (getattr(sol, "kv_folding_free_below", None)
                              if float(getattr(sol, "kv_folding_entropy_threshold", 0.0)) > 0
                              and callable(getattr(backend, "record_queries", None)) else None)
        self._free_bytes = free_bytes or (lambda: device_free_bytes(backend.device))
        self.kv_quantizing: bool | None = None    # None: not managed (folding off, or always quantizing)
        self.kv_switches = 0                       # times kv_quantizing changed after the first decision
        self.store.kv_policy = self.kv_snapshot
        self.update_kv_folding()

    def touch(self) -> None:
        self.last_active = time.monotonic()

    @contextlib.contextmanager
    def request(self, priority: str = "normal") -> Iterator[None]:
        """Around one request (complete or warm): note activity, restore
        released weights (layer 0 first) and, for ``priority: high``, pin
        them until the request ends."""
        self.touch()
        if self.store.released:
            with self.gen_lock:
                self.restore()
        self.update_kv_folding()
        try:
            if priority == "high":
                with self.store.pinned():
                    yield
            else:
                yield
        finally:
            self.touch()

    def update_kv_folding(self) -> bool | None:
        """Read free memory; turn the backend's query recording (and so the
        pool's quantizing of parked sessions, from the next document switch
        on) on when it is under ``sol.kv_folding_free_below``, off when not.
        Called at start and before each request; takes the generation lock
        only when the state changes. Returns the state (None: not managed)."""
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
        """``debug`` → ``prefetch.kv_policy``: whether the policy is managed
        here, whether parked sessions are quantized now, the setting, and how
        often that changed."""
        return {"managed": self.kv_free_below is not None, "quantizing": self.kv_quantizing,
                "free_below": str(self.kv_free_below) if self.kv_free_below is not None else None,
                "switches": self.kv_switches}

    def restore(self) -> float:
        """Restore after an idle release, re-planning from the heatmap
        (call with the generation lock held)."""
        if not self.store.released:
            return 0.0
        ms = self.store.restore()
        if self.budget is not None and not self.store.pins:
            plan = self.store.make_plan(self.budget, self.kv_reserve_bytes, bandwidth_gbs=self.bandwidth_gbs)
            if plan.resident != (self.store.plan.resident if self.store.plan else None):
                self.store.apply_plan(plan)
        self._invalidate_graphs()
        return ms

    def _invalidate_graphs(self) -> None:
        """Restored weights live at new addresses: CUDA graphs captured over
        the old ones (runtime/cudagraph.py) must not replay."""
        graphs = getattr(self.backend, "graphs", None)
        if graphs is None:
            return
        invalidate = getattr(graphs, "invalidate", None)
        if callable(invalidate):
            invalidate()
        else:  # until GraphDecoder keys its graphs on backend.weights_epoch
            cached = getattr(graphs, "_graphs", None)
            if isinstance(cached, dict):
                cached.clear()

    def release_if_idle(self, now: float | None = None) -> int:
        """Release when idle for idle_release_s; bytes freed (0: not now).
        Skips when a request holds the generation lock or pins layers."""
        now = time.monotonic() if now is None else now
        if (self.idle_release_s <= 0 or self.store.released or self.store.pins
                or now - self.last_active < self.idle_release_s):
            return 0
        if not self.gen_lock.acquire(blocking=False):
            return 0
        try:
            freed = self.store.release()
            self._invalidate_graphs()
        finally:
            self.gen_lock.release()
        if freed and self.store.cuda:
            torch.cuda.empty_cache()
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
