"""The "auto" prompt windows fitted to this machine's prefill: the policy
over numbers, and a real engine on the tiny model that serves them."""

from __future__ import annotations

import pytest

from soldaemon.api import CompletionRequest
from soldaemon.config import config_from_dict
from soldaemon.policy import windows
from soldaemon.policy.kernel_plan import KernelPlan, TimingTable
from soldaemon.policy.windows import FLOOR, fit_windows, prompt_ms
from soldaemon.runtime.engine.local import load_engine
from soldaemon_bench.tiny import build_tiny_model


def test_windows_that_fit_the_budget_are_the_models_own() -> None:
    f = fit_windows(1024, 256, 128, 1.5, budget_ms=2500)     # 1,408 tokens: 2.1 s
    assert (f.prefix, f.suffix, f.outline) == (1024, 256, 128)
    assert "the model's own" in f.why


def test_a_slow_machine_drops_the_outline_first_then_shrinks_prefix_and_suffix_alike() -> None:
    f = fit_windows(1024, 256, 128, 2.0, budget_ms=2500)     # 1,250 tokens fit
    assert f.outline == 0 and f.prefix < 1024 and f.suffix < 256
    assert f.prefix + f.suffix <= 1250 and abs(f.prefix / f.suffix - 4.0) < 0.1
    assert "shrunk from 1408" in f.why
    g = fit_windows(1024, 256, 128, 1.85, budget_ms=2500)    # 1,351 fit: part of the outline stays
    assert (g.prefix, g.suffix) == (1024, 256) and 0 < g.outline < 128


def test_never_below_the_floor() -> None:
    f = fit_windows(1024, 256, 128, 50.0, budget_ms=2500)
    assert (f.prefix, f.suffix, f.outline) == (*FLOOR, 0)


def _table(blocks: dict[str, dict[int, float]]) -> TimingTable:
    return TimingTable(blocks=blocks, head={"int8-dynamic": {1: 5.0, 2: 5.0}}, n_layers=10)


def test_prompt_cost_reads_the_blocked_copy_where_the_plan_keeps_it() -> None:
    table = _table({"int8-dynamic": {1: 1.0, 512: 20.0}, "int8-onednn": {1: 1.0, 512: 10.0}})
    one = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic")
    two = KernelPlan("int8", "int8-dynamic", "int8-dynamic", "int8", "int8-dynamic", rows="int8-onednn")
    assert prompt_ms(table, one, 1024) == pytest.approx(10 * 2 * 20.0 + 5.0)
    assert prompt_ms(table, two, 1024) == pytest.approx(10 * 2 * 10.0 + 5.0)


def test_the_engine_serves_fitted_windows_and_keeps_a_users_own(tmp_path, monkeypatch) -> None:
    path = build_tiny_model(tmp_path / "tiny")
    config = config_from_dict({"model": {"path": str(path), "max_context": 4096, "precision": "float32"},
                               "device": {"device": "cpu"}})
    engine = load_engine(config, progress=False)
    fitted = engine.info()["windows"]
    assert fitted["why"].startswith("the model's own")          # the tiny model reads 1k tokens in ms
    w = engine.config.model.windows()
    assert (w.prefix, w.suffix, w.outline) == (fitted["prefix"], fitted["suffix"], fitted["outline"])
    long_prefix = "".join(f"value_{i} = compute({i}, {i * 7})\n" for i in range(600))
    req = CompletionRequest(id="w", prefix=long_prefix, suffix="\nprint(value_1)\n" * 80, max_tokens=4)
    before = len(engine.build_prompt(req)[0].ids)

    # a machine this slow (the budget a millionth): the windows shrink to the floor, and prompts with them
    monkeypatch.setattr(windows, "COLD_PROMPT_BUDGET_MS", 1e-6)
    engine.warmup()
    shrunk = engine.config.model.windows()
    assert (shrunk.prefix, shrunk.suffix, shrunk.outline) == (*FLOOR, 0)
    assert engine.info()["windows"]["why"].startswith("shrunk")
    assert len(engine.build_prompt(req)[0].ids) < before

    # a window the user set is the user's
    engine.config = config.with_overrides({"model.max_prefix_tokens": 700}, source="test")
    assert engine.config.model.windows().prefix == 700
    assert engine.config.model.windows().suffix == FLOOR[1]


def _recorded(name: str) -> TimingTable:
    import json
    from pathlib import Path

    return TimingTable.from_dict(json.loads((Path(__file__).parent / "data" / "kernel_tables" / name)
                                            .read_text())["table"])


@pytest.mark.parametrize("name, kept", [
    ("xeon_amx_1.5b.json", True),          # 2026-12-05, 2-core Xeon with AMX: the blocked copy reads 1.5 ms a token
    ("zen4_avx512_bf16_1.5b.json", False),  # 2-core Zen 4, bfloat16: 2.9 ms a token
])
def test_the_1_5b_keeps_its_windows_where_its_prefill_is_fast_and_shrinks_them_where_not(name: str,
                                                                                           kept: bool) -> None:
    from soldaemon.config.sections import WINDOWS_BY_MODEL
    from soldaemon.policy.kernel_plan import choose_plan

    table = _recorded(name)
    own = WINDOWS_BY_MODEL["qwen2.5-coder-1.5b"]
    f = fit_windows(own.prefix, own.suffix, own.outline, prompt_ms(table, choose_plan(table), 1024) / 1024)
    assert ((f.prefix, f.suffix, f.outline) == (own.prefix, own.suffix, own.outline)) is kept
    if not kept:   # the outline goes, and a cold prompt fits the budget, above the floor
        assert f.outline == 0 and FLOOR[0] < f.prefix < own.prefix
        assert (f.prefix + f.suffix) * prompt_ms(table, choose_plan(table), 1024) / 1024 <= \
            windows.COLD_PROMPT_BUDGET_MS
