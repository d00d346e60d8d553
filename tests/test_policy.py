"""Sol's policy without torch: every module of soldaemon/policy imports and
decides in a Python where torch cannot be imported, so the decisions are
tested (and usable) on a machine without it."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
POLICY_MODULES = sorted(p.stem for p in (ROOT / "soldaemon" / "policy").glob("*.py") if p.stem != "__init__")

# Runs in a fresh interpreter: torch (and what only exists beside it) made
# unimportable before anything of soldaemon loads.
_BLOCKED = textwrap.dedent("""
    import importlib.abc, sys

    class _Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in ("torch", "transformers", "numpy"):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, _Block())
""")

_DECISIONS = textwrap.dedent("""
    import importlib
    for name in MODULES:
        importlib.import_module("soldaemon.policy." + name)
    import soldaemon.policy

    from soldaemon.errors import BudgetTooSmall
    from soldaemon.policy.residency import ForwardRecord, Heatmap, UnitInfo, plan_residency

    units = [UnitInfo(i, i, "layer", 100, 80) for i in range(8)]
    everything = plan_residency(units, budget_bytes=None, fixed_bytes=0, kv_reserve_bytes=0, slot_bytes=1,
                                prefetch_depth=1)
    assert everything.resident == frozenset(range(8)) and everything.offloaded == ()
    # 900 bytes: 200 fixed + KV, 3 slots of 100, room for 4 units
    plan = plan_residency(units, budget_bytes=900, fixed_bytes=100, kv_reserve_bytes=100, slot_bytes=100,
                          prefetch_depth=1, heat={5: (9, 0.0), 6: (3, 1.0)}, bandwidth_gbs=1.0,
                          compute_ms_per_forward=0.0001)
    assert plan.resident == frozenset({0, 1, 5, 6}), plan.resident      # first layers, then the hottest
    assert plan.offloaded == (2, 3, 4, 7) and plan.copy_bytes_per_forward == 320
    assert plan.planned_bytes <= 900 and plan.predicted_extra_ms is not None
    assert plan.describe(units)["offloaded_layers"] == [2, 3, 4, 7]
    try:
        plan_residency(units, budget_bytes=300, fixed_bytes=200, kv_reserve_bytes=100, slot_bytes=100,
                       prefetch_depth=1)
    except BudgetTooSmall as exc:
        assert "KV caches" in str(exc)
    else:
        raise AssertionError("a budget under the fixed part must be refused")

    import time
    heat = Heatmap(2, window_s=60.0)
    heat.add(ForwardRecord(time.monotonic(), [1.0, 2.0], ["resident", "hit"], [0, 80], [0.0, 0.5]))
    rows = heat.per_layer()
    assert rows[1]["hits"] == 1 and rows[1]["bytes_copied"] == 80 and rows[0]["mean_ms"] == 1.0
    assert heat.heat() == {0: (1, 0.0), 1: (1, 0.5)}

    from soldaemon.config import MemoryBudget, SolConfig
    from soldaemon.policy.memory import (
        idle_release_due, idle_release_on, kv_folding_free_below, kv_memory_short, should_replan,
    )
    gib = 2**30
    assert kv_memory_short(512 * 2**20, 16 * gib, MemoryBudget(mb=1024))
    assert not kv_memory_short(8 * gib, 16 * gib, MemoryBudget(mb=1024))
    assert kv_memory_short(gib, 16 * gib, MemoryBudget(fraction=0.2))
    sol = SolConfig(kv_folding_entropy_threshold=0.1, kv_folding_free_below=MemoryBudget(mb=1024))
    assert kv_folding_free_below(sol, records_queries=True) == MemoryBudget(mb=1024)
    assert kv_folding_free_below(sol, records_queries=False) is None
    assert kv_folding_free_below(SolConfig(kv_folding_entropy_threshold=0.0), records_queries=True) is None
    assert idle_release_on("cuda", None) and not idle_release_on("cpu", None) and idle_release_on("cpu", True)
    assert idle_release_due(100.0, 0.0, 30.0, released=False, pins=0)
    assert not idle_release_due(10.0, 0.0, 30.0, released=False, pins=0)       # active recently
    assert not idle_release_due(100.0, 0.0, 30.0, released=True, pins=0)
    assert not idle_release_due(100.0, 0.0, 30.0, released=False, pins=1)      # a high-priority request
    assert not idle_release_due(100.0, 0.0, 0.0, released=False, pins=0)       # off
    assert should_replan(1000, 0) and not should_replan(None, 0) and not should_replan(1000, 1)

    from soldaemon.policy.draft import DraftLength, PromptLookup
    pl = PromptLookup(max_n=3)
    pl.reset([1, 2, 3, 4, 9, 1, 2, 3])
    assert pl.propose(3) == [4, 9, 1]
    pl.extend([7])
    assert pl.propose(2) == []
    cpu = DraftLength({1: 10.0, 2: 20.0, 9: 90.0}, max_k=8, prior=0.9)
    assert cpu.choose(8) == 0                      # a forward costs per token: drafts never pay
    gpu = DraftLength({1: 10.0, 9: 10.5}, max_k=8, prior=0.9)
    assert gpu.choose(8) > 2 and gpu.choose(1) == 1
    gpu.update(drafted=8, accepted=0)
    assert gpu.rate < 0.9

    from soldaemon.policy.fold import BLOCK, blocks_to_fold, check_threshold, folding_on, should_score

    class Scores(list):
        def __lt__(self, t):
            return [x < t for x in self]

    assert blocks_to_fold(Scores([0.05, 0.5, 1.0]), 0.1) == [True, False, False]
    assert blocks_to_fold(Scores([0.05]), 0.0) is None and blocks_to_fold(None, 0.5) is None
    assert folding_on(0.1) and not folding_on(0.0)
    assert should_score(BLOCK, True) and not should_score(BLOCK - 1, True) and not should_score(BLOCK, False)
    try:
        check_threshold(1.5)
    except ValueError:
        pass
    else:
        raise AssertionError("a threshold outside [0, 1] must be refused")

    from soldaemon.policy.kernel_plan import KernelPlan
    assert KernelPlan.uniform("float32").storage == "float32"

    from soldaemon.policy.priority import JOB_PRIORITY, job_rank
    assert job_rank("complete", "high") < job_rank("complete", "normal") < job_rank("warm", "high")
    assert job_rank("warm", "high") == job_rank("warm", "normal") == 2 and len(JOB_PRIORITY) == 4

    assert not any(m.split(".")[0] in ("torch", "numpy", "transformers") for m in sys.modules)
    print("policy ok")
""")


def test_policy_decides_without_torch() -> None:
    code = _BLOCKED + f"MODULES = {POLICY_MODULES!r}\n" + _DECISIONS
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "policy ok" in proc.stdout


def test_every_policy_module_is_covered() -> None:
    assert {"residency", "memory", "draft", "fold", "kernel_plan", "priority"} <= set(POLICY_MODULES)
