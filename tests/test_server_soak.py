"""Bounded soak against a real daemon: 2,000 requests over 8 concurrent
connections, about half of them cancelled or superseded. Every request ends
in exactly one done or error; afterwards no work, connection or task is left
behind, and the daemon's RSS grew by less than 50 MB. Figures are printed."""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from typing import Any, Iterator

import psutil
import pytest

from tests.fixtures.daemon import Daemon, complete, spawn
from tests.fixtures.gate import ENV as GATE_ENV

CONNECTIONS = 8
REQUESTS_PER_CONNECTION = 250
PROMPTS = [
    ("def add(a, b):\n    return ", "\n"),
    ("import os\n\ndef list_files(path):\n    ", "\n"),
    ("class Point:\n    def __init__(self, x, y):\n        self.x = x\n        ", "\n"),
    ("for i in range(10):\n    print(", ")\n"),
    ("# naïve café — ünïcode\nname = ", "\n"),
]

@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[Daemon]:
    """The real engine on the tiny model; requests whose id starts ``held-``
    wait on the worker until cancelled (tests/fixtures/held_engine.py): a
    request to be cancelled or superseded cannot finish first, however fast
    the model is, so every outcome below is decided by the client."""
    tmp = tmp_path_factory.mktemp("soak")
    d = spawn(tmp, args=[*engine_args, "--engine", "tests.fixtures.held_engine:make_engine", "--log-level", "warning"],
              server={"rate_limit_per_s": 100_000}, env={GATE_ENV: str(tmp / "gate")})
    assert isinstance(d, Daemon)
    yield d
    d.stop()


class Ledger:
    """Every request sent, and how it ended (exactly once)."""

    def __init__(self) -> None:
        self.sent: dict[str, str] = {}       # id -> what we did to it
        self.ended: dict[str, dict[str, Any]] = {}
        self.outcomes: Counter[str] = Counter()
        self.late_cancels = 0                # cancels answered unknown_id: the request had ended

    def end(self, frame: dict[str, Any]) -> None:
        rid = frame["id"]
        assert rid in self.sent, f"an end for a request never sent: {frame}"
        assert rid not in self.ended, f"{rid} ended twice"
        self.ended[rid] = frame
        outcome = frame.get("finish_reason") or f"error:{frame.get('code')}"
        self.outcomes[f"{self.sent[rid]}→{outcome}"] += 1


async def run_connection(daemon: Daemon, cid: int, ledger: Ledger) -> None:
    rng = random.Random(cid)
    async with await daemon.connect() as ws:
        waiting: set[str] = set()

        async def pump() -> None:
            """Read until every request in ``waiting`` has ended."""
            async with asyncio.timeout(120):
                while waiting:
                    frame = json.loads(await ws.recv())
                    rid = frame.get("id")
                    if frame["type"] == "error" and frame["code"] == "unknown_id":
                        # the answer to a cancel that lost the race with the done (never a request's end)
                        assert rid in ledger.ended, frame
                        ledger.late_cancels += 1
                    elif frame["type"] in ("done", "error") and rid in ledger.sent:
                        ledger.end(frame)
                        waiting.discard(rid)
                    elif frame["type"] == "delta":
                        assert rid in waiting, f"a delta after the end of {rid}"

        async def send(rid: str, what: str, uri: str) -> None:
            prefix, suffix = rng.choice(PROMPTS)
            ledger.sent[rid] = what
            waiting.add(rid)
            await ws.send(json.dumps({"type": "complete", "id": rid, "uri": uri, "prefix": prefix,
                                      "suffix": suffix, "max_tokens": rng.randint(1, 4)}))

        n = 0
        while n < REQUESTS_PER_CONNECTION:
            r = rng.random()
            uri = f"file:///soak/{cid}/{rng.randint(0, 3)}.py"
            if r < 0.35 or n == REQUESTS_PER_CONNECTION - 1:
                await send(f"{cid}-{n}", "plain", uri)
                n += 1
            elif r < 0.70:
                rid = f"held-{cid}-{n}"                   # held until the cancel comes
                await send(rid, "cancel", uri)
                n += 1
                await asyncio.sleep(rng.random() * 0.005)
                await ws.send(json.dumps({"type": "cancel", "id": rid}))
            else:
                await send(f"held-{cid}-{n}", "superseded", uri)   # held until superseded
                await send(f"{cid}-{n + 1}", "superseder", uri)
                n += 2
            await pump()


