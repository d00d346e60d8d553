"""The kernel plan: the chooser over recorded timing tables of both machine
kinds (pure, no torch), the kernels' numerics, the plan cache's key, the
config key, and reuse = recompute under every plan (tiny model)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from soldaemon.policy.kernel_plan import (
    EXACT_VERIFY, KERNELS, MAX_QUALITY_LOSS, QUALITY, QUALITY_ALPHA, ROW_KERNELS, STORAGES, KernelPlan, Quality,
    TimingTable, auto_kernels, choose_plan,
)

DATA = Path(__file__).parent / "data" / "kernel_tables"


@pytest.fixture(scope="module")
def tiny_model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from soldaemon_bench.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny-plan"))


@pytest.fixture(scope="module")
def tiny_model(tiny_model_path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    return model, AutoTokenizer.from_pretrained(str(tiny_model_path))


def _table(name: str) -> TimingTable:
    return TimingTable.from_dict(json.loads((DATA / name).read_text())["table"])


AVX512 = "zen4_avx512_bf16.json"       # measured on the project's 2-core EPYC with AVX-512 BF16/VNNI
AVX2 = "avx2_only.json"                # the same machine with oneDNN/MKL/ATen capped at AVX2 (see its note)
# 2026-12-02, with oneDNN's blocked int8 (int8-onednn) measured beside the rest: a Zen 4 with
# avx512_vp2intersect, and the same machine capped at AVX2 as above
AVX512_ONEDNN = "zen4_avx512_onednn.json"
AVX2_ONEDNN = "avx2_only_onednn.json"


def test_the_policy_module_imports_no_torch() -> None:
    code = "import sys, soldaemon.policy.kernel_plan, soldaemon.policy.kernel_plan; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_recorded_tables_are_what_they_say() -> None:
    """The two recorded tables really are of the two kinds (their flags) and
    show the gap the chooser must see."""
    zen, avx2 = _table(AVX512), _table(AVX2)
    assert "avx512_bf16" in zen.machine["cpu_flags"]
    assert avx2.machine.get("isa_cap") == "AVX2"
    # AVX-512 BF16: bfloat16 prefill far faster than float32; capped at AVX2 it is not
    assert zen.blocks["bfloat16"][512] < 0.5 * zen.blocks["float32"][512]
    assert avx2.blocks["bfloat16"][512] > avx2.blocks["float32"][512]


def test_avx512_bf16_machine_gets_bfloat16_or_int8() -> None:
    plan = choose_plan(_table(AVX512))
    assert plan.storage in ("bfloat16", "int8")
    assert plan.prefill in ("bfloat16", "int8-dynamic") and plan.short in ("bfloat16", "int8", "int8-dynamic")
    assert plan.head_storage in ("bfloat16", "int8")
    # and it is the fastest storage: every fixed precision predicts more
    for p in ("float32", "bfloat16", "float16", "int8"):
        other = choose_plan(_table(AVX512), p)
        assert plan.cold_ms is not None and other.cold_ms is not None and plan.step_ms is not None
        assert plan.cold_ms + 24 * plan.step_ms <= other.cold_ms + 24 * (other.step_ms or 0) + 1e-6


def test_avx2_machine_gets_float32_or_int8() -> None:
    plan = choose_plan(_table(AVX2))
    assert plan.storage in ("float32", "int8")
    assert "bfloat16" not in plan.kernels and "float16" not in plan.kernels


def test_the_two_kinds_get_different_plans() -> None:
    """Among the float formats (int8 left out, as a quality gate would),
    the AVX-512 BF16 machine gets bfloat16 and the AVX2 one float32; with
    int8 allowed both get int8 storage, with the roles of its two kernels
    set by their own timings."""
    floats = frozenset({"float32", "bfloat16", "float16"})
    assert choose_plan(_table(AVX512), allowed=floats).storage == "bfloat16"
    assert choose_plan(_table(AVX2), allowed=floats).storage == "float32"
    zen, avx2 = choose_plan(_table(AVX512)), choose_plan(_table(AVX2))
    assert zen.storage == avx2.storage == "int8"
    for plan, table in ((zen, _table(AVX512)), (avx2, _table(AVX2))):
        cost = lambda k: table.blocks[k][1] + table.blocks[k][9]   # noqa: E731
        assert plan.short == min(("int8", "int8-dynamic"), key=cost)


def test_a_fixed_precision_keeps_its_storage_and_picks_its_fastest_kernels() -> None:
    t = _table(AVX512)
    for p in ("float32", "bfloat16", "float16"):
        plan = choose_plan(t, p)
        assert plan.storage == plan.head_storage == p and plan.kernels == (p,)
    plan = choose_plan(t, "int8")
    assert plan.storage == "int8" and set(plan.kernels) <= {"int8", "int8-dynamic"}
    with pytest.raises(ValueError, match="unknown precision 'int3'"):
        choose_plan(t, "int3")
    plan = choose_plan(t, "int4")       # 4-bit decoder layers; the output layer (and embedding) int8
    assert plan.storage == "int4" and plan.head_storage == "int8" and plan.prefill == plan.short == "int4"
    assert "int4" not in choose_plan(t).kernels    # never auto: its quality was not measured


def test_auto_never_picks_a_kernel_that_lost_quality_or_was_never_measured() -> None:
    t = _table(AVX512)
    judged = {"float32": Quality(0, 0, 248), "bfloat16": Quality(1, 0, 248), "int8-dynamic": Quality(10, 1, 248)}
    assert auto_kernels(judged) == {"float32", "bfloat16"}
    plan = choose_plan(t, allowed=frozenset({"float32", "bfloat16"}))
    assert set(plan.kernels) <= {"float32", "bfloat16"}
    plan = choose_plan(t, allowed=frozenset({"float32"}))
    assert plan.kernels == ("float32",)


def test_a_kernel_is_refused_on_a_loss_beyond_chance_not_on_a_point_estimate() -> None:
    """auto refuses a kernel worse than float32 by more than a point *and*
    beyond what its differing holes allow by chance (one-sided sign test):
    at 120 holes one hole is 0.8 points, so two holes lost and none won is
    1.7 points on a coin toss's odds (p 0.25)."""
    coin = Quality(lost=2, won=0, n=120)
    assert coin.points == pytest.approx(1.667, abs=1e-3) and coin.p_worse == 0.25
    assert not coin.refused(1.0, 0.05)
    clear = Quality(lost=10, won=1, n=248)                 # 12 in 2048 by chance
    assert clear.p_worse == pytest.approx(12 / 2048) and clear.refused(1.0, 0.05)
    small = Quality(lost=8, won=0, n=1000)                 # beyond chance, under a point
    assert small.p_worse < 0.01 and not small.refused(1.0, 0.05)
    better = Quality(lost=0, won=3, n=60)
    assert better.points < 0 and better.p_worse == 1.0 and not better.refused(1.0, 0.05)
    assert Quality(0, 0, 248).p_worse == 1.0
    assert "+1.7 points against float32 on 120 holes (2 lost, 0 won, sign test p 0.25)" == coin.note()


