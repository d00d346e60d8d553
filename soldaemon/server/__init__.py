"""``soldaemon serve`` and ``soldaemon status``: the websocket server over
one inference worker, and its client.

One module per concern:

- :mod:`.worker` — :class:`Job` and the one inference thread, :class:`Worker`
  (the priority queue; it never touches a socket);
- :mod:`.connection` — one websocket, :class:`Connection` (decode, rate limit
  with :class:`TokenBucket`, supersede, cancel, ordered writes);
- :mod:`.daemon` — :class:`Daemon`, what connections share: the job registry,
  metrics, the HTTP hook (auth, ``/healthz``, ``/metrics``), state and drain;
- :mod:`.engine_choice` — which engine ``serve`` loads;
- :mod:`.command` — start-up and shutdown (:func:`serve`, :func:`run`);
- :mod:`.arguments` — the options of ``serve`` and ``status``;
- :mod:`.status` — the ``soldaemon status`` client;
- :mod:`.settings` — :class:`ServerSettings`.

The daemon record (``daemon.json``, where a running daemon listens) is
:mod:`soldaemon.server.statefiles`; finding a running daemon is
:mod:`soldaemon.discovery`, shared with sol-lsp.

Threads: the engine runs on the worker thread only; everything else runs on
the event loop thread.

The names below stay importable from here; they load on first use, so
``soldaemon status`` does not import the websocket server (or anything it
does not need).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from soldaemon.discovery import ws_url
    from soldaemon.server.connection import Connection, TokenBucket
    from soldaemon.server.daemon import WS_PATHS, Daemon, DaemonState
    from soldaemon.server.arguments import add_arguments, add_status_arguments
    from soldaemon.server.command import run, serve
    from soldaemon.server.settings import SOL_DIAGNOSIS_KEYS, ServerSettings
    from soldaemon.server.status import query_health, run_status
    from soldaemon.server.worker import Job, JobKind, Worker

_WHERE = {
    "Connection": "soldaemon.server.connection", "TokenBucket": "soldaemon.server.connection",
    "Daemon": "soldaemon.server.daemon", "DaemonState": "soldaemon.server.daemon",
    "WS_PATHS": "soldaemon.server.daemon",
    "add_arguments": "soldaemon.server.arguments", "run": "soldaemon.server.command",
    "serve": "soldaemon.server.command",
    "SOL_DIAGNOSIS_KEYS": "soldaemon.server.settings", "ServerSettings": "soldaemon.server.settings",
    "add_status_arguments": "soldaemon.server.arguments", "query_health": "soldaemon.server.status",
    "run_status": "soldaemon.server.status",
    "Job": "soldaemon.server.worker", "JobKind": "soldaemon.server.worker", "Worker": "soldaemon.server.worker",
    "ws_url": "soldaemon.discovery",
}

__all__ = sorted(_WHERE)


def __getattr__(name: str) -> Any:
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(where), name)
