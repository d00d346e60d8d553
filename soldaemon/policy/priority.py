"""Job priority: the order the daemon's worker takes queued jobs in. A ``high`` completion goes
first; ``warm`` is background work behind every completion, whatever its priority.
"""

from __future__ import annotations

# (job kind, request priority) → rank in the worker's queue (0 first)
JOB_PRIORITY: dict[tuple[str, str], int] = {
    ("complete", "high"): 0,
    ("complete", "normal"): 1,
    ("warm", "high"): 2,
    ("warm", "normal"): 2,
}


def job_rank(kind: str, priority: str) -> int:
    """The queue rank of a ``kind`` job ("complete" | "warm") at ``priority`` ("high" |
    "normal"). Raises KeyError for any other pair (the protocol refuses them first)."""
    return JOB_PRIORITY[(kind, priority)]