def test_the_shipped_quality_table_and_the_plan_says_it() -> None:
    """Every kernel auto may pick was measured; float16 and int4 never were,
    so auto never picks them; the plan's reason carries its kernels' record."""
    assert {"float16", "int4"}.isdisjoint(QUALITY) and {"float16", "int4"}.isdisjoint(auto_kernels())
    assert QUALITY["int8-onednn"] == QUALITY["int8-dynamic"]      # the same bits
    assert all(q.n and q.lost + q.won <= q.n for q in QUALITY.values())
    # int8-dynamic with the output layer rotated (docs/kernels.md, "Quality per
    # precision"): 4 lost, 0 won of 248: +1.6 points, p 0.06, not
    # beyond chance; the record before (5 lost) was, and needed the 2.5 limit
    int8 = QUALITY["int8-dynamic"]
    assert (int8.lost, int8.won, int8.n) == (4, 0, 248) and int8.points <= MAX_QUALITY_LOSS
    assert int8.p_worse == pytest.approx(1 / 16) and not int8.refused(1.0, QUALITY_ALPHA)
    assert Quality(5, 0, 248).refused(1.0, QUALITY_ALPHA) and not Quality(5, 0, 248).refused(MAX_QUALITY_LOSS, QUALITY_ALPHA)
    assert "int8-dynamic" in auto_kernels() and "int8-dynamic" in auto_kernels(limit=1.0)
    plan = choose_plan(_table(AVX512))
    for k in plan.kernels:
        assert k in auto_kernels()
        if k != "float32":
            assert f"{k} {QUALITY[k].note()}" in plan.reason or QUALITY[k].note() in plan.reason
    assert "quality:" not in choose_plan(_table(AVX512), "float32").reason


def test_a_device_without_int8_kernels_and_a_flat_bf16_gpu() -> None:
    """What a GPU table looks like (bf16 flat in rows, no int8 product for
    small batches): dense bf16 everywhere, a verify within two steps."""
    flat = {r: 0.02 + 0.0001 * r for r in (1, 2, 5, 9, 17, 64, 512)}
    gpu = TimingTable(blocks={"bfloat16": flat, "float16": {r: v * 1.05 for r, v in flat.items()},
                              "float32": {r: v * 4 for r, v in flat.items()}},
                      head={"bfloat16": {r: 0.1 for r in (1, 2, 5, 9, 17)},
                            "float32": {r: 0.4 for r in (1, 2, 5, 9, 17)}}, n_layers=24)
    plan = choose_plan(gpu)
    assert plan.kernels == ("bfloat16",) and plan.verify_ms is not None and plan.step_ms is not None
    assert plan.verify_ms <= 2 * plan.step_ms
    with pytest.raises(ValueError, match="no measured"):
        choose_plan(gpu, "int8")


def test_speculation_is_judged_from_the_plan() -> None:
    """With int8/bf16 products a 9-row verify costs little more than a step
    (AVX-512 table); with float16 products on the AVX2 table it costs
    several steps (the reason speculation could not pay there before)."""
    zen = choose_plan(_table(AVX512))
    old = choose_plan(_table(AVX2), "float16")
    assert zen.verify_ms is not None and zen.step_ms is not None and old.verify_ms and old.step_ms
    assert zen.verify_ms / zen.step_ms < 2 and 4 < old.verify_ms / old.step_ms


def test_plans_and_tables_round_trip_and_refuse_garbage() -> None:
    t = _table(AVX512)
    assert TimingTable.from_dict(json.loads(json.dumps(t.to_dict()))) == t
    plan = choose_plan(t)
    assert KernelPlan.from_dict(json.loads(json.dumps(plan.to_dict()))) == plan
    with pytest.raises(ValueError):
        TimingTable.from_dict({"blocks": 3})
    with pytest.raises(ValueError, match="does not read"):
        KernelPlan("float32", "int8", "float32", "float32", "float32")
    assert set(KERNELS.values()) == set(STORAGES) | set(ROW_KERNELS)
    rows = choose_plan(_table(AVX512_ONEDNN))
    assert rows.rows == "int8-onednn" and KernelPlan.from_dict(json.loads(json.dumps(rows.to_dict()))) == rows


# -- the blocked second copy (KernelPlan.rows) ----------------------------------------


