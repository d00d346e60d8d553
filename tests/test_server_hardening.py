"""The daemon's gate and its sharing, against real ``soldaemon serve``
processes: duplicate auth headers, a 401 that names no path, a strictly
parsed Host, refusals logged in aggregate; round-robin between connections,
a fair share of the in-flight limit, a bounded self-declared priority; and
type-through that never crosses prompt inputs."""

from __future__ import annotations

import asyncio
import http.client
import json
import time
from pathlib import Path
from typing import Any, Iterator

import pytest

from tests.fixtures.daemon import FAKE_ENGINE, Daemon, complete, spawn
from tests.fixtures.gate import ENV as GATE_ENV
from tests.fixtures.gate import Gate


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    tmp = tmp_path_factory.mktemp("hard")
    d = spawn(tmp, args=["--engine", FAKE_ENGINE], server={"rate_limit_per_s": 100_000},
              env={GATE_ENV: str(tmp / "gate")})
    assert isinstance(d, Daemon)
    yield d
    d.stop()


def raw_get(daemon: Daemon, headers: list[tuple[str, str]], path: str = "/healthz") -> tuple[int, str]:
    port = int(daemon.url.rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.putrequest("GET", path, skip_host=True, skip_accept_encoding=True)
    for name, value in headers:
        conn.putheader(name, value)
    conn.endheaders()
    response = conn.getresponse()
    body = response.read().decode(errors="replace")
    conn.close()
    return response.status, body


# --------------------------------------------------------------------------
# The handshake
# --------------------------------------------------------------------------


def test_duplicate_auth_headers_are_a_400_without_a_traceback(daemon: Daemon) -> None:
    host = ("Host", "127.0.0.1")
    auth = ("Authorization", f"Bearer {daemon.token}")
    for headers in ([host, host, auth], [host, auth, auth], [host, auth, ("Origin", "a"), ("Origin", "b")]):
        status, body = raw_get(daemon, headers)
        assert status == 400, (status, body)
        assert body.count("\n") == 1 and "more than one" in body
    assert raw_get(daemon, [host, auth])[0] == 200
    log = daemon.stderr()
    assert "Traceback" not in log and "duplicate Host header" in log


def test_401_names_no_path(daemon: Daemon) -> None:
    status, body = raw_get(daemon, [("Host", "127.0.0.1")])
    assert status == 401
    assert str(daemon.token_path) not in body and str(daemon.state_dir) not in body and "/" not in body.split("(")[1]


@pytest.mark.parametrize("host", ["[::1]evil.example", "[::1]:80evil", "127.0.0.1:80:80", "127.0.0.1 evil",
                                  "localhost:99999", "[::1", "evil.example"])
def test_host_is_parsed_strictly(daemon: Daemon, host: str) -> None:
    status, _ = raw_get(daemon, [("Host", host), ("Authorization", f"Bearer {daemon.token}")])
    assert status in (400, 403), (host, status)


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.1:8765", "localhost:1", "[::1]:8765", "[::1]"])
def test_loopback_hosts_still_pass(daemon: Daemon, host: str) -> None:
    assert raw_get(daemon, [("Host", host), ("Authorization", f"Bearer {daemon.token}")])[0] == 200


def test_failed_handshakes_are_logged_in_aggregate(tmp_path: Any) -> None:
    d = spawn(tmp_path, args=["--engine", FAKE_ENGINE])
    assert isinstance(d, Daemon)
    try:
        for _ in range(60):
            assert raw_get(d, [("Host", "127.0.0.1"), ("Authorization", "Bearer wrong")])[0] == 401
        log = d.stderr()
    finally:
        d.stop()
    assert log.count("refused a handshake: no valid token") == 1, log
    assert "refused 59 more handshake(s): no valid token" in d.stderr()   # flushed at shutdown


# --------------------------------------------------------------------------
# Sharing the worker
# --------------------------------------------------------------------------


async def _send(ws: Any, rid: str, prefix: str, **fields: Any) -> None:
    await ws.send(json.dumps({"type": "complete", "id": rid, "prefix": prefix, "suffix": "",
                              "uri": f"file:///w/{rid}.py", **fields}))


async def _wait(predicate: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not await asyncio.to_thread(predicate):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.02)


async def _ends(ws: Any, count: int, log: list[tuple[float, str, str]], timeout: float = 60) -> None:
    async with asyncio.timeout(timeout):
        seen = 0
        while seen < count:
            frame = json.loads(await ws.recv())
            if frame["type"] in ("done", "error"):
                log.append((time.monotonic(), frame["id"], frame.get("finish_reason") or frame.get("code")))
                seen += 1


@pytest.mark.asyncio
@pytest.mark.parametrize("greedy_priority", ["normal", "high"])
async def test_round_robin_between_connections(daemon: Daemon, greedy_priority: str) -> None:
    """A connection with 12 queued requests and one with 1, same priority
    (or the greedy one claiming ``high`` for all): the lone request waits for
    a few of the greedy one's, not all twelve. The first greedy request is
    held on the worker until all thirteen are in: the order is the queue's
    alone, not how many greedy requests a busy machine finished first."""
    ends: list[tuple[float, str, str]] = []
    gate = Gate(Path(daemon.env[GATE_ENV]))
    first = f"g0-{greedy_priority}"
    async with await daemon.connect() as greedy, await daemon.connect() as light:
        await _send(greedy, first, "!hold !slow greedy", max_tokens=4, priority=greedy_priority)
        await _wait(lambda: first in gate.held(), "the first greedy request held on the worker")
        for i in range(1, 12):
            await _send(greedy, f"g{i}", "!slow greedy", max_tokens=4, priority=greedy_priority)
        await _send(light, "light", "!slow light", max_tokens=4)
        await _wait(lambda: daemon.health()["load"]["queue_depth"] == 12, "11 greedy + 1 light queued")
        gate.release(first)
        await asyncio.gather(_ends(greedy, 12, ends), _ends(light, 1, ends))
    order = [rid for _, rid, _ in sorted(ends)]
    before = order.index("light")
    print(f"\n[figure] fair queue ({greedy_priority}): the light request ended after {before} of 12 greedy ones")
    assert before <= (3 if greedy_priority == "normal" else 4), order
    assert all(reason == "length" for _, _, reason in ends)


@pytest.mark.asyncio
async def test_one_client_cannot_fill_the_daemon(daemon: Daemon) -> None:
    """8 connections × 32 requests was the whole daemon-wide limit; now a
    greedy client is refused past its share and a newcomer gets in."""
    conns = [await daemon.connect() for _ in range(8)]
    try:
        busy = 0
        for c, ws in enumerate(conns):
            for i in range(32):
                await _send(ws, f"c{c}-{i}", "!slow fill", max_tokens=2000)
        deadline = time.monotonic() + 30              # busy errors come at once: read until one came
        while not busy and time.monotonic() < deadline:
            for ws in conns:
                try:
                    frame = json.loads(await asyncio.wait_for(ws.recv(), 0.2))
                except TimeoutError:
                    continue
                busy += frame.get("code") == "busy"
        assert busy > 0
        async with await daemon.connect() as newcomer:
            await _send(newcomer, "new", "!slow newcomer", max_tokens=2000)
            await asyncio.sleep(0.3)
            await newcomer.send(json.dumps({"type": "cancel", "id": "new"}))
            async with asyncio.timeout(10):
                while True:
                    frame = json.loads(await newcomer.recv())
                    if frame.get("id") == "new":
                        break
        assert frame["type"] == "done" and frame["finish_reason"] == "cancelled", frame   # it was admitted
    finally:
        for ws in conns:
            await ws.close()
    deadline = time.monotonic() + 20
    while daemon.health()["load"]["in_flight"] and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    assert daemon.health()["load"]["in_flight"] == 0


# --------------------------------------------------------------------------
# Type-through is keyed by the full prompt inputs
# --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_type_through_never_crosses_context(start_daemon: Any, engine_args: list[str]) -> None:
    """Another connection typing the same prefix with other context must not
    be answered from this one's completion (made from this one's context)."""
    d = start_daemon(args=engine_args)
    prefix = "def add(a, b):\n    return "
    mine = [{"uri": "file:///w/private.py", "text": "SECRET_VALUE = 'a1b2c3'\n"}]
    theirs = [{"uri": "file:///w/other.py", "text": "def sub(a, b):\n    return a - b\n"}]
    async with await d.connect() as a, await d.connect() as b:
        for uri, client, context in (("file:///w/x.py", b, theirs), ("file:///w/y.py", a, mine)):
            _, first = await complete(a, f"first {uri}", prefix, uri=uri, context=mine, max_tokens=8)
            text = first.items[0]
            assert len(text) >= 2, text
            _, typed = await complete(client, f"typed {uri}", prefix + text[0], uri=uri, context=context,
                                      max_tokens=8)
            if client is b:
                other = typed
            else:
                same = typed
    assert same.timings.source == "type-through"          # the same inputs: answered from it
    assert other.timings.source != "type-through"
