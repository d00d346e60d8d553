"""The value checks. Each takes the raw YAML value and the directory relative
paths are taken from (None: leave them as given) and returns the typed value,
or raises _Bad with a description of what is allowed."""

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


class _Bad(Exception):
    """A value is not allowed. ``expected`` says what is."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


_Check = Callable[[object, "Path | None"], Any]


def _setting(default: _T, check: _Check) -> _T:
    """A dataclass field with a default and the validator for its YAML value."""
    return field(default=default, metadata={"check": check})


def _int(lo: int, hi: int | None = None) -> _Check:
    expected = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def check(value: object, _base: Path | None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(expected)
        if value < lo or (hi is not None and value > hi):
            raise _Bad(expected)
        return value

    return check


def _int_or_auto(lo: int, hi: int | None = None) -> _Check:
    """An integer >= ``lo`` (and <= ``hi``), or ``"auto"`` (the value is
    decided elsewhere)."""
    inner = _int(lo, hi)

    def check(value: object, base: Path | None) -> object:
        if value == "auto":
            return "auto"
        try:
            return inner(value, base)
        except _Bad:
            raise _Bad(f'"auto" or an integer in {lo}..{hi}' if hi is not None
                       else f'"auto" or an integer >= {lo}') from None

    return check


def _float(lo: float, *, lo_open: bool = False, hi: float | None = None) -> _Check:
    """A finite number (int or float) with ``value > lo`` (``lo_open``) or
    ``value >= lo``, and ``value <= hi`` when ``hi`` is given."""
    low = f"> {lo:g}" if lo_open else f">= {lo:g}"
    if hi is None:
        expected = f"a number {low}"
    else:
        expected = f"a number {low} and <= {hi:g}"

    def check(value: object, _base: Path | None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(expected)
        number = float(value)
        if not math.isfinite(number):
            raise _Bad(expected)
        if number < lo or (lo_open and number == lo) or (hi is not None and number > hi):
            raise _Bad(expected)
        return number

    return check


def _bool() -> _Check:
    def check(value: object, _base: Path | None) -> bool:
        if not isinstance(value, bool):
            raise _Bad("true or false")
        return value

    return check


def _choice(options: tuple[str, ...]) -> _Check:
    expected = "one of " + ", ".join(json.dumps(o) for o in options)

    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or value not in options:
            close = difflib.get_close_matches(str(value), options, n=1)
            raise _Bad(expected + (f"; did you mean '{close[0]}'?" if close else ""))
        return value

    return check


def _text() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("a non-empty string")
        return value

    return check


def _optional(inner: _Check) -> _Check:
    """``null`` or whatever ``inner`` allows."""

    def check(value: object, base: Path | None) -> Any:
        if value is None:
            return None
        try:
            return inner(value, base)
        except _Bad as bad:
            raise _Bad("null or " + bad.expected) from None

    return check


def _path() -> _Check:
    def check(value: object, base: Path | None) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("a path (a non-empty string)")
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        return path

    return check


_DEVICE_RE = re.compile(r"auto|cpu|cuda|cuda:[0-9]+")


def _device() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _DEVICE_RE.fullmatch(value):
            raise _Bad('"auto", "cpu", "cuda" or "cuda:N" (N = 0, 1, ...)')
        return value

    return check


def _str_list() -> _Check:
    def check(value: object, _base: Path | None) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.strip() for item in value
        ):
            raise _Bad("a list of non-empty strings")
        return tuple(value)

    return check


_URL_RE = re.compile(r"https?://[^\s/]+\S*")


def _url() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _URL_RE.fullmatch(value):
            raise _Bad("an http:// or https:// URL")
        return value

    return check


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _ENV_NAME_RE.fullmatch(value):
            raise _Bad("the name of an environment variable (letters, digits, _)")
        return value

    return check


def _memory_budget() -> _Check:
    def check(value: object, _base: Path | None) -> MemoryBudget | None:
        if value is None:
            return None
        try:
            return MemoryBudget.parse(value)
        except ValueError:
            raise _Bad(MemoryBudget.EXPECTED) from None

    return check