def test_a_blocked_copy_is_kept_where_measured_faster_and_memory_allows() -> None:
    """Zen 4: oneDNN's blocked int8 beats _int_mm's per-call re-layout at
    every size above one row, so the plan keeps the copy for forwards of
    more rows — predicted verify and prompt both faster, the step the same;
    refused when memory does not hold it. Capped at AVX2 the same kernel is
    slower at every size above one row: no copy. Tables without the kernel
    (measured before it existed) never get one."""
    zen = _table(AVX512_ONEDNN)
    with_copy, one = choose_plan(zen), choose_plan(zen, row_copy=False)
    assert with_copy.rows == "int8-onednn" and one.rows is None
    assert (with_copy.storage, with_copy.prefill, with_copy.short, with_copy.head) == (
        one.storage, one.prefill, one.short, one.head)
    assert with_copy.verify_ms is not None and one.verify_ms is not None and with_copy.verify_ms < one.verify_ms
    assert with_copy.cold_ms is not None and one.cold_ms is not None and with_copy.cold_ms < one.cold_ms
    assert with_copy.step_ms == one.step_ms
    assert "int8-onednn" in with_copy.describe() and "blocked" in with_copy.reason
    avx2 = _table(AVX2_ONEDNN)
    assert avx2.blocks["int8-onednn"][9] > avx2.blocks["int8-dynamic"][9]      # what the chooser sees there
    assert choose_plan(avx2).rows is None
    for name in (AVX512, AVX2):
        assert choose_plan(_table(name)).rows is None
    # only the twin's bits may be replaced: a plan whose decode kernel is the
    # weight-only int8 (bfloat16 activations) gets no copy, and cannot be built with one
    assert choose_plan(zen, allowed=frozenset({"int8", "int8-onednn", "float32"})).rows is None
    with pytest.raises(ValueError, match="must all be"):
        KernelPlan("int8", "int8-dynamic", "int8", "int8", "int8-dynamic", rows="int8-onednn")
    with pytest.raises(ValueError, match="not a kernel for the blocked copy"):
        KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic", rows="int8-dynamic")


def test_one_copy_unless_the_second_is_15_percent_faster_for_steps_and_longer_forwards() -> None:
    """One layout for every forward by default: the blocked copy stays only
    where the table predicts it ROW_COPY_GAIN faster for a decode step, a
    verification and a prompt alike (the Zen 4 table: 30 %, 30 % and 21 %)."""
    import dataclasses

    from soldaemon.policy.kernel_plan import ROW_COPY_GAIN

    assert ROW_COPY_GAIN == 0.15
    zen = _table(AVX512_ONEDNN)
    assert choose_plan(zen).rows == "int8-onednn"

    def scaled(rows: str, factor: float, sizes: tuple[int, ...]) -> TimingTable:
        """``zen`` with int8-onednn's times at ``sizes`` set to ``factor`` times int8-dynamic's."""
        blocks = {k: dict(v) for k, v in zen.blocks.items()}
        head = {k: dict(v) for k, v in zen.head.items()}
        for r in sizes:
            blocks[rows][r] = factor * blocks["int8-dynamic"][r]
            if r in head[rows]:
                head[rows][r] = factor * head["int8-dynamic"][r]
        return dataclasses.replace(zen, blocks=blocks, head=head)

    # faster for longer forwards only, the step no faster: one copy (what the old rule kept)
    step_same = choose_plan(scaled("int8-onednn", 1.0, (1,)))
    assert step_same.rows is None and "one copy of the weights" in step_same.reason
    # 10 % faster everywhere: not enough to pay for the memory
    assert choose_plan(scaled("int8-onednn", 0.9, tuple(zen.blocks["int8-onednn"]))).rows is None
    # 20 % faster everywhere: the copy is kept
    assert choose_plan(scaled("int8-onednn", 0.8, tuple(zen.blocks["int8-onednn"]))).rows == "int8-onednn"


def test_the_blocked_copy_needs_room_and_no_budget() -> None:
    from soldaemon.policy.memory import ROW_COPY_MARGIN, blocked_copy_allowed

    mb = 2 ** 20
    assert blocked_copy_allowed(True, False, 8000 * mb, 500 * mb)[0]
    ok, why = blocked_copy_allowed(True, False, 500 * mb + ROW_COPY_MARGIN - 1, 500 * mb)
    assert not ok and "free" in why
    assert blocked_copy_allowed(True, False, 500 * mb + ROW_COPY_MARGIN, 500 * mb)[0]
    assert blocked_copy_allowed(True, True, 8000 * mb, 500 * mb) == (False, "sol.memory_budget is set")
    assert blocked_copy_allowed(False, False, 8000 * mb, 500 * mb) == (False, "model.blocked_copy: false")


def test_onednn_int8_gives_int_mm_bits_or_is_refused() -> None:
    """Where oneDNN's product is exact (checked on full-range values) the
    blocked kernel's results equal int8-dynamic's to the bit, one row or
    many; where it is not, packing for it raises and the measurement leaves
    it out."""
    import torch

    from soldaemon.runtime.forward.kernels import KERNEL_FNS, blocked, onednn_int8_exact, pack

    torch.manual_seed(1)
    w = torch.randn(200, 96) * 0.05
    b = torch.randn(200) * 0.1
    x = torch.randn(9, 96)
    x[3] *= 40.0                                   # a row far larger than the rest
    q, s = pack("int8", w)
    if not onednn_int8_exact():
        with pytest.raises(RuntimeError, match="not exact"):
            blocked(q)
        return
    bw = blocked(q)
    for rows in (x[:1], x[:2], x):
        assert torch.equal(KERNEL_FNS["int8-onednn"](rows, bw, b, s), KERNEL_FNS["int8-dynamic"](rows, q, b, s))


