"""Sharing the daemon between clients: who may queue more work, which
self-declared ``high`` priorities count, and giving memory back after a
client that stopped reading is closed.

Pure rules over counts (the server's :class:`~soldaemon.server.connection.Connection`
applies them); queue order is :mod:`soldaemon.server.fairqueue`.

- **Fair share.** Below half of ``max_in_flight`` anyone may queue up to the
  per-connection limit. Above it, a connection holding more than its share
  (``max_in_flight / 2 / active connections``, at least
  :data:`MIN_SHARE`) is refused ``busy``: a client with 8 connections can
  no longer fill the daemon-wide limit, and a newcomer always gets in.
- **Priority.** ``high`` is the client's word; a connection gets at most
  :data:`MAX_HIGH_QUEUED` ``high`` requests queued at once, the rest are
  served as ``normal`` (an editor has one invoked completion at a time).
"""

from __future__ import annotations

import gc
import logging

from soldaemon.runtime.memory.heap import return_free_heap

log = logging.getLogger("soldaemon.server")

MIN_SHARE = 4          # requests a connection may always hold above half load
MAX_HIGH_QUEUED = 2    # high-priority requests queued per connection


def over_share(conn_jobs: int, daemon_jobs: int, active_connections: int, max_in_flight: int) -> bool:
    """True when a connection holding ``conn_jobs`` may not queue another
    (see the module doc); the hard limits are checked by the caller."""
    if daemon_jobs < max_in_flight // 2:
        return False
    share = max(MIN_SHARE, max_in_flight // 2 // max(1, active_connections))
    return conn_jobs >= share


def allowed_priority(wanted: str, high_queued: int) -> str:
    """The priority a request is queued at, given how many ``high`` ones
    its connection already has queued."""
    return "high" if wanted == "high" and high_queued < MAX_HIGH_QUEUED else "normal"


def release_memory() -> None:
    """Collect garbage and hand the C heap's free pages back
    (:func:`~soldaemon.runtime.memory.heap.return_free_heap`): without it,
    the tens of MB a slow client's unread frames took stay in the process
    after it is gone."""
    gc.collect()
    return_free_heap()
