"""Sol's weight store: each offloadable unit (a layer, or its attention and MLP halves with
``weight_offload_policy: block``) is on the device or offloaded to a host copy (pinned on CUDA),
its device storage freed. Offloaded layers run from a ring of prefetched staging slots
(:mod:`.prefetch`); a late prefetch falls back to a synchronous copy (``SOL_FALLBACK``). Which
units stay is :mod:`soldaemon.policy.residency`'s plan; the budget is checked on measured bytes."""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass, replace
from typing import Any, Callable, Iterator, Sequence

import torch

from soldaemon.policy.residency import ForwardRecord, Heatmap, ResidencyPlan, UnitInfo, plan_residency
from soldaemon.runtime.forward.timing import timed
from soldaemon.runtime.forward.weights import storage_bytes
from soldaemon.runtime.memory.prefetch import Copier, CopyJob, PrefetchStats, StreamCopier, ThreadCopier, order_after, wait_copy

log = logging.getLogger("soldaemon.residency")

# LayerWeights fields that are never offloaded (a few KB: the norms).
ALWAYS_RESIDENT = ("ln1", "ln2")
ATTN = ("wqkv", "bqkv", "wo", "bo", "sqkv", "so")   # s*: int8 storage's scales
MLP = ("wgu", "wd", "sgu", "sd")
_ALIGN = 64  # bytes: slot views start on this boundary


@dataclass
class _Unit:
    info: UnitInfo
    names: tuple[str, ...]
    # name → the tensor the backend holds (HF parameters may view it); offload shrinks its
    # storage to nothing, restore grows it back and copies the host data in
    tensors: dict[str, torch.Tensor]
    resident: bool = True
    host: dict[str, torch.Tensor] | None = None   # made at first offload, kept
    # each tensor's storage size while resident (None: not resizable, swapped instead)
    storage_bytes: dict[str, int | None] | None = None


def measure_copy_bandwidth(device: torch.device, nbytes: int = 64 << 20, reps: int = 3) -> float:
    """Host→device copy bandwidth in GB/s (best of ``reps``): from pinned
    memory on CUDA, RAM→RAM on a CPU."""
    cuda = device.type == "cuda"
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    src.fill_(1)
    dst = torch.empty(nbytes, dtype=torch.uint8, device=device)
    best_ms = min(timed(lambda: dst.copy_(src, non_blocking=cuda), device)[1] for _ in range(reps))
    return nbytes / (best_ms / 1e3) / 1e9