def test_onednn_activations_are_the_int8_values_offset_by_128() -> None:
    """int8-onednn's input bytes are int8-dynamic's values plus 128 (its
    zero point), made through an int8 cast and a wrapping byte add (the
    float -> uint8 cast is several times slower): every value -127 … 127
    lands where the float formula puts it, and the row scales are int8-dynamic's."""
    import torch

    from soldaemon.runtime.forward.kernels import Int8Dynamic, OneDNNInt8

    torch.manual_seed(2)
    x = torch.randn(7, 300) * torch.tensor([1.0, 5.0, 0.01, 100.0, 1.0, 1.0, 1.0])[:, None]
    x[4, :255] = torch.arange(-127, 128, dtype=torch.float32)        # every level once
    x[5] = 0.0                                                        # an all-zero row
    u, sx = OneDNNInt8().prepare(x)
    q, sq = Int8Dynamic.quantize(x)
    assert u.dtype == torch.uint8 and torch.equal(sx, sq)
    assert torch.equal(u.to(torch.int32), q.to(torch.int32) + 128)
    assert torch.equal(u[4, :255].to(torch.int32), torch.arange(1, 256, dtype=torch.int32))


# -- mechanism: kernels, cache key ---------------------------------------------------


def test_kernels_match_the_dense_product_and_treat_rows_alone() -> None:
    import torch

    from soldaemon.runtime.forward.kernels import KERNEL_FNS, pack

    torch.manual_seed(0)
    w = torch.randn(96, 64) * 0.05
    b = torch.randn(96) * 0.1
    x = torch.randn(7, 64)
    ref = torch.nn.functional.linear(x, w, b)
    for kernel, storage in KERNELS.items():
        pw, ps = pack(storage, w)
        y = KERNEL_FNS[kernel](x, pw, b, ps)
        assert y.dtype == x.dtype and y.shape == ref.shape
        # 4-bit groups of random weights: a step of a fifteenth of each group's range
        tol = 0.15 if storage == "int4" else 0.05
        assert (y - ref).abs().max().item() < tol * ref.abs().max().item(), kernel
    # int8-dynamic: integer products, per-row scales: a row's result is the
    # same alone or in a batch, to the bit
    pw, ps = pack("int8", w)
    full = KERNEL_FNS["int8-dynamic"](x, pw, b, ps)
    for i in range(len(x)):
        assert torch.equal(full[i:i + 1], KERNEL_FNS["int8-dynamic"](x[i:i + 1], pw, b, ps))


def test_the_plan_cache_key_changes_with_machine_torch_and_model(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    cfg = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    cpu = torch.device("cpu")
    base = kernels.plan_key(cfg, cpu, torch.float32)
    assert kernels.plan_key(cfg, cpu, torch.float32) == base
    bigger = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2)
    assert kernels.plan_key(bigger, cpu, torch.float32) != base
    monkeypatch.setattr(torch, "__version__", "9.9.9")
    assert kernels.plan_key(cfg, cpu, torch.float32) != base
    monkeypatch.undo()
    monkeypatch.setattr(kernels, "cpu_flags", lambda: ["avx2"])
    assert kernels.plan_key(cfg, cpu, torch.float32) != base


