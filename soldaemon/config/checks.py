"""The value checks: each takes the raw YAML value and the base of relative paths (None: as given)
and returns the typed value, or raises Bad saying what is allowed."""

from __future__ import annotations

import difflib
import json
import math
import re
from dataclasses import field
from pathlib import Path
from typing import Any, Callable, TypeVar

from soldaemon.config.budget import MemoryBudget

_T = TypeVar("_T")


class Bad(Exception):
    """A value is not allowed. ``expected`` says what is."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


Check = Callable[[object, "Path | None"], Any]


def setting(default: _T, check: Check) -> _T:
    """A dataclass field with a default and the validator for its YAML value."""
    return field(default=default, metadata={"check": check})


def int_in(lo: int, hi: int | None = None) -> Check:
    expected = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def check(value: object, _base: Path | None) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < lo or (hi is not None and value > hi):
            raise Bad(expected)
        return value

    return check


def int_or_auto(lo: int, hi: int | None = None) -> Check:
    """An integer >= ``lo`` (and <= ``hi``), or ``"auto"`` (decided elsewhere)."""
    inner = int_in(lo, hi)

    def check(value: object, base: Path | None) -> object:
        if value == "auto":
            return "auto"
        try:
            return inner(value, base)
        except Bad as bad:
            raise Bad('"auto" or ' + bad.expected) from None

    return check


def float_in(lo: float, *, lo_open: bool = False, hi: float | None = None) -> Check:
    """A finite number ``> lo`` (``lo_open``) or ``>= lo``, and ``<= hi`` when given."""
    expected = f"a number {'>' if lo_open else '>='} {lo:g}" + (f" and <= {hi:g}" if hi is not None else "")

    def check(value: object, _base: Path | None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Bad(expected)
        number = float(value)
        if not math.isfinite(number) or number < lo or (lo_open and number == lo) or (hi is not None and number > hi):
            raise Bad(expected)
        return number

    return check


def boolean() -> Check:
    def check(value: object, _base: Path | None) -> bool:
        if not isinstance(value, bool):
            raise Bad("true or false")
        return value

    return check


def one_of(options: tuple[str, ...]) -> Check:
    expected = "one of " + ", ".join(json.dumps(o) for o in options)

    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or value not in options:
            close = difflib.get_close_matches(str(value), options, n=1)
            raise Bad(expected + (f"; did you mean '{close[0]}'?" if close else ""))
        return value

    return check


def nonempty_text() -> Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not value.strip():
            raise Bad("a non-empty string")
        return value

    return check


def optional(inner: Check) -> Check:
    """``null`` or whatever ``inner`` allows."""

    def check(value: object, base: Path | None) -> Any:
        if value is None:
            return None
        try:
            return inner(value, base)
        except Bad as bad:
            raise Bad("null or " + bad.expected) from None

    return check


def file_path() -> Check:
    def check(value: object, base: Path | None) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise Bad("a path (a non-empty string)")
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        return path

    return check


def _matching(pattern: str, expected: str) -> Check:
    """A string that ``pattern`` matches whole."""
    regex = re.compile(pattern)

    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not regex.fullmatch(value):
            raise Bad(expected)
        return value

    return check


def device_spec() -> Check:
    return _matching(r"auto|cpu|cuda|cuda:[0-9]+", '"auto", "cpu", "cuda" or "cuda:N" (N = 0, 1, ...)')


def str_list() -> Check:
    def check(value: object, _base: Path | None) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.strip() for item in value
        ):
            raise Bad("a list of non-empty strings")
        return tuple(value)

    return check


def http_url() -> Check:
    return _matching(r"https?://[^\s/]+\S*", "an http:// or https:// URL")


def env_name() -> Check:
    return _matching(r"[A-Za-z_][A-Za-z0-9_]*", "the name of an environment variable (letters, digits, _)")


def budget_spec() -> Check:
    def check(value: object, _base: Path | None) -> MemoryBudget | None:
        if value is None:
            return None
        try:
            return MemoryBudget.parse(value)
        except ValueError:
            raise Bad(MemoryBudget.EXPECTED) from None

    return check

