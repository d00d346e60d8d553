"""Where the remote engine listens (and the HTTP client that reaches it),
its API key, and the back-off over consecutive failures."""

from __future__ import annotations

import functools
import os
import ssl
import threading
import time
import urllib.parse
from dataclasses import dataclass
from typing import Callable

import httpx

from soldaemon.discovery import is_loopback_host
from soldaemon.errors import ConfigError


@dataclass(frozen=True)
class Endpoint:
    """Where the engine listens."""

    https: bool
    host: str
    port: int
    base: str                      # path prefix up to and including /v1, e.g. "/v1"
    shown: str                     # the URL without user:password@, the only form logged
    userinfo: str | None = None    # "user:password" from the URL (sent as Basic auth)

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        """``http(s)://host[:port][/prefix][/v1]``, API at ``<prefix>/v1``; raises ConfigError."""
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"backend.url = {url!r}: expected an http:// or https:// URL with a host")
        try:
            port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            raise ConfigError(f"backend.url: invalid port in {parts.hostname}") from None
        path = parts.path.rstrip("/")
        base = path if path.endswith("/v1") else path + "/v1"
        host = parts.hostname
        netloc = f"[{host}]" if ":" in host else host
        if parts.port:
            netloc += f":{parts.port}"
        userinfo = None
        if parts.username is not None:
            userinfo = urllib.parse.unquote(parts.username) + ":" + urllib.parse.unquote(parts.password or "")
        return cls(parts.scheme == "https", host, port, base, f"{parts.scheme}://{netloc}{base}", userinfo)

    def refuse_clear_text(self, allow_insecure: bool) -> None:
        """Raise ConfigError for plain ``http://`` to another host unless ``allow_insecure``."""
        if not self.https and not is_loopback_host(self.host) and not allow_insecure:
            raise ConfigError(
                f"backend.url {self.shown} is plain http:// to another host: the API key and every prompt "
                "would cross the network in clear text",
                hint="use https://, or set backend.allow_insecure: true for a network you trust")

    def url(self, route: str) -> str:
        """The URL of an API route, e.g. ``url("/completions")``."""
        return self.shown + route

    @functools.cached_property
    def client(self) -> httpx.Client:
        """The client shared by requests and probe: no keep-alive, no proxy or ``.netrc`` from
        the environment, the system's CA store, no compression."""
        return httpx.Client(
            verify=ssl.create_default_context(),
            trust_env=False,
            limits=httpx.Limits(max_keepalive_connections=0),
            headers={"Accept-Encoding": "identity"},
        )


class Backoff:
    """Back-off: failure k rests ``min(max_s, first_s * 2**(k-1))`` seconds; a success resets it."""

    def __init__(self, first_s: float, max_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.first_s, self.max_s = first_s, max_s
        self.clock = clock
        self.failures = 0
        self.last_error = ""
        self._until = 0.0
        self._lock = threading.Lock()

    def failed(self, why: str) -> float:
        """Record a failure; return the wait before the next try (s)."""
        with self._lock:
            self.failures += 1
            self.last_error = why
            wait = min(self.max_s, self.first_s * 2 ** (self.failures - 1))
            self._until = self.clock() + wait
            return wait

    def succeeded(self) -> None:
        with self._lock:
            self.failures = 0
            self._until = 0.0

    def remaining(self) -> float:
        """Seconds until the engine may be tried again (0: now)."""
        return max(0.0, self._until - self.clock())


def read_api_key(env_name: str | None, file: str | None) -> str | None:
    """The API key: ``$env_name`` when set and non-empty, else the first line
    of ``file``. Raises ConfigError when neither gives one although asked."""
    if env_name:
        value = os.environ.get(env_name, "").strip()
        if value:
            return value
    if file:
        try:
            with open(file, encoding="utf-8") as f:
                value = f.readline().strip()
        except OSError as exc:
            raise ConfigError(f"backend.api_key_file '{file}': cannot read: {exc.strerror or exc}") from None
        if not value:
            raise ConfigError(f"backend.api_key_file '{file}' is empty")
        return value
    if env_name:
        raise ConfigError(f"backend.api_key_env names ${env_name}, but it is not set or empty",
                          hint=f"export {env_name}=... before starting the daemon, or set backend.api_key_file")
    return None
