"""The memory budget: an absolute size or a share of the device's memory."""

from __future__ import annotations

import re
from dataclasses import dataclass


_MIB = 1 << 20  # bytes
_SIZE_UNITS: dict[str, int] = {  # unit → MiB
    "mb": 1, "mib": 1, "m": 1,
    "gb": 1024, "gib": 1024, "g": 1024,
    "tb": 1024 * 1024, "tib": 1024 * 1024, "t": 1024 * 1024,
}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%|[a-z]+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryBudget:
    """A cap on the device memory for resident weights and KV cache: exactly
    one of ``mb`` and ``fraction`` is set (MB and MiB both mean 2**20 bytes)."""

    mb: int | None = None          # MiB (2**20 bytes), >= 1
    fraction: float | None = None  # of the device's total memory, in (0, 1]

    EXPECTED = (
        'null, an integer number of MB (>= 1), a size string like "1500MB" or "2GB", '
        'or a fraction of device memory like "75%" or 0.75'
    )

    def __post_init__(self) -> None:
        if (self.mb is None) == (self.fraction is None):
            raise ValueError("MemoryBudget: set exactly one of mb and fraction")
        if self.mb is not None and self.mb < 1:
            raise ValueError(f"MemoryBudget: mb must be >= 1, got {self.mb}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"MemoryBudget: fraction must be in (0, 1], got {self.fraction}")

    @classmethod
    def parse(cls, value: object) -> MemoryBudget:
        """Parse a YAML value: an int of MB, a float fraction in (0, 1], or a
        string ``"1.5 GB"`` / ``"75%"``; raises ``ValueError`` otherwise."""
        if isinstance(value, bool):
            raise ValueError("a bool is not a memory budget")
        if isinstance(value, int):
            return cls(mb=value)
        if isinstance(value, float):
            return cls(fraction=value)      # __post_init__ refuses one outside (0, 1], nan and inf too
        if isinstance(value, str):
            match = _SIZE_RE.fullmatch(value)
            if match is None:
                raise ValueError(f"not a size: {value!r}")
            number, unit = float(match.group(1)), match.group(2).lower()
            if unit == "%":
                return cls(fraction=number / 100.0)
            if unit not in _SIZE_UNITS:
                raise ValueError(f"unknown unit {unit!r}")
            return cls(mb=round(number * _SIZE_UNITS[unit]))
        raise ValueError(f"not a memory budget: {value!r}")

    def resolve_bytes(self, total_bytes: int) -> int:
        """The budget in bytes on a device with ``total_bytes`` of memory."""
        if self.mb is not None:
            return self.mb * _MIB
        assert self.fraction is not None
        return int(total_bytes * self.fraction)

    def __str__(self) -> str:
        if self.mb is not None:
            return f"{self.mb}MB"
        assert self.fraction is not None
        return f"{self.fraction * 100:g}%"

