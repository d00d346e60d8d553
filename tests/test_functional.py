"""Functional holes: CPython's own tests decide whether a completion is right."""

from __future__ import annotations

from pathlib import Path

from soldaemon.functional import FunctionalHole, available_modules, cached_holes, find_holes, passes


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
