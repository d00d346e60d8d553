"""Sol's weight residency on the CPU (the same mechanism as on CUDA, with the
staging slots and the copier thread standing in for GPU memory and the side
stream): logits identical under any budget, the budget never exceeded
(measured), fallbacks under injected copy delays, hit-rate accounting,
idle release and restore, priority pins, the heatmap; the engine's wiring;
the GPU script's CPU dry run."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from soldaemon.api import CancelToken, CompletionRequest, Done
from soldaemon.config import config_from_dict
from soldaemon.errors import ConfigError
from soldaemon.runtime.forward.backend import LeanBackend
from soldaemon.policy.kernel_plan import KernelPlan
from soldaemon.runtime.engine.local import LocalEngine
from soldaemon.errors import BudgetTooSmall
from soldaemon.policy.residency import UnitInfo, plan_residency
from soldaemon.runtime.memory.scheduler import MemoryScheduler
from soldaemon.runtime.memory.weightstore import WeightStore
from soldaemon_bench.tiny import build_tiny_model

ROOT = Path(__file__).resolve().parents[1]
LAYERS = 6


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny-res"), layers=LAYERS, hidden=128)


def _backend(path: Path, half: bool = True) -> LeanBackend:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(path))
    model.eval()
    # half: int8 weights with a short-forward kernel unlike the prefill one
    plan = KernelPlan("int8", "int8-dynamic", "int8", "float32", "float32") if half else None
    return LeanBackend(model, 512, plan=plan)


def _store(b: LeanBackend, **kw) -> WeightStore:
    store = WeightStore(b.layers, b.fixed_weights(), b.device, **kw)
    b.read_through(store)
    return store


def _budget_for(store: WeightStore, resident_layers: int) -> int:
    """A budget that keeps about ``resident_layers`` layers resident."""
    per_layer = sum(u.info.nbytes for u in store.units) // store.n_layers
    return store.fixed_bytes + (store.prefetch_depth + 2) * store.slot_bytes + resident_layers * per_layer + 1


def _run(b: LeanBackend, ids: torch.Tensor, steps: int) -> list[torch.Tensor]:
    """Prefill (precise) + decode steps (half weights): every logits tensor."""
    out = [b.forward(ids, 0, last_only=False, precise=True)]
    tok = int(out[0][-1].argmax())
    for s in range(steps):
        logits = b.forward(torch.tensor([tok]), len(ids) + s)
        out.append(logits)
        tok = int(logits[0].argmax())
    return out


# -- the planner (pure) --------------------------------------------------------


def _units(n: int, nbytes: int = 100) -> list[UnitInfo]:
    return [UnitInfo(i, i, "layer", nbytes, nbytes) for i in range(n)]


def test_plan_keeps_everything_when_it_fits() -> None:
    plan = plan_residency(_units(8), budget_bytes=1000, fixed_bytes=100, kv_reserve_bytes=100, slot_bytes=100,
                          prefetch_depth=2)
    assert len(plan.resident) == 8 and plan.offloaded == () and plan.slot_bytes == 0
    assert plan_residency(_units(8), budget_bytes=None, fixed_bytes=0, kv_reserve_bytes=0, slot_bytes=1,
                          prefetch_depth=2).offloaded == ()


def test_plan_order_first_layers_then_heat_and_predicted_cost() -> None:
    # room for 3 units after fixed 100 + kv 100 + 4 slots of 100
    plan = plan_residency(_units(8), budget_bytes=900, fixed_bytes=100, kv_reserve_bytes=100, slot_bytes=100,
                          prefetch_depth=2, heat={5: (10, 0.0), 6: (10, 3.0)}, first_layers=1,
                          bandwidth_gbs=1e-6, compute_ms_per_forward=0.1)
    assert plan.resident == frozenset({0, 6, 5})     # first layer, then hottest (stalls break ties)
    assert plan.offloaded == (1, 2, 3, 4, 7)
    assert plan.planned_bytes <= 900
    assert plan.copy_bytes_per_forward == 500
    assert plan.predicted_copy_ms == pytest.approx(500 / 1e3 * 1e3)   # 500 B at 1 kB/s
    assert plan.predicted_extra_ms == pytest.approx(500.0 - 0.1)


def test_plan_block_units_fill_the_gaps() -> None:
    units = [UnitInfo(2 * i, i, "attn", 30, 30) for i in range(4)] + [UnitInfo(2 * i + 1, i, "mlp", 70, 70)
                                                                       for i in range(4)]
    units.sort(key=lambda u: u.uid)
    plan = plan_residency(units, budget_bytes=330, fixed_bytes=0, kv_reserve_bytes=0, slot_bytes=50,
                          prefetch_depth=0)  # room 230: layers 0, 1 whole (200), then one attn (30)
    assert plan.resident == frozenset({0, 1, 2, 3, 4})
    assert plan.resident_bytes == 230


def test_plan_budget_too_small_names_the_parts() -> None:
    with pytest.raises(BudgetTooSmall, match="embedding/lm_head/norms .* KV caches .* staging buffers"):
        plan_residency(_units(4), budget_bytes=300, fixed_bytes=200, kv_reserve_bytes=100, slot_bytes=100,
                       prefetch_depth=1)


# -- the mechanism -------------------------------------------------------------------


@pytest.mark.parametrize("policy", ["layer", "block"])
def test_outputs_identical_under_any_budget_and_budget_never_exceeded(tiny_path: Path, policy: str) -> None:
    ref = _backend(tiny_path)
    ids = torch.randint(0, 2000, (40,), generator=torch.Generator().manual_seed(1))
    expected = _run(ref, ids, 6)
    b = _backend(tiny_path)
    store = _store(b, policy=policy, prefetch_depth=2)
    full = store.device_bytes()
    for resident in (LAYERS, 4, 3, 1, 0):
        budget = full if resident == LAYERS else _budget_for(store, resident)
        plan = store.make_plan(budget, 0, bandwidth_gbs=5.0)
        store.apply_plan(plan)
        assert store.device_bytes() <= budget                   # measured, right after re-planning
        assert b.all_resident == (budget >= full)               # offload only when it does not fit
        got = _run(b, ids, 6)
        assert store.device_bytes() <= budget                   # and after forwards
        for e, g in zip(expected, got):
            assert torch.equal(e, g), f"logits differ with {resident} resident layers ({policy})"
    assert store.offloaded_layers == LAYERS                     # the last budget: nothing resident
    assert store.stats.fallbacks == 0
    store.close()


def test_offload_frees_the_module_storage(tiny_path: Path) -> None:
    b = _backend(tiny_path, half=False)
    store = _store(b, prefetch_depth=1)
    w = b.layers[3].wgu
    before = store.device_bytes()
    store.apply_plan(store.make_plan(_budget_for(store, 2), 0))
    assert w.untyped_storage().nbytes() == 0      # the HF parameter itself gave its memory up
    assert store.device_bytes() < before
    store.apply_plan(store.make_plan(None, 0))
    assert w.numel() > 0 and b.all_resident
    store.close()


def test_injected_copy_delay_counts_fallbacks_and_logs(tiny_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ref = _backend(tiny_path)
    ids = torch.randint(0, 2000, (20,), generator=torch.Generator().manual_seed(2))
    expected = _run(ref, ids, 3)
    b = _backend(tiny_path)
    store = _store(b, prefetch_depth=2, fallback_timeout_ms=5.0)
    store.apply_plan(store.make_plan(_budget_for(store, 0), 0))
    store.copy_delay_s = 0.05              # every prefetch copy 50 ms late: far past 5 ms
    with caplog.at_level(logging.WARNING, logger="soldaemon.residency"):
        got = _run(b, ids, 3)
    for e, g in zip(expected, got):
        assert torch.equal(e, g)
    s = store.stats
    assert s.fallbacks > 0
    assert s.hits + s.late + s.misses + s.fallbacks == 4 * store.offloaded_layers
    assert sum("SOL_FALLBACK" in r.message for r in caplog.records) == s.fallbacks
    # a delay inside the timeout is waited for (late), not a fallback
    store.copy_delay_s, store.fallback_timeout_s = 0.005, 1.0
    before = s.fallbacks
    _run(b, ids, 1)
    assert s.fallbacks == before and s.late > 0
    store.close()


def test_hit_rate_accounting(tiny_path: Path) -> None:
    b = _backend(tiny_path, half=False)
    store = _store(b, prefetch_depth=0)           # no prefetch: every offloaded use is a miss
    store.apply_plan(store.make_plan(_budget_for(store, 2), 0))
    n_off = store.offloaded_layers
    assert n_off >= 3
    ids = torch.arange(10)
    _run(b, ids, 2)
    assert (store.stats.misses, store.stats.hits, store.stats.hit_rate) == (3 * n_off, 0, 0.0)
    store.close()

    b = _backend(tiny_path, half=False)
    store = _store(b, prefetch_depth=2)
    store.apply_plan(store.make_plan(_budget_for(store, 1), 0))
    assert store.offloaded_layers >= 4
    _run(b, ids, 4)
    s = store.stats
    assert s.uses == 5 * store.offloaded_layers
    assert s.misses == 0 and s.fallbacks == 0            # every use was prefetched (in time, or waited for)
    assert s.hit_rate == s.hits / s.uses and s.hits > 0
    rows = store.snapshot_heatmap()["layers"]
    assert sum(r["hits"] + r["late"] for r in rows) == s.hits + s.late
    assert sum(r["bytes_copied"] for r in rows) == s.bytes_copied > 0
    store.close()


def test_idle_release_restore_and_priority_pin(tiny_path: Path) -> None:
    ref = _backend(tiny_path)
    ids = torch.randint(0, 2000, (16,), generator=torch.Generator().manual_seed(3))
    expected = _run(ref, ids, 2)
    b = _backend(tiny_path)
    sol = config_from_dict({"sol": {"idle_release_s": 0.5, "prefetch_depth": 1}}).sol
    lock = __import__("threading").Lock()
    mem = MemoryScheduler(b, sol, lock, kv_reserve_bytes=0, idle_release=True)
    store = mem.store
    full = store.device_bytes()
    assert b.all_resident and mem.release_if_idle() == 0          # not idle yet
    with mem.request("high"):
        assert mem.release_if_idle(time.monotonic() + 10) == 0   # pinned: nothing moves
    freed = mem.release_if_idle(time.monotonic() + 10)
    assert freed > 0 and store.released and not b.all_resident
    assert store.device_bytes() == full - freed < full
    # released, a forward still gives the same logits (through the slots)
    for e, g in zip(expected, _run(b, ids, 2)):
        assert torch.equal(e, g)
    epoch = b.weights_epoch
    with mem.request("normal"):                                   # the next request restores, layer 0 first
        assert not store.released and b.all_resident
        assert b.weights_epoch != epoch                           # new addresses: graphs must re-capture
        assert store.device_bytes() == full
    # the timer thread releases by itself after idle_release_s
    deadline = time.monotonic() + 5
    while not store.released and time.monotonic() < deadline:
        time.sleep(0.05)
    assert store.released and mem.releases == 2
    mem.close()


class FrozenClock:
    """``time`` with a ``monotonic()`` the test moves: the heatmap's window
    is judged on the test's clock, not on how long a busy machine took
    between two forwards."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def __getattr__(self, name: str) -> object:
        return getattr(time, name)


