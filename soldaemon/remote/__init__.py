"""The remote backend: completions from an OpenAI-compatible engine elsewhere.

:mod:`.engine` is the Engine (the shared pipeline over an HTTP stream, with
its fallback to the local model); :mod:`.stream` one streamed request and
its SSE parsing; :mod:`.endpoint` the URL, API key and back-off;
:mod:`.probe` the reachability probe. The names below stay importable from
``soldaemon.remote`` (its path before it was a package).
"""

from __future__ import annotations

from .endpoint import Backoff, Endpoint, read_api_key
from .engine import WATCH_INTERVAL_S, RemoteEngine, RemoteStats, load_remote_engine
from .probe import Probe, Reachability
from .stream import MAX_ERROR_BODY, MAX_LINE, Piece, UpstreamStream, _parse_chunk

__all__ = [
    "MAX_ERROR_BODY", "MAX_LINE", "WATCH_INTERVAL_S", "Backoff", "Endpoint", "Piece", "Probe", "Reachability",
    "RemoteEngine", "RemoteStats", "UpstreamStream", "_parse_chunk", "load_remote_engine", "read_api_key",
]
