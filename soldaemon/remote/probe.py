"""The remote engine's reachability: ``GET /v1/models``, cached, probed on
its own thread so that health readers never block."""

from __future__ import annotations

import json
import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable

import httpx

from soldaemon.remote.endpoint import Endpoint
from soldaemon.remote.stream import MAX_ERROR_BODY, failure_reason, read_at_most

log = logging.getLogger("soldaemon.remote")


@dataclass
class Reachability:
    """What the daemon last learnt about the engine."""

    reachable: bool | None = None  # None: not known yet
    checked: float = 0.0           # time.monotonic() of the last probe or request outcome
    error: str | None = None       # why it was unreachable
    models: tuple[str, ...] = ()   # ids listed by GET /v1/models


class Probe:
    """``GET <base>/models``, cached ``interval_s``: :meth:`snapshot` never
    blocks; a stale value starts one background probe."""

    def __init__(self, endpoint: Endpoint, headers: dict[str, str], interval_s: float, timeout_s: float) -> None:
        self.endpoint = endpoint
        self.headers = headers
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.state = Reachability()
        self._running = False
        self._lock = threading.Lock()
        self.on_reachable: Callable[[], None] = lambda: None

    def snapshot(self) -> Reachability:
        with self._lock:
            stale = time.monotonic() - self.state.checked > self.interval_s
            start = stale and not self._running
            if start:
                self._running = True
        if start:
            threading.Thread(target=self._run, name="sol-remote-probe", daemon=True).start()
        return self.state

    def probe_now(self) -> Reachability:
        """Probe on this thread (bounded by the timeouts) and return it."""
        with self._lock:
            self._running = True
        self._run()
        return self.state

    def note(self, reachable: bool, error: str | None = None) -> None:
        """A request's outcome counts as a probe."""
        self.state = Reachability(reachable, time.monotonic(), error, self.state.models)

    def _run(self) -> None:
        try:
            models, error = self._get_models()
            if error is None:
                self.state = Reachability(True, time.monotonic(), None, models)
                self.on_reachable()
            else:
                self.state = Reachability(False, time.monotonic(), error, self.state.models)
        finally:
            with self._lock:
                self._running = False

    def _get_models(self) -> tuple[tuple[str, ...], str | None]:
        try:
            with self.endpoint.client.stream("GET", self.endpoint.url("/models"), headers=self.headers,
                                             timeout=self.timeout_s) as resp:
                body = read_at_most(resp, MAX_ERROR_BODY)
                if resp.status_code != 200:
                    return (), f"GET /v1/models answered HTTP {resp.status_code} {resp.reason_phrase}"
            data = json.loads(body).get("data", [])
            return tuple(str(m.get("id")) for m in data if isinstance(m, dict) and m.get("id")), None
        except (httpx.TransportError, httpx.StreamError) as exc:
            return (), failure_reason(exc)
        except (ValueError, AttributeError):
            return (), "GET /v1/models did not answer an OpenAI model list"
