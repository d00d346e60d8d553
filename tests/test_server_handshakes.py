"""Handshakes in progress are bounded (issue 26, finding 5): a local user who
opens sockets and never sends a request cannot hold them until editors are
locked out. A real daemon, raw sockets, a real client."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import pytest

from tests.fixtures.daemon import FAKE_ENGINE, REPO, complete


def closed_by_server(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:            # reset: closed too
        return True


def count_closed(socks: list[socket.socket]) -> int:
    return sum(closed_by_server(s) for s in socks)


@pytest.mark.asyncio
async def test_idle_sockets_are_bounded_and_time_out(start_daemon: Any) -> None:
    inherited = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    daemon = start_daemon(args=["--engine", FAKE_ENGINE], env={"PYTHONPATH": inherited})
    where = urlsplit(daemon.url)
    idle: list[socket.socket] = []
    try:
        for _ in range(150):             # connect, send nothing
            s = socket.create_connection((where.hostname, where.port), timeout=5)
            s.setblocking(False)
            idle.append(s)
        await asyncio.sleep(1.0)
        early = count_closed(idle)
        # at most 16 handshakes in progress per peer (all of these are 127.0.0.1): the oldest are closed
        assert early >= 150 - 16, f"only {early} of 150 idle sockets were closed after 1 s"
        # an editor connecting now is served (the flood evicts itself, not the newcomer)
        ws = await daemon.connect()
        _, done = await complete(ws, "r1", timeout=30)
        assert type(done).__name__ == "Done", done
        await ws.close()
        t0 = time.monotonic()
        while count_closed(idle) < 150 and time.monotonic() - t0 < 6:
            await asyncio.sleep(0.1)
        assert count_closed(idle) == 150, "idle sockets outlived the 3 s handshake timeout"
    finally:
        for s in idle:
            s.close()
