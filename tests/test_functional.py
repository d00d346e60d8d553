"""Functional holes: CPython's own tests decide whether a completion is right."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from soldaemon_bench.functional import FunctionalHole, available_modules, cached_holes, find_holes, passes


def test_textwrap_holes_tell_right_from_wrong() -> None:
    holes = find_holes(3, modules=["textwrap"], per_module=3)
    assert len(holes) == 3
    for fh in holes:
        assert fh.test_module == "test.test_textwrap"
        assert passes(fh, fh.hole.expected), fh.hole
        wrong = "pass" if fh.hole.kind == "block" else "None"
        assert not passes(fh, wrong), fh.hole


def test_a_completion_that_does_not_parse_fails_without_running() -> None:
    fh = find_holes(1, modules=["shlex"], per_module=1)[0]
    assert not passes(fh, fh.hole.expected + " )(")


def test_unknown_modules_are_left_out() -> None:
    assert available_modules(["textwrap", "no_such_module_here"]) == ["textwrap"]


def test_the_hole_list_is_cached(tmp_path: Path) -> None:
    cache = tmp_path / "holes.json"
    first = cached_holes(2, 0, cache, modules=["textwrap"])
    assert cache.exists() and len(first) == 2
    cache_text = cache.read_text()
    again = cached_holes(2, 0, cache, modules=["textwrap"])
    assert again == first and cache.read_text() == cache_text
    assert all(isinstance(h, FunctionalHole) for h in again)


@pytest.mark.slow
def test_a_tested_project_from_pypi_judges_its_own_holes(tmp_path: Path, monkeypatch) -> None:
    """more-itertools' own tests (its sdist, fetched once) tell a right block from a wrong one."""
    from soldaemon_bench import functional

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    holes = find_holes(2, modules=["more_itertools.recipes"], kinds=("block",))
    assert len(holes) == 2
    for fh in holes:
        assert fh.hole.kind == "block" and fh.test_module == "tests.test_recipes"
        assert fh.hole.file.endswith("more_itertools/recipes.py")
        assert passes(fh, fh.hole.expected), fh.hole
        assert not passes(fh, "pass"), fh.hole
    assert functional.project_root(functional.PROJECTS["more_itertools.recipes"], fetch=False) is not None


def test_hole_kinds_are_kept_apart_in_the_cache(tmp_path: Path) -> None:
    cache = tmp_path / "holes.json"
    blocks = cached_holes(2, 0, cache, modules=["textwrap"], kinds=("block",))
    assert [h.hole.kind for h in blocks] == ["block", "block"]
    lines = cached_holes(2, 0, cache, modules=["textwrap"], kinds=("line",))
    assert [h.hole.kind for h in lines] == ["line", "line"]
    assert cached_holes(2, 0, cache, modules=["textwrap"], kinds=("line",)) == lines


@pytest.mark.skipif(sys.platform != "linux", reason="PR_SET_PDEATHSIG is Linux's")
def test_a_looping_completion_dies_with_the_bench(tmp_path: Path) -> None:
    """A completion whose tests loop forever is killed by the timeout; and
    when the bench itself is stopped first, its tests die with it instead
    of taking a core from every later measurement."""
    import subprocess
    import time

    import psutil

    script = tmp_path / "bench.py"
    script.write_text(
        "from soldaemon_bench import functional as f\n"
        "src = open(f.module_path('colorsys')).read().replace(\n"
        "    'def rgb_to_yiq(r, g, b):', 'def rgb_to_yiq(r, g, b):\\n    while True: pass', 1)\n"
        "f.run_tests('colorsys', src, timeout_s=600)\n")
    bench = subprocess.Popen([sys.executable, str(script)])
    try:
        deadline = time.monotonic() + 60
        children: list[psutil.Process] = []
        while not children and time.monotonic() < deadline:
            time.sleep(0.2)
            children = psutil.Process(bench.pid).children()
        assert children, "the tests never started"
        time.sleep(3)                     # well into the loop
        assert children[0].is_running()
    finally:
        bench.kill()
        bench.wait()
    gone, alive = psutil.wait_procs(children, timeout=15)
    assert not alive, f"the tests outlived the bench: {alive}"
