"""End-of-answer statistics of ``bench --quality`` (soldaemon_bench.quality.ends)
on hand-made columns."""

from __future__ import annotations

import dataclasses

import pytest

pytest.importorskip("tree_sitter_python")

from soldaemon_bench.holes import Hole  # noqa: E402
from soldaemon_bench.quality import Column  # noqa: E402
from soldaemon_bench.quality import ends  # noqa: E402
from soldaemon_bench.quality.report import table  # noqa: E402

PREFIX = "def primes(n):\n    out = []\n    "
SUFFIX = "\n    return out\n"
RIGHT = "for i in range(2, n):\n        out.append(i)"
HOLES = [Hole("a.py", 2, PREFIX, SUFFIX, RIGHT, "block"), Hole("a.py", 2, PREFIX, SUFFIX, RIGHT, "block"),
         Hole("a.py", 9, "x = ", "\n", "1", "line")]
KINDS = [h.kind for h in HOLES]


def column(name: str, texts: list[str], ends_: list[str], passed: list[bool | None]) -> Column:
    col = Column(name)
    for hole, text, end, ok in zip(HOLES, texts, ends_, passed):
        col.add(hole, text, 1.0, 10, 5, 0.5, end, python=True)
        col.scores[-1] = dataclasses.replace(col.scores[-1], passed=ok)
    return col


def test_end_statistics_on_block_holes() -> None:
    raw = column("raw", [RIGHT, RIGHT + "\n    x = 1", "1"], ["", "", ""], [True, False, None])
    sol = column("sol", ["for i in range(2, n):", RIGHT, "1"], ["opener", "model", "line"], [False, True, None])
    s = ends.summary(sol, KINDS, raw)
    assert s["n"] == 2
    assert s["open_ends"] == 1                      # "for ...:" with no body in the suffix
    assert s["prefix_of_passing_raw"] == 1          # hole 0: a prefix of the raw answer that passed
    assert s["lines_shown"] == 3                    # 1 + 2
    assert s["lines_cut"] == 1 + 1                  # hole 0 left out 1 raw line, hole 1 one
    assert s["ends"] == {"model": {"n": 1, "right": 1}, "opener": {"n": 1, "right": 0}}
    lines = table([sol, raw], KINDS)
    assert "| sol | 1 | 1 | 3 / 2 | model 1 (1), opener 1 (0) |" in lines
    assert any(line.startswith("| raw | 0 | — |") for line in lines)


def test_no_block_holes_no_end_table() -> None:
    col = Column("sol")
    col.add(HOLES[2], "1", 1.0, 1, 1, python=True)
    assert ends.table([col], ["line"]) == []
    assert col.ends == [""] and col.open_ends == [False]


def test_each_model_is_compared_with_its_own_raw_answers() -> None:
    """With --models, sol[1.5b] (and its drafted form, and llama.vscode on
    the same model) is held against raw[1.5b], never the 0.5B's raw."""
    raw_05 = column("raw[0.5b]", ["x = 0", "x = 0", "1"], ["", "", ""], [False, False, None])
    raw_15 = column("raw[1.5b]", [RIGHT, RIGHT, "1"], ["", "", ""], [True, True, None])
    sol_15 = column("sol[1.5b]", ["for i in range(2, n):", RIGHT, "1"], ["opener", "model", "line"],
                    [False, True, None])
    cols = [raw_05, raw_15, sol_15]
    assert ends.raw_for(sol_15, cols) is raw_15
    assert ends.raw_for(column("sol[1.5b+0.5b]", [], [], []), cols) is raw_15
    assert ends.raw_for(column("llama.vscode[0.5b]", [], [], []), cols) is raw_05
    assert ends.raw_for(column("sol", [], [], []), cols) is None
    assert ends.summary(sol_15, KINDS, ends.raw_for(sol_15, cols))["prefix_of_passing_raw"] == 1
    assert "| sol[1.5b] | 1 | 1 | 3 / 1 | model 1 (1), opener 1 (0) |" in table(cols, KINDS)


def test_each_target_model_gets_its_first_engine_in_order() -> None:
    """--models qwen-1.5b+qwen-0.5b qwen-0.5b qwen-1.5b: one raw and one
    llama.vscode column per target, on the first engine loaded for it."""
    from soldaemon_bench.quality.command import _per_target

    a1, b, a2 = object(), object(), object()
    by_model = [(Column("sol[1.5b+0.5b]"), "1.5b", a1), (Column("sol[0.5b]"), "0.5b", b),
                (Column("sol[1.5b]"), "1.5b", a2)]
    assert _per_target(by_model) == [("1.5b", a1), ("0.5b", b)]
    assert _per_target([]) == []


def test_hole_ids_keep_the_named_holes_in_order_and_refuse_unknown_ones() -> None:
    """--hole-ids path:line: the chosen holes (and their functional twins)
    in the run's order; an id that names no hole is an error naming it."""
    from soldaemon.errors import BadRequest
    from soldaemon_bench.quality.command import _chosen

    holes = [Hole("a.py", 2, "", "", "x", "block"), Hole("b.py", 7, "", "", "y", "block"),
             Hole("a.py", 9, "", "", "z", "line")]
    twins = ["A2", "B7", "A9"]
    assert _chosen(holes, twins, None) == (holes, twins)
    assert _chosen(holes, twins, ["a.py:9", "a.py:2"]) == ([holes[0], holes[2]], ["A2", "A9"])
    assert _chosen(holes, None, ["b.py:7"]) == ([holes[1]], None)
    with pytest.raises(BadRequest, match="c.py:1"):
        _chosen(holes, twins, ["b.py:7", "c.py:1"])