def test_plan_for_measures_once_then_reads_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    cfg = Qwen2Config(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    quiet = lambda: (0.1, 2)          # noqa: E731 (the machine's load, as plan_for reads it)
    plan, table, cached = kernels.plan_for(cfg, torch.device("cpu"), torch.float32, load=quiet)
    assert not cached and set(table.blocks) >= {"float32"} and table.blocks["float32"][1] > 0
    assert (table.load_1m, table.cores, table.model) == (0.1, 2, {"layers": 2, "hidden": 64, "vocab": 512})
    files = list((tmp_path / "kernel-plans").glob("*.json"))
    assert len(files) == 1
    again, table2, cached2 = kernels.plan_for(cfg, torch.device("cpu"), torch.float32, load=quiet)
    assert cached2 and table2 == table and again == plan
    files[0].write_text("{not json")                     # a damaged cache is measured again, not trusted
    _, _, cached3 = kernels.plan_for(cfg, torch.device("cpu"), torch.float32, load=quiet)
    assert not cached3


def _loaded(table: TimingTable, load: float | None, cores: int | None = 2) -> TimingTable:
    import dataclasses

    return dataclasses.replace(table, load_1m=load, cores=cores, measured_at=1_790_000_000.0)


def test_a_table_timed_under_load_is_timed_again_only_on_a_quiet_start() -> None:
    from soldaemon.policy.kernel_plan import retime_reason, timed_under_load

    busy = _loaded(_table(AVX512), 12.0)              # the issue-58 bench: load 12 on 2 cores
    assert timed_under_load(busy)
    why = retime_reason(busy, 0.4, 2)
    assert why is not None and "load 12 on 2 cores" in why and "load 0.4" in why
    assert retime_reason(busy, 3.0, 2) is None         # still busy: keep it (a new timing would be no better)
    assert retime_reason(busy, None, 2) is None        # no load average on this OS: keep it
    quiet = _loaded(_table(AVX512), 0.3)
    assert not timed_under_load(quiet) and retime_reason(quiet, 0.0, 2) is None
    unknown = _loaded(_table(AVX512), None, None)     # recorded before the load was
    assert retime_reason(unknown, 0.0, 2) is None
    # an old table's load, read after its timing, still counts (per thread when cores are unknown)
    old = TimingTable.from_dict({**_table(AVX512).to_dict(), "load_1m": None,
                                 "machine": {**_table(AVX512).machine, "load_avg_1m": 7.99, "threads": 2}})
    assert old.load_1m == 7.99 and retime_reason(old, 0.2, 2) is not None
    assert TimingTable.from_dict(busy.to_dict()) == busy


def test_plan_for_times_a_loaded_table_again_on_a_quiet_start(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """Recorded tables stand in for the timing: what is checked is which
    table plan_for keeps, replaces and caches."""
    import dataclasses

    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    timings = {"busy": _table(AVX512), "quiet": _table(AVX512_ONEDNN)}
    measured: list[float | None] = []

    def fake_measure(cfg: object, device: object, dtype: object, *, load: object, **_: object) -> TimingTable:
        now, cores = load()                           # type: ignore[operator]
        measured.append(now)
        return _loaded(timings["busy" if now > 2 else "quiet"], now, cores)

    monkeypatch.setattr(kernels, "measure_table", fake_measure)
    cfg = Qwen2Config(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                      num_attention_heads=14, num_key_value_heads=2)
    cpu = torch.device("cpu")
    busy_plan, table, cached = kernels.plan_for(cfg, cpu, torch.float32, load=lambda: (12.0, 2))
    assert not cached and table.load_1m == 12.0
    # a later start, still busy: the cached table stays
    _, table, cached = kernels.plan_for(cfg, cpu, torch.float32, load=lambda: (5.0, 2))
    assert cached and table.load_1m == 12.0 and measured == [12.0]
    # a quiet start: timed again, and the new table replaces the loaded one in the cache
    quiet_plan, table, cached = kernels.plan_for(cfg, cpu, torch.float32, load=lambda: (0.3, 2))
    assert not cached and measured == [12.0, 0.3]
    assert (table.load_1m, table.replaced_load_1m) == (0.3, 12.0)
    assert quiet_plan == choose_plan(dataclasses.replace(table, replaced_load_1m=None)) != busy_plan
    _, again, cached = kernels.plan_for(cfg, cpu, torch.float32, load=lambda: (0.3, 2))
    assert cached and again == table and measured == [12.0, 0.3]


# -- config ----------------------------------------------------------------------------


def test_model_precision_is_validated() -> None:
    from soldaemon.config import config_from_dict
    from soldaemon.errors import ConfigError

    with pytest.raises(ConfigError, match=r"model\.precision.*int3"):
        config_from_dict({"model": {"precision": "int3"}})
    assert config_from_dict({}).model.precision == "auto"


# -- reuse = recompute under every plan (tiny model) -----------------------------------------


PLANS = [
    None,                                                             # the reference
    KernelPlan.uniform("bfloat16"),
    KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic"),
    KernelPlan("int8", "int8-dynamic", "int8", "bfloat16", "bfloat16"),
    KernelPlan("bfloat16", "bfloat16", "bfloat16", "int8", "int8"),
    KernelPlan("int4", "int4", "int4", "int8", "int8-dynamic"),
]


@pytest.mark.parametrize("plan", PLANS, ids=lambda p: "reference" if p is None else "/".join(p.kernels))
def test_reuse_equals_recompute_under_each_plan(tiny_model, plan: KernelPlan | None) -> None:
    """A keystroke's tail computed a token at a time across requests holds
    the same KV and logits as the whole prompt computed at once."""
    import torch

    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.kv.session import KVSession

    model, tok = tiny_model
    ids = tok("def parse(self, text):\n    return self.rules.match(text, pos=0)\n" * 6).input_ids
    split = len(ids) - 5
    fresh = KVSession(LeanBackend(model, 1024, plan=plan))
    whole = fresh.prefill(ids, precise_until=split).logits.clone()
    typed = KVSession(LeanBackend(model, 1024, plan=plan))
    pre = None
    for end in range(split + 1, len(ids) + 1):
        pre = typed.prefill(ids[:end], precise_until=split)
        typed.decode_step(int(pre.logits.argmax()))      # a generation in between
    assert pre is not None and pre.computed == 1
    # float32 and integer products: rounding of the accumulation order only;
    # a kernel whose products come out in bfloat16 may round one way alone
    # and the other in a batch: a few units of bfloat16's last place
    half_out = plan is not None and any(k in ("bfloat16", "float16", "int8", "int4") for k in plan.kernels)
    tol = 4 * 2.0 ** -8 if half_out else 1e-3
    scale = whole.abs().max().item()
    assert (pre.logits - whole).abs().max().item() < tol * scale
    assert int(pre.logits.argmax()) == int(whole.argmax())
    n = len(ids)
    for a, b in ((fresh.backend.k_cache, typed.backend.k_cache), (fresh.backend.v_cache, typed.backend.v_cache)):
        assert (a[:, :, :n] - b[:, :, :n]).abs().max().item() < tol * max(1.0, a[:, :, :n].abs().max().item())


def test_one_resident_copy_after_release(tiny_model_path: Path) -> None:
    """With a plan and release, the module's parameters are emptied except
    those the packed weights share; the backend still answers like the
    same plan without release."""
    import torch
    from transformers import AutoModelForCausalLM

    from soldaemon.runtime.forward.backend import LeanBackend

    plan = KernelPlan("int8", "int8-dynamic", "int8", "int8", "int8")
    kept = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    dropped = AutoModelForCausalLM.from_pretrained(str(tiny_model_path)).eval()
    a = LeanBackend(kept, 512, plan=plan)
    b = LeanBackend(dropped, 512, plan=plan, release=True)
    assert b.released and not a.released
    left = sum(p.numel() for p in dropped.parameters())
    small = sum(p.numel() for n, p in kept.named_parameters() if "norm" in n or n.endswith("bias"))
    assert 0 < left <= small            # only what the packed weights share: norms and biases (float32)
    ids = torch.arange(3, 40)
    assert torch.equal(a.forward(ids, 0), b.forward(ids, 0))
    assert b.weight_bytes() < sum(p.numel() * 4 for p in kept.parameters()) / 3


# -- decode steps on the blocked copy (measured in the forward) --------------------------------


def test_steps_move_to_the_blocked_copy_where_a_cold_completion_is_faster_there() -> None:
    from soldaemon.policy.kernel_plan import Workload, steps_on_blocked_copy

    assert Workload.decode_steps == 24
    # recorded on the Xeon of model 207 (docs/kernels.md): real steps 70 against 81 ms on the
    # blocked copy, the table's 1,024-token prompt 1,288 against 465 ms on it: 24 slower steps
    # (+264 ms) against a prompt 823 ms faster -- every forward on the blocked copy
    assert steps_on_blocked_copy([70.0, 69.0, 71.0, 70.0], [81.0, 80.0, 82.0, 81.0], prompt_saved_ms=823.0)
    assert not steps_on_blocked_copy([70.0, 69.0, 71.0, 70.0], [81.0, 80.0, 82.0, 81.0])   # steps alone
    # Zen 4 (below): +4.3 ms a step (+103 ms) against its table's prompt 716 -> 563 ms (153 saved)
    assert steps_on_blocked_copy([24.6, 25.1, 24.2], [28.9, 28.4, 29.6], prompt_saved_ms=153.0)
    # the steps' loss over the workload beyond what the prompt saves: the plain copy
    assert not steps_on_blocked_copy([24.6, 25.1, 24.2], [28.9, 28.4, 29.6], prompt_saved_ms=100.0)
    assert not steps_on_blocked_copy([50.0, 50.0, 50.0], [60.0, 60.0, 60.0], prompt_saved_ms=200.0)
    assert steps_on_blocked_copy([50.0, 50.0, 50.0], [58.0, 58.0, 58.0], prompt_saved_ms=200.0)
    assert not steps_on_blocked_copy([50.0, 50.0], [58.0, 58.0], prompt_saved_ms=500.0)   # too few rounds

    # with no prompt time saved, real steps alone decide:

    # recorded: the 0.5B's real decode steps after a 1,000-token prompt, medians of rounds of 12,
    # alternating (2026-12-04): a 2-core Xeon KVM guest with AMX -- the blocked copy ~20 % faster
    xeon_one, xeon_blocked = [81.1, 70.1, 64.1, 82.3, 79.7, 79.7], [59.7, 52.3, 66.7, 69.0, 65.4, 63.2]
    assert steps_on_blocked_copy(xeon_one, xeon_blocked)
    # Zen 4 (2026-12-02, docs/kernels.md): the blocked copy's step 17 % slower in the forward,
    # although the cache-hot table ranked it ahead at one row
    zen_one, zen_blocked = [24.6, 25.1, 24.2], [28.9, 28.4, 29.6]
    assert not steps_on_blocked_copy(zen_one, zen_blocked)
    assert choose_plan(_table(AVX512_ONEDNN)).rows == "int8-onednn"     # the table alone would not tell them apart
    # faster, even by a little: every forward reads the blocked copy (the prompt is faster there)
    assert steps_on_blocked_copy([50.0, 50.0, 50.0], [46.0, 46.0, 46.0])
    # as fast, slower, faster in too few rounds, or too few rounds: stay on the one copy
    assert not steps_on_blocked_copy([50.0, 50.0, 50.0], [50.0, 50.0, 50.0])
    assert not steps_on_blocked_copy([50.0, 50.0, 50.0], [52.0, 52.0, 52.0])
    assert not steps_on_blocked_copy([50.0, 50.0, 50.0, 50.0], [30.0, 30.0, 60.0, 60.0])
    assert not steps_on_blocked_copy([50.0, 50.0], [20.0, 20.0])
    assert not steps_on_blocked_copy([50.0, 50.0, 50.0], [20.0, 20.0])


def test_a_step_on_the_blocked_copy_gives_the_one_copys_bits(tiny_model) -> None:
    """The one-row forward (layers and output layer) read from the blocked
    copy equals the one copy's to the bit, so the warm-up may pick either by
    time alone; the engine's warm-up records its choice in info()."""
    import torch

    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.forward.kernels import onednn_int8_exact
    from soldaemon.runtime.kv.session import KVSession

    if not onednn_int8_exact():
        pytest.skip("oneDNN's int8 product is not available or not exact here")
    model, tok = tiny_model
    plan = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic", rows="int8-onednn")
    backend = LeanBackend(model, 512, plan=plan)
    assert backend.rows_layers is not None
    session = KVSession(backend)
    ids = tok("def parse(self, text):\n    return self.rules.match(text, pos=0)\n" * 3).input_ids
    first = int(session.prefill(ids).logits.argmax())
    out = {}
    for on in (False, True):
        backend.steps_on_rows = on
        session.truncate(len(ids))
        out[on] = session.decode_step(first).clone()
    assert torch.equal(out[False], out[True])

    class OneCopy:
        """Any use of the one copy's kernels fails the step."""

        def __getattr__(self, name: str) -> object:
            raise AssertionError("a one-row forward read the one copy")

        def __call__(self, *_a: object) -> object:
            raise AssertionError("a one-row forward read the one copy")

    backend.short_linear = backend.head_linear = OneCopy()
    session.truncate(len(ids))
    assert torch.equal(session.decode_step(first), out[False])   # served by the blocked copy alone
    backend.steps_on_rows = False
    session.truncate(len(ids))
    with pytest.raises(AssertionError, match="one copy"):
        session.decode_step(first)


def _blocked_copy_backend(tiny_model):
    """The tiny model under int8-dynamic with the blocked oneDNN copy, a KV
    session on it and a prompt's ids (skips where oneDNN is not exact)."""
    from soldaemon.runtime.forward.backend import LeanBackend
    from soldaemon.runtime.forward.kernels import onednn_int8_exact
    from soldaemon.runtime.kv.session import KVSession

    if not onednn_int8_exact():
        pytest.skip("oneDNN's int8 product is not available or not exact here")
    model, tok = tiny_model
    plan = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic", rows="int8-onednn")
    backend = LeanBackend(model, 512, plan=plan)
    ids = tok("def parse(self, text):\n    return self.rules.match(text, pos=0)\n" * 3).input_ids
    return backend, KVSession(backend), ids


def test_a_dropped_blocked_copy_leaves_one_layout_and_the_same_bits(tiny_model) -> None:
    """Real steps not faster on the blocked copy: the engine drops it
    (LeanBackend.drop_row_copy); every forward reads the one copy, with
    the bits it had, and the weights' bytes fall."""
    import torch

    backend, session, ids = _blocked_copy_backend(tiny_model)
    before = session.prefill(ids).logits.clone()
    with_copy = backend.weight_bytes()
    backend.drop_row_copy("real decode steps were not 15 % faster on it")
    assert backend.rows_layers is None and backend.plan.rows is None and not backend.steps_on_rows
    assert backend.weight_bytes() < with_copy and "blocked copy dropped" in backend.plan.reason
    session.truncate(0)
    assert torch.equal(session.prefill(ids).logits, before)


def test_with_steps_on_the_blocked_copy_the_plain_layers_are_freed(tiny_model) -> None:
    """Real steps faster on the blocked copy: every forward reads it, and the
    engine frees the plain copy of the layers (LeanBackend.keep_only_row_copy):
    the same bits for a prompt and a step, fewer weight bytes, and nothing
    reads the freed tensors (they are empty)."""
    import torch

    from soldaemon.runtime.forward.weights import PACKED

    backend, session, ids = _blocked_copy_backend(tiny_model)
    before = session.prefill(ids).logits.clone()
    step = session.decode_step(int(before.argmax())).clone()
    assert backend.keep_only_row_copy() == 0            # steps still on the one copy: nothing to free
    plain = [getattr(w, n) for w in backend.layers for n in PACKED]
    with_both = backend.weight_bytes()
    backend.steps_on_rows = True
    freed = backend.keep_only_row_copy()
    assert freed == sum(t.numel() for t in plain) and all(t.untyped_storage().nbytes() == 0 for t in plain)
    assert backend.weight_bytes() == with_both - freed and "plain copy of the layers is freed" in backend.plan.reason
    assert backend.layers is not backend.rows_layers
    assert all(a is b for a, b in zip(backend.layers, backend.rows_layers))
    session.truncate(0)
    assert torch.equal(session.prefill(ids).logits, before)
    assert torch.equal(session.decode_step(int(before.argmax())), step)
    backend.drop_row_copy("never after the plain copy is freed")
    assert backend.rows_layers is not None and backend.keep_only_row_copy() == 0


# -- the packed products (format 5) ------------------------------------------------------


def test_the_table_times_the_packed_products_the_forward_multiplies(monkeypatch: pytest.MonkeyPatch) -> None:
    """measure_table packs and times q/k/v as one [(H+2KV)*hd, D] product and
    gate/up as one [2F, D] (LayerWeights' wqkv and wgu), not seven apart."""
    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    assert kernels.packed_shapes(cfg) == [(64 + 2 * 32, 64), (64, 64), (2 * 96, 64), (64, 96)]
    packed: list[tuple[int, int]] = []
    real_pack = kernels.pack

    def spy(storage: str, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        packed.append(tuple(w.shape))          # type: ignore[arg-type]
        return real_pack(storage, w)

    monkeypatch.setattr(kernels, "pack", spy)
    table = kernels.measure_table(cfg, torch.device("cpu"), torch.float32, kernels=("float32", "int8-dynamic"),
                                  short_rows=(1, 2), prefill_rows=(8,), repeats=1, load=lambda: (0.1, 2))
    assert set(packed) == {*kernels.packed_shapes(cfg), (256, 64)}          # the layer's four and the head
    assert table.products == kernels.PACKED_PRODUCTS == ("qkv", "o", "gate_up", "down")
    assert set(table.blocks) == {"float32", "int8-dynamic"} and set(table.blocks["float32"]) == {1, 2, 8}
    assert TimingTable.from_dict(table.to_dict()) == table
    choose_plan(table, row_copy=True)          # the one-copy rule reads the packed shapes' times too


def test_an_older_formats_cached_table_is_timed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table cached by a daemon of an older PLAN_FORMAT (seven separate
    products) is dropped by load_table, and plan_for times the packed shapes."""
    import torch
    from transformers import Qwen2Config

    from soldaemon.runtime.forward import kernels

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    cfg = Qwen2Config(vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2)
    cpu = torch.device("cpu")
    key = kernels.plan_key(cfg, cpu, torch.float32)
    old = json.loads((DATA / AVX512).read_text())
    assert old["table"]["products"] == ["q", "k", "v", "o", "gate", "up", "down"]
    path = tmp_path / "kernel-plans" / f"{key}.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"format": kernels.PLAN_FORMAT - 1, "table": old["table"]}))
    assert kernels.load_table(key) is None
    path.write_text(json.dumps({"format": kernels.PLAN_FORMAT, "table": old["table"]}))
    assert kernels.load_table(key) is not None              # the same file at this format is read
    path.write_text(json.dumps({"format": kernels.PLAN_FORMAT - 1, "table": old["table"]}))
    measured: list[int] = []
    real = kernels.measure_table

    def counted(*args: object, **kw: object) -> TimingTable:
        measured.append(1)
        kw.update(kernels=("float32",), short_rows=(1,), prefill_rows=(8,), repeats=1)
        return real(*args, **kw)                           # type: ignore[arg-type]

    monkeypatch.setattr(kernels, "measure_table", counted)
    _, table, cached = kernels.plan_for(cfg, cpu, torch.float32, load=lambda: (0.1, 2))
    assert not cached and measured == [1] and table.products == kernels.PACKED_PRODUCTS
    assert json.loads(path.read_text())["format"] == kernels.PLAN_FORMAT


def test_every_recorded_table_names_the_products_it_timed() -> None:
    """The older recordings were timed as seven products apart (format 3
    and 4), the Xeon AMX one as the forward's four packed products
    (format 5), and each says so."""
    from soldaemon.runtime.forward.kernels import PACKED_PRODUCTS

    for f in sorted(DATA.glob("*.json")):
        doc = json.loads(f.read_text())
        table = TimingTable.from_dict(doc["table"])
        if doc["format"] == 5:
            assert table.products == PACKED_PRODUCTS, f.name
        else:
            assert table.products == ("q", "k", "v", "o", "gate", "up", "down"), f.name
            assert doc["format"] in (3, 4), f.name


XEON_AMX = "xeon_amx_0.5b.json"   # 2026-12-05, 2-core Xeon with AMX/AVX-512 BF16, load 0.55: format 5


def test_with_speculation_on_every_recorded_cpu_verifies_with_integer_kernels() -> None:
    """Speculation on (choose_plan's default ``exact``): on the AVX2-only,
    the Zen 4 AVX-512 BF16 and the Xeon AMX tables, decode/verify and the
    output layer run integer kernels (a verify gives the steps' bits) and
    the plan says so; speculation off (``exact=None``) frees them, and the
    freed plan is never predicted slower."""
    for f in sorted(DATA.glob("*.json")):
        table = _table(f.name)
        plan = choose_plan(table)
        assert plan.verify_exact is True, f.name
        assert plan.short in EXACT_VERIFY and plan.head in EXACT_VERIFY, f.name
        free = choose_plan(table, exact=None)
        assert free.verify_exact is None
        assert free.cold_ms is not None and free.step_ms is not None and plan.cold_ms is not None
        assert free.cold_ms + 24 * free.step_ms <= plan.cold_ms + 24 * (plan.step_ms or 0) + 1e-6, f.name
    # where a float product decodes fastest (AVX2 with oneDNN: int8 weight-only,
    # bfloat16 activations), speculation on does not take it
    avx2 = _table("avx2_only_onednn.json")
    assert choose_plan(avx2, exact=None).short == "int8"
    assert choose_plan(avx2).short == "int8-dynamic"
    assert "avx512_bf16" in _table(XEON_AMX).machine["cpu_flags"]


def test_without_an_exact_kernel_the_plan_says_so_and_a_gpu_is_not_asked() -> None:
    table = _table(XEON_AMX)
    for precision in ("float32", "bfloat16"):
        plan = choose_plan(table, precision)
        assert plan.storage == precision and plan.verify_exact is False
        assert "decode steps' bits" in plan.reason
    none_here = choose_plan(table, exact=frozenset())
    assert none_here.verify_exact is False and none_here == dataclasses.replace(
        choose_plan(table, exact=None), verify_exact=False, reason=none_here.reason)
    gpu = dataclasses.replace(table, machine={**table.machine, "device": "cuda"})
    assert choose_plan(gpu).verify_exact is None
    assert KernelPlan.from_dict(choose_plan(table).to_dict()).verify_exact is True


def test_the_integer_kernels_treat_every_row_alone_on_the_packed_shapes() -> None:
    """What makes a verify equal the decode steps under the int8 plans: each
    row of a 9-row product by the 0.5B's packed q/k/v, o, gate/up and down
    weights has the bits of that row alone (docs/kernels.md, "Speculation
    and the kernels")."""
    from soldaemon.runtime.forward.kernels import onednn_int8_exact, packed_shapes, rows_alone
    from soldaemon.weights.embedded import QWEN25_CODER_05B

    shapes = packed_shapes(QWEN25_CODER_05B.shapes.config())
    assert shapes == [(1152, 896), (896, 896), (9728, 896), (896, 4864)]
    kernels = ["int8-dynamic"] + (["int8-onednn"] if onednn_int8_exact() else [])
    for kernel in kernels:
        assert all(rows_alone(kernel, n, k) for n, k in shapes), kernel


def test_the_engine_verifies_with_exact_kernels_while_it_speculates(tiny_model_path: Path, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The real load path on the tiny model: speculation on (the default)
    gives a plan whose verify has the steps' bits; speculation off frees
    the kernels; a pinned float precision keeps speculation and says its
    verify is not exact."""
    from soldaemon.config import config_from_dict
    from soldaemon.runtime.engine.local import load_engine

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))

    def engine(**sections: dict) -> object:
        model = {"path": str(tiny_model_path), "max_context": 2048, **sections.pop("model", {})}
        return load_engine(config_from_dict({"model": model, "device": {"device": "cpu"}, **sections}),
                           progress=False)

    on = engine()
    plan = on.backend.plan
    assert plan.verify_exact is True and plan.short in EXACT_VERIFY and plan.head in EXACT_VERIFY
    assert on.info()["drafter"] == "prompt lookup" and on.info()["precision"]["plan"]["verify_exact"] is True
    off = engine(completion={"speculative": False})
    assert off.backend.plan.verify_exact is None and off.info()["drafter"] == "off"
    pinned = engine(model={"precision": "float32"})
    assert pinned.backend.plan.verify_exact is False and pinned.config.completion.speculative


def test_the_plan_cache_tells_cpu_generations_of_one_name_apart() -> None:
    """Two Xeon VMs report the same name and flags; family/model/stepping
    keep their tables apart (a table timed on one does not fit the other)."""
    from soldaemon.runtime.forward.kernels import cpu_model

    def info(model: int) -> str:
        block = (f"processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: {model}\n"
                 f"model name\t: Intel(R) Xeon(R) Processor\nstepping\t: 2\nflags\t\t: avx2\n\n")
        return block + block.replace("processor\t: 0", "processor\t: 1")

    assert cpu_model(info(207)) == "Intel(R) Xeon(R) Processor (family 6 model 207 stepping 2)"
    assert cpu_model(info(167)) != cpu_model(info(207))
    assert cpu_model("model name\t: Some CPU\n") == "Some CPU"      # no ids given: the name alone