class WeightStore:
    """The decoder layers' weights across device and host (module doc); the forward reads through
    it after ``backend.read_through(store)``. All layers start resident; :meth:`apply_plan` moves
    units. Call everything but the snapshots with the generation lock held."""

    def __init__(self, layers: Sequence[Any], fixed: Sequence[torch.Tensor], device: torch.device,
                 *, policy: str = "layer", prefetch_depth: int = 2, fallback_timeout_ms: float = 50.0,
                 heatmap_window_s: float = 60.0, kv_policy: Callable[[], dict[str, Any]] | None = None) -> None:
        """``layers[i]``: layer i's LayerWeights (the list is the backend's, updated in place).
        ``fixed``: tensors never offloaded. ``kv_policy``: gives the KV folding state the prefetch snapshot shows."""
        if policy not in ("layer", "block"):
            raise ValueError(f"weight_offload_policy must be 'layer' or 'block', got {policy!r}")
        self.device = device
        self.cuda = device.type == "cuda"
        self.layers = layers
        self.n_layers = len(layers)
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
                dev = {n: getattr(layers[i], n) for n in names if getattr(layers[i], n) is not None}
                nbytes = storage_bytes(list(dev.values()))
                uid = len(self.units)
                self.units.append(_Unit(UnitInfo(uid, i, part, nbytes, sum(map(_nbytes, dev.values()))),
                                        tuple(dev), dev))
                self._layer_units[i].append(uid)
        self._fixed = list(fixed) + [getattr(w, n) for w in layers for n in ALWAYS_RESIDENT]
        # the biggest layer's offloadable bytes: one slot
        self.slot_bytes = max(sum(_aligned(_nbytes(getattr(layers[i], n))) for uid in self._layer_units[i]
                                  for n in self.units[uid].names)
                              for i in range(self.n_layers))
        self._slots: list[torch.Tensor] = []          # [slot_bytes] uint8 each, the ring
        self._fallback: torch.Tensor | None = None   # [slot_bytes] uint8
        self._jobs: list[CopyJob | None] = []           # per slot: the copy it holds or is receiving
        self._order: list[int] = []                   # offloaded layers in execution order
        self._rank: dict[int, int] = {}               # layer → index in _order
        self._fwd: ForwardRecord | None = None
        self._copier: Copier | None = None
        self.all_resident = True
        # bumped when device storage changes: whatever captured weight addresses must re-capture
        self.epoch = 0
        self._cuda_base = torch.cuda.memory_allocated(device) if self.cuda else 0
        self.kv_policy = kv_policy

    # -- sizes ------------------------------------------------------------------

    @property
    def unit_infos(self) -> list[UnitInfo]:
        return [u.info for u in self.units]

    @property
    def fixed_bytes(self) -> int:
        return storage_bytes(self._fixed)

    def device_bytes(self) -> int:
        """Measured bytes of every storage the store holds on the device, each counted once."""
        resident = [t for u in self.units if u.resident for t in u.tensors.values()]
        return storage_bytes([*self._fixed, *self._slots, self._fallback, *resident])

    def host_bytes(self) -> int:
        return storage_bytes([t for u in self.units if u.host for t in u.host.values()])

    # -- planning -----------------------------------------------------------------

    def make_plan(self, budget_bytes: int | None, kv_reserve_bytes: int, *,
                  bandwidth_gbs: float | None = None, first_layers: int = 2) -> ResidencyPlan:
        means = [r["mean_ms"] for r in self.heatmap.per_layer()]
        compute = None if any(m is None for m in means) else float(sum(means))
        return plan_residency(self.unit_infos, budget_bytes=budget_bytes, fixed_bytes=self.fixed_bytes,
                              kv_reserve_bytes=kv_reserve_bytes, slot_bytes=self.slot_bytes,
                              prefetch_depth=self.prefetch_depth, heat=self.heatmap.heat(),
                              first_layers=first_layers, bandwidth_gbs=bandwidth_gbs,
                              compute_ms_per_forward=compute)

    def apply_plan(self, plan: ResidencyPlan) -> None:
        """Move units so that exactly ``plan.resident`` is on the device: offloads first, so
        memory is freed before restores (in layer order) allocate. Raises while pinned."""
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

    def offloaded_copy_bytes(self) -> int:
        """Bytes one forward copies to the device: every offloaded layer's."""
        return sum(self._layer_copy_bytes(i) for i in self._order)

    def _offload(self, u: _Unit) -> None:
        if not u.resident:
            return
        if u.host is None:
            u.host = {n: _host_copy(t, self.cuda) for n, t in u.tensors.items()}
        if u.storage_bytes is None:
            u.storage_bytes = {n: t.untyped_storage().nbytes() if t.untyped_storage().resizable() else None
                               for n, t in u.tensors.items()}
        for n, t in u.tensors.items():
            # the storage is shared with the HF module's views: freed for all; one that cannot
            # shrink (a file mapping) is a parameter no view holds: its data is swapped out
            if u.storage_bytes[n] is None:
                t.data = torch.empty(0, dtype=t.dtype, device=t.device)
            else:
                t.untyped_storage().resize_(0)
        u.resident = False

    def _restore(self, u: _Unit) -> None:
        if u.resident:
            return
        assert u.host is not None and u.storage_bytes is not None
        with torch.no_grad():
            for n, t in u.tensors.items():
                size = u.storage_bytes[n]
                if size is None:
                    t.data = u.host[n].to(self.device, non_blocking=self.cuda, copy=True)
                    continue
                t.untyped_storage().resize_(size)           # the same storage: every view sees it again
                t.copy_(u.host[n], non_blocking=self.cuda)
        if self.cuda:
            torch.cuda.current_stream(self.device).synchronize()
        u.resident = True

    def _set_ring(self, on: bool) -> None:
        if on and not self._slots:
            n = self.prefetch_depth + 1
            self._slots = [torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device) for _ in range(n)]
            self._fallback = torch.empty(self.slot_bytes, dtype=torch.uint8, device=self.device)
            self._jobs = [None] * n
            self._copier = StreamCopier(self.device) if self.cuda else ThreadCopier()
        elif not on and self._slots:
            self._drain()
            if self._copier is not None:
                self._copier.close()
            self._slots, self._fallback, self._jobs, self._copier = [], None, [], None

    def _drain(self) -> None:
        """Wait for every copy in flight (before slots are freed or re-planned)."""
        for job in self._jobs:
            if job is None:
                continue
            if job.cuda_event is not None:
                job.cuda_event.synchronize()   # outside any forward: slots are about to be freed
            else:
                wait_copy(job, None)

    # -- idle release, restore, pinning -------------------------------------------

    def release(self) -> int:
        """Idle release: offload every unit and free the staging slots down to the ring the next
        request needs. Returns the device bytes freed (measured). No-op while pinned."""
        if self._pins or self.released:
            return 0
        before = self.device_bytes()
        self._drain()
        for u in self.units:
            self._offload(u)
        self._set_ring(False)
        self._set_ring(True)
        self.released = True
        self._refresh()
        freed = before - self.device_bytes()
        log.info("idle release: %.1f MB of device memory freed", freed / 2**20)
        return freed

    def restore(self) -> float:
        """Bring back the plan's resident set after an idle release, layer 0 first (the next
        prompt waits on the first layers). Returns ms spent."""
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

    def begin_forward(self) -> None:
        """Called by the forward before layer 0 (offloaded path only)."""
        L = self.n_layers
        self._fwd = ForwardRecord(0.0, None if self.cuda else [0.0] * L, ["resident"] * L, [0] * L, [0.0] * L)
        self._issue_first()

    def layer(self, i: int) -> tuple[Any, float, str, int]:
        """Layer i's weights for this forward: (LayerWeights, stall ms,
        outcome, bytes copied). Offloaded parts come from a slot."""
        w = self.layers[i]
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
        if job is None or job.layer != i or job.cancelled:
            outcome = "miss"
            job = self._copy_now(i, slot)
        elif self.cuda:
            # the compute stream waits on the copy's event below: no host wait,
            # no fallback copy (a second copy of the same bytes would only queue)
            outcome = "hit" if job.ready() else "late"
        elif not job.ready():
            if wait_copy(job, self.fallback_timeout_s):
                outcome = "late"
            else:
                outcome = "fallback"
                job = self._fallback_copy(i, waited_s=time.perf_counter() - t0)
        if not job.used:   # a copy's bytes are counted at its first use
            nbytes = self._layer_copy_bytes(i)
            job.used = True
        if self.cuda:
            order_after(job, torch.cuda.current_stream(self.device))
        stall = (time.perf_counter() - t0) * 1e3
        fields = {n: t for u in self._layer_units[i] for n, t in
                  (self.units[u].tensors.items() if self.units[u].resident else
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
            counter = {"hit": "hits", "late": "late", "miss": "misses"}.get(outcome, "fallbacks")
            setattr(s, counter, getattr(s, counter) + 1)
        rec = self._fwd
        assert rec is not None and rec.outcomes is not None and rec.copied is not None and rec.stall_ms is not None
        if rec.ms is not None and ms is not None:
            rec.ms[i] = ms
        rec.outcomes[i], rec.copied[i], rec.stall_ms[i] = outcome, copied, stall_ms

    def end_forward(self) -> None:
        """After the last layer: record the heatmap and start fetching the
        first offloaded layers for the next forward."""
        if self._fwd is not None:
            self._fwd.t = time.monotonic()
            self.heatmap.add(self._fwd)
            self._fwd = None
        self._issue_first()

    def _issue_first(self) -> None:
        """Start fetching the first ``prefetch_depth`` offloaded layers."""
        for j in range(min(self.prefetch_depth, len(self._order))):
            self._issue(j)

    def note_resident_forward(self, ms_by_layer: list[float] | None) -> None:
        """The all-resident fast path's heatmap record (one call per forward)."""
        self.heatmap.add(ForwardRecord(time.monotonic(), ms_by_layer, None, None, None))

    # -- copies ---------------------------------------------------------------------

    def _layer_copy_bytes(self, i: int) -> int:
        return sum(_nbytes(t) for name, t in self._sources(i))

    def _sources(self, i: int) -> list[tuple[str, torch.Tensor]]:
        out: list[tuple[str, torch.Tensor]] = []
        for uid in self._layer_units[i]:
            u = self.units[uid]
            if not u.resident:
                assert u.host is not None
                out.extend(u.host.items())
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
        """Start copying the j-th offloaded layer into its slot, unless the slot already
        holds or is receiving it."""
        i = self._order[j]
        slot = j % len(self._slots)
        old = self._jobs[slot]
        if old is not None and old.layer == i and not old.cancelled:
            return
        if old is not None:
            old.cancelled = True
        srcs = self._sources(i)
        job = CopyJob(i, slot, time.perf_counter(), views=self._views(self._slots[slot], srcs))
        self._jobs[slot] = job
        assert self._copier is not None
        self._copier.submit(job, srcs, self.copy_delay_s, old)

    def _copy_now(self, i: int, slot: int) -> CopyJob:
        """Synchronous copy into ``slot`` (nothing was prefetched for it)."""
        old = self._jobs[slot]
        if old is not None:
            old.cancelled = True
            if self.cuda:          # it may be mid-copy into this slot: the copy below queues after it
                order_after(old, torch.cuda.current_stream(self.device))
            else:
                wait_copy(old, None)
        job = self._jobs[slot] = self._copy_into(i, slot, self._slots[slot])
        return job

    def _copy_into(self, i: int, slot: int, buf: torch.Tensor) -> CopyJob:
        """Layer i's offloaded tensors copied into ``buf`` now: a finished job."""
        srcs = self._sources(i)
        job = CopyJob(i, slot, -1.0, views=self._views(buf, srcs))
        for name, src in srcs:
            job.views[name].copy_(src, non_blocking=self.cuda)
        job.done.set()
        return job

    def _fallback_copy(self, i: int, waited_s: float) -> CopyJob:
        assert self._fallback is not None
        job = self._copy_into(i, -1, self._fallback)
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


def _nbytes(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.numel() * t.element_size()


def _aligned(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _host_copy(t: torch.Tensor, pin: bool) -> torch.Tensor:
    out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
    out.copy_(t)
    return out