@pytest.mark.asyncio
async def test_soak_2000_requests_8_connections(daemon: Daemon) -> None:
    proc = psutil.Process(daemon.pid)
    async with await daemon.connect() as ws:  # warm every code path once before the baseline
        for i in range(20):
            await complete(ws, f"warm-{i}", PROMPTS[i % len(PROMPTS)][0], max_tokens=4)
    await asyncio.sleep(0.5)
    base_health = daemon.health()
    rss0, threads0, fds0 = proc.memory_info().rss, proc.num_threads(), proc.num_fds()

    ledger = Ledger()
    t0 = time.perf_counter()
    await asyncio.gather(*(run_connection(daemon, cid, ledger) for cid in range(CONNECTIONS)))
    elapsed = time.perf_counter() - t0

    t_wait = time.perf_counter()
    while daemon.health()["load"]["connections"] and time.perf_counter() - t_wait < 10:
        await asyncio.sleep(0.05)
    health = daemon.health()
    rss1, threads1, fds1 = proc.memory_info().rss, proc.num_threads(), proc.num_fds()
    growth_mb = (rss1 - rss0) / 2**20
    stopped = sum(v for k, v in ledger.outcomes.items() if k.endswith(("→cancelled", "→superseded")))
    print(f"\n[figure] soak: {len(ledger.sent)} requests over {CONNECTIONS} connections in {elapsed:.1f} s "
          f"({len(ledger.sent) / elapsed:.0f} req/s); {stopped} ended cancelled/superseded "
          f"({100 * stopped / len(ledger.sent):.0f}%); outcomes: "
          + ", ".join(f"{k}={v}" for k, v in sorted(ledger.outcomes.items()))
          + f"; cancels too late: {ledger.late_cancels}"
          + f"\n[figure] soak: RSS {rss0 / 2**20:.1f} → {rss1 / 2**20:.1f} MB (growth {growth_mb:+.1f} MB); "
          f"threads {threads0} → {threads1}; fds {fds0} → {fds1}; "
          f"asyncio tasks {base_health['process']['tasks']} → {health['process']['tasks']}")

    assert len(ledger.sent) == CONNECTIONS * REQUESTS_PER_CONNECTION
    assert set(ledger.ended) == set(ledger.sent)  # every request ended, exactly once
    assert all(f["type"] == "done" for f in ledger.ended.values()), "no request should fail"
    assert stopped >= 0.4 * len(ledger.sent)
    assert all(ledger.ended[r]["finish_reason"] == "superseded"
               for r, what in ledger.sent.items() if what == "superseded")
    assert health["load"] == {"queue_depth": 0, "in_flight": 0, "connections": 0}
    assert health["process"]["tasks"] == base_health["process"]["tasks"]  # no leaked tasks
    assert threads1 == threads0 and fds1 <= fds0 + 2
    assert growth_mb < 50
    assert daemon.metric("sol_requests_total") >= len(ledger.sent)


@pytest.mark.asyncio
async def test_slow_reader_is_closed_by_bytes_and_its_memory_returns(daemon: Daemon) -> None:
    """Three clients ask for 15,000 health documents each (~1.5 KB apiece)
    and never read. Under the old frame cap (20,000) they stayed open,
    pinning tens of MB each; the byte cap (8 MiB unread) closes them, and
    the daemon's RSS comes back once they are gone."""
    from websockets.asyncio.client import connect

    proc = psutil.Process(daemon.pid)
    rss0 = proc.memory_info().rss
    frame = json.dumps({"type": "health", "id": "h"})
    clients = [await connect(daemon.url, additional_headers=daemon.auth(), proxy=None, compression=None,
                             max_queue=1, max_size=None) for _ in range(3)]
    peak = rss0
    try:
        for ws in clients:
            for _ in range(15_000):
                await ws.send(frame)
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 60:
            peak = max(peak, proc.memory_info().rss)
            if daemon.stderr().count("is not reading its frames") >= 3:
                break
            await asyncio.sleep(0.1)
        closed_after = time.perf_counter() - t0
    finally:
        for ws in clients:
            ws.transport.abort()                       # the slow clients vanish
    t_wait = time.perf_counter()
    while time.perf_counter() - t_wait < 60:
        try:
            if not daemon.health()["load"]["connections"]:
                break
        except OSError:     # /healthz waits behind the frames the slow readers left (a busy machine: > 10 s)
            pass
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)
    rss1 = proc.memory_info().rss
    print(f"\n[figure] slow readers: 3 × 15,000 unread health frames; closed after {closed_after:.1f} s; "
          f"RSS {rss0 / 2**20:.1f} MB before → {peak / 2**20:.1f} MB peak → {rss1 / 2**20:.1f} MB after close")
    assert daemon.stderr().count("is not reading its frames") >= 3
    assert daemon.health()["load"]["connections"] == 0
    assert (rss1 - rss0) / 2**20 < 20
