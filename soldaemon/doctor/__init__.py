"""``soldaemon doctor``: is this machine ready to serve, and why not.

:mod:`.checks` runs every check and prints the report; :mod:`.daemon` asks the
running daemon; :mod:`.plan` reads the kernel plan and model choice the
daemon cached. No torch.
"""

from __future__ import annotations

from typing import Any


def line(verdict: str, detail: str, *, cost: str | None = None, fix: str | None = None,
         facts: dict[str, Any] | None = None) -> dict[str, Any]:
    """A :class:`soldaemon.doctor.checks.Check`'s keyword arguments without its name."""
    return {"verdict": verdict, "detail": detail, "cost": cost, "fix": fix, "facts": facts}
