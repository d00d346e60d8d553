"""Rules for sharing the daemon between clients, pure over counts (:mod:`.connection` applies
them; queue order is :mod:`.fairqueue`). Above half of ``max_in_flight`` a connection over its
share is refused ``busy``, so a newcomer always gets in; ``high`` priority is the client's word,
capped at :data:`MAX_HIGH_QUEUED` queued per connection."""

from __future__ import annotations

import gc
import logging

from soldaemon.runtime.memory.heap import return_free_heap

log = logging.getLogger("soldaemon.server")

MIN_SHARE = 4          # requests a connection may always hold above half load
MAX_HIGH_QUEUED = 2    # high-priority requests queued per connection


def over_share(conn_jobs: int, daemon_jobs: int, active_connections: int, max_in_flight: int) -> bool:
    """True when a connection holding ``conn_jobs`` is over its share (``max_in_flight / 2 /
    active_connections``, at least :data:`MIN_SHARE`); the caller checks the hard limits."""
    if daemon_jobs < max_in_flight // 2:
        return False
    share = max(MIN_SHARE, max_in_flight // 2 // max(1, active_connections))
    return conn_jobs >= share


def allowed_priority(wanted: str, high_queued: int) -> str:
    """The priority a request is queued at, given its connection's queued ``high`` count."""
    return "high" if wanted == "high" and high_queued < MAX_HIGH_QUEUED else "normal"


def release_memory() -> None:
    """Collect garbage and return the C heap's free pages, so a closed slow client's unread
    frames do not stay in the process."""
    gc.collect()
    return_free_heap()