def test_heatmap_window_and_contents(tiny_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FrozenClock()
    monkeypatch.setattr("soldaemon.runtime.memory.weightstore.time", clock)
    monkeypatch.setattr("soldaemon.policy.residency.time", clock)
    b = _backend(tiny_path, half=False)
    store = _store(b, prefetch_depth=1, heatmap_window_s=0.5)
    ids = torch.arange(8)
    _run(b, ids, 2)
    rows = store.snapshot_heatmap()["layers"]
    assert [r["layer"] for r in rows] == list(range(LAYERS))
    assert all(r["calls"] == 3 and r["residency"] == "resident" and r["mean_ms"] > 0 for r in rows)
    store.apply_plan(store.make_plan(_budget_for(store, 2), 0))
    _run(b, ids, 0)
    rows = store.snapshot_heatmap()["layers"]
    assert {r["residency"] for r in rows} == {"resident", "offloaded"}
    assert all(r["calls"] == 4 for r in rows)
    clock.now += 0.6
    assert all(r["calls"] == 0 for r in store.snapshot_heatmap()["layers"])   # out of the window
    store.close()


# -- the engine ----------------------------------------------------------------------


def _engine(path: Path, sol: dict) -> LocalEngine:
    from soldaemon.weights.loader import load_model

    config = config_from_dict({"model": {"path": str(path), "max_context": 512, "kv_sessions": 2,
                                         "max_prefix_tokens": 300, "max_suffix_tokens": 100},
                               "completion": {"max_tokens": 64}, "device": {"device": "cpu"}, "sol": sol})
    loaded = load_model(str(path), device="cpu", dtype="auto", progress=False)
    return LocalEngine(loaded, config)


def test_engine_under_a_budget_reports_and_answers_the_same(tiny_path: Path) -> None:
    plain = _engine(tiny_path, {})
    req = CompletionRequest(id="a", prefix="def f(a, b):\n    return ", suffix="\n", max_tokens=8)
    want = [e for e in plain.complete(req, CancelToken()) if isinstance(e, Done)][0].items
    assert plain.diagnosis()["offloaded_layers"] == 0 and plain.backend.all_resident  # type: ignore[attr-defined]
    assert plain.debug_snapshots()["heatmap"]["layers"][0]["calls"] > 0
    plain.close()

    assert plain.memory is not None
    store = plain.memory.store
    kv = 2 * plain.backend.kv_bytes_per_session  # type: ignore[attr-defined]
    layers = store.device_bytes() - store.fixed_bytes
    # room for the fixed tensors, the KV caches, the staging slots and a fifth of the layers
    mb = (store.fixed_bytes + kv + 3 * store.slot_bytes + layers // 5) / 2**20
    eng = _engine(tiny_path, {"memory_budget": f"{mb:.2f}MB", "prefetch_depth": 1})
    got = [e for e in eng.complete(req, CancelToken()) if isinstance(e, Done)][0].items
    assert got == want
    d = eng.diagnosis()
    assert d["offloaded_layers"] > 0 and d["fallback_count"] == 0 and 0 <= d["prefetch_hit_rate"] <= 1
    snap = eng.debug_snapshots()
    assert snap["prefetch"]["plan"]["offloaded_layers"] and snap["prefetch"]["plan"]["predicted_copy_ms"] > 0
    assert eng.memory is not None
    assert eng.memory.store.device_bytes() + eng.pool.kv_bytes() <= int(mb * 2**20)
    eng.close()

    with pytest.raises(ConfigError, match="memory_budget.*minimum"):
        _engine(tiny_path, {"memory_budget": 1})


# -- the GPU script's CPU dry run --------------------------------------------------------


def test_gpu_memory_script_cpu_dry_run(tmp_path: Path) -> None:
    out = tmp_path / "gpu_memory.json"
    # 12 layers: with one weight copy, half of them must outweigh the 4 staging slots
    deep = build_tiny_model(tmp_path / "deep", layers=12, hidden=128)
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_memory.py"), "--device", "cpu",
                           "--model", str(deep), "--prompt-tokens", "64", "--tokens", "4", "--json", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["device"] == "cpu" and data["copy_bandwidth_gbs"] > 0
    rows = {r["resident_pct"]: r for r in data["rows"]}
    assert set(rows) == {100, 75, 50}
    assert rows[100]["offloaded_layers"] == 0 and rows[50]["offloaded_layers"] > 0
    assert all(r["same_tokens"] for r in data["rows"])
    assert "resident" in proc.stdout and "predicted" in proc.stdout
    trim, quant = data["kv_park"]
    assert (trim["threshold"], quant["threshold"]) == (0.0, 0.1) and trim["tokens"] == 64
    assert trim["stored_mb"] >= trim["trimmed_mb"] > 0 and trim["share_quantized"] == 0
    assert trim["park_ms"] >= 0 and quant["score_ms"] > 0 and "KV parking" in proc.stdout


# -- KV folding only while memory is short -------------------------------------------


def test_kv_quantizing_follows_free_memory(tiny_path: Path) -> None:
    """The scheduler turns the backend's query recording (which the session
    pool quantizes parked sessions with) on while free memory is under
    sol.kv_folding_free_below and off when it is not; folding off or null:
    not managed."""
    import threading

    from soldaemon.config import MemoryBudget, SolConfig
    from soldaemon.policy.memory import kv_memory_short

    gib = 2**30
    assert kv_memory_short(1 * gib, 16 * gib, MemoryBudget(fraction=0.1))          # 1 GiB free < 1.6 GiB
    assert not kv_memory_short(2 * gib, 16 * gib, MemoryBudget(fraction=0.1))
    assert kv_memory_short(511 * 2**20, 16 * gib, MemoryBudget(mb=512))
    assert not kv_memory_short(512 * 2**20, 16 * gib, MemoryBudget(mb=512))

    b = _backend(tiny_path)
    free = [8 * gib]
    sol = SolConfig(kv_folding_entropy_threshold=0.1, kv_folding_free_below=MemoryBudget(mb=1024))
    sched = MemoryScheduler(b, sol, threading.Lock(), kv_reserve_bytes=0, idle_release=False,
                            free_bytes=lambda: (free[0], 16 * gib))
    assert sched.kv_quantizing is False and b.last_q is None       # plenty free: trimmed only
    free[0] = 512 * 2**20
    with sched.request():
        assert sched.kv_quantizing is True and b.last_q is not None
        b.forward(torch.tensor([1, 2, 3]), 0)                      # the queries are recorded again
        assert b.last_q_cache is b.k_cache
    free[0] = 4 * gib
    with sched.request():
        assert sched.kv_quantizing is False and b.last_q is None
    assert sched.kv_switches == 2 and sched.kv_snapshot()["free_below"] == "1024MB"
    assert sched.store.snapshot_prefetch()["kv_policy"] == {"managed": True, "quantizing": False,
                                                            "free_below": "1024MB", "switches": 2}
    sched.close()

    for off in (SolConfig(kv_folding_entropy_threshold=0.0), SolConfig(kv_folding_free_below=None)):
        b.record_queries()
        sched = MemoryScheduler(b, off, threading.Lock(), kv_reserve_bytes=0, idle_release=False,
                                free_bytes=lambda: (0, 16 * gib))
        assert sched.kv_quantizing is None and b.last_q is not None   # left as the engine set it
        sched.close()
