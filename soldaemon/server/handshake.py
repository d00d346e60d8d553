"""Handshake hygiene around :mod:`soldaemon.server.auth`'s checks: single headers, a strict
``Host`` parse, refusals logged in aggregate, and a bound on handshakes in progress. Pure
over strings and a clock."""

from __future__ import annotations

import re
import time
from collections import OrderedDict
from typing import Callable, Generic, Hashable, TypeVar

from soldaemon.discovery import is_loopback_host

SINGLE_HEADERS = ("Host", "Origin", "Authorization")

# host[:port]: a bracketed IPv6 literal or a name / IPv4 address; nothing may follow the port.
_HOST = re.compile(r"(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<name>[A-Za-z0-9.-]+))(?::(?P<port>[0-9]{1,5}))?")


def duplicated(get_all: Callable[[str], list[str]]) -> str | None:
    """The first of :data:`SINGLE_HEADERS` sent more than once, else ``None``."""
    return next((name for name in SINGLE_HEADERS if len(get_all(name)) > 1), None)


def host_is_loopback(value: str | None) -> bool:
    """True for a ``Host`` of exactly ``host[:port]`` naming a loopback host (IPv6 in brackets;
    ``[::1]evil.example`` is not)."""
    match = _HOST.fullmatch(value.strip()) if value else None
    if match is None:
        return False
    port, v6 = match.group("port"), match.group("v6")
    if port is not None and not 0 < int(port) < 65536:
        return False
    return is_loopback_host(f"[{v6}]" if v6 is not None else match.group("name"))


REFUSAL_LOG_S = 10.0


class RefusalLog:
    """Logs a reason's first refusal at once, then at most one line per reason and
    :data:`REFUSAL_LOG_S` with the count since, so a flood of bad handshakes costs a few lines."""

    def __init__(self, emit: Callable[[str], None]) -> None:
        self._emit = emit
        self._last: dict[str, float] = {}       # reason → when it was last logged
        self._pending: dict[str, int] = {}      # reason → refusals not logged since

    def refused(self, reason: str, detail: str = "") -> None:
        now = time.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < REFUSAL_LOG_S:
            self._pending[reason] = self._pending.get(reason, 0) + 1
            return
        more = self._pending.pop(reason, 0)
        since = f"; {more} more since the last report" if more else ""
        self._emit(f"refused a handshake: {reason}{f' ({detail})' if detail else ''}{since}")
        self._last[reason] = now

    def flush(self) -> None:
        """Log what is pending now (at shutdown)."""
        for reason, count in sorted(self._pending.items()):
            self._emit(f"refused {count} more handshake(s): {reason}")
        self._pending.clear()


K = TypeVar("K", bound=Hashable)


class HandshakeGate(Generic[K]):
    """Handshakes in progress, at most ``max_total`` and ``max_per_peer`` per peer address.
    A newcomer is always admitted and the *oldest* handshake (of that peer, else of all) is
    closed: legitimate clients finish in milliseconds, so a flood of idle sockets evicts itself
    rather than holding every slot. Pure: the server closes what :meth:`admit` returns."""

    def __init__(self, max_total: int = 64, max_per_peer: int = 16) -> None:
        if max_total < 1 or max_per_peer < 1:
            raise ValueError(f"handshake bounds must be >= 1, got {max_total}, {max_per_peer}")
        self.max_total = max_total
        self.max_per_peer = max_per_peer
        self._pending: OrderedDict[K, str] = OrderedDict()     # connection → peer, oldest first
        self.evicted = 0                                       # handshakes closed by the bounds

    def __len__(self) -> int:
        return len(self._pending)

    def admit(self, conn: K, peer: str) -> list[K]:
        """Count ``conn``'s handshake; return the connections to close now."""
        self._pending[conn] = peer
        mine = [c for c, p in self._pending.items() if p == peer]
        if len(mine) > self.max_per_peer:
            victim = mine[0]
        elif len(self._pending) > self.max_total:
            victim = next(iter(self._pending))
        else:
            return []
        del self._pending[victim]
        self.evicted += 1
        return [victim]

    def done(self, conn: K) -> None:
        """``conn``'s handshake ended (it completed, failed or closed)."""
        self._pending.pop(conn, None)
