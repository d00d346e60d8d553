"""Whether cuDNN serves attention on CUDA: the choice over recorded tables
(soldaemon/policy/attention.py; measured by layer.plan_attention)."""

from __future__ import annotations

import pytest

from soldaemon.policy.attention import AttentionTimings, choose_cudnn

# A new prompt shape's first call and a second call, ms: tables of both kinds,
# modelled on what was seen, not per-call measurements (the first device run
# recorded whole TTFTs, not attention calls). The H200 kind (torch 2.11,
# 2026-12-04: 0.9-1.2 s more cold TTFT on the prompts where cuDNN planned):
# each new shape planned for several hundred ms, the planned kernel about
# as fast as flash attention's.
H200_WITH = AttentionTimings((420.0, 610.0), (0.031, 0.044))
H200_WITHOUT = AttentionTimings((0.35, 0.41), (0.030, 0.047))
# A machine whose cuDNN plans quickly (a cached or heuristic plan) and whose
# planned kernel is faster: over 28 layers it wins.
QUICK_WITH = AttentionTimings((0.9, 1.1), (0.020, 0.022))
QUICK_WITHOUT = AttentionTimings((0.30, 0.34), (0.060, 0.064))


def test_cudnn_that_plans_every_shape_slowly_is_turned_off() -> None:
    choice = choose_cudnn(H200_WITH, H200_WITHOUT, layers=24)
    assert not choice.cudnn
    assert "with cuDNN" in choice.reason and "24 layers" in choice.reason


def test_cudnn_that_plans_quickly_and_runs_faster_is_kept() -> None:
    # with: 1.0 + 27 * 0.021 = 1.567 ms; without: 0.32 + 27 * 0.062 = 1.994 ms
    assert choose_cudnn(QUICK_WITH, QUICK_WITHOUT, layers=28).cudnn
    # over 2 layers the planning is not paid back: 1.021 against 0.382 ms
    assert not choose_cudnn(QUICK_WITH, QUICK_WITHOUT, layers=2).cudnn


def test_a_tie_goes_to_the_order_without_cudnn_and_no_timings_is_an_error() -> None:
    same = AttentionTimings((1.0,), (0.1,))
    assert not choose_cudnn(same, same, layers=24).cudnn
    with pytest.raises(ValueError):
        choose_cudnn(AttentionTimings((), ()), same, layers=24)


def test_the_summary_carries_both_options_timings() -> None:
    s = choose_cudnn(H200_WITH, H200_WITHOUT, layers=24).summary()
    assert s["cudnn"] is False and s["with_cudnn_ms"] == {"cold": [420.0, 610.0], "warm": [0.031, 0.044]}
    assert s["without_cudnn_ms"]["cold"] == [0.35, 0.41]
