"""Speculative FIM through a real ``soldaemon serve`` on the tiny model: the
worker computes the accepted continuation while idle, answers the accepted
request from it, and a request arriving meanwhile waits at most about one
decode step (figures printed)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Callable

import pytest

from tests.fixtures.daemon import Daemon, complete
from tests.fixtures.gate import ENV as GATE_ENV
from tests.fixtures.gate import Gate

HELD_ENGINE = "tests.fixtures.held_engine:make_engine"

PREFIX = "def add(a, b):\n    return "          # the tiny model answers this one with text


@pytest.fixture
def daemon(start_daemon: Any, engine_args: list[str], tmp_path: Path) -> Daemon:
    """The real engine on the tiny model, its speculations noted as they
    begin (tests/fixtures/held_engine.py): the tests wait for events."""
    d: Daemon = start_daemon(args=[*engine_args, "--engine", HELD_ENGINE, "--port", "0"],
                             server={"rate_limit_per_s": 10_000}, env={GATE_ENV: str(tmp_path / "gate")})
    return d


async def until(predicate: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


@pytest.mark.asyncio
async def test_the_accepted_completion_comes_from_the_speculation(daemon: Daemon) -> None:
    async with await daemon.connect() as ws:
        _, shown = await complete(ws, "a", PREFIX, suffix="\n", max_tokens=16, uri="file:///ahead.py")
        item = shown.items[0]
        assert item and shown.finish_reason in ("stop", "length")
        # idle: the worker speculates on accepting `item`; wait until that speculation ended
        await until(lambda: "id=a~ahead" in daemon.stderr(), "the speculation on accepting a to end")
        _, nxt = await complete(ws, "b", PREFIX + item, suffix="\n", max_tokens=16, uri="file:///ahead.py")
    t = nxt.timings
    # "resumed": the speculation was still decoding (a slow machine) and was taken over
    assert t.source in ("speculative", "resumed"), t
    assert t.cached_tokens == t.prompt_tokens > 0
    assert "id=a~ahead" in daemon.stderr()
    print(f"\naccepted completion answered from the speculation ({t.source}): ttft {t.ttft_ms:.1f} ms, "
          f"first completion ttft {shown.timings.ttft_ms:.1f} ms")


@pytest.mark.asyncio
async def test_a_request_waits_about_one_step_for_speculation(daemon: Daemon) -> None:
    async with await daemon.connect() as ws:
        _, long = await complete(ws, "a", "def f(x):\n", suffix="", max_tokens=400, multiline="multi",
                                 uri="file:///long.py")
        lt = long.timings
        assert long.items[0] and lt.generated_tokens > 8
        step_ms = lt.decode_ms / (lt.generated_tokens - 1)
        gate = Gate(Path(daemon.env[GATE_ENV]))
        await until(lambda: "speculating:a" in gate.events(), "the speculation on the long completion to begin")
        _, other = await complete(ws, "c", PREFIX, suffix="\n", max_tokens=4, uri="file:///other.py")
    assert other.finish_reason in ("stop", "length")
    log = daemon.stderr()
    assert "complete id=a~ahead finish=superseded" in log, "the speculation was not running when c came"
    waited = other.timings.queue_ms
    print(f"\nrequest queued {waited:.1f} ms behind a speculation; a decode step {step_ms:.1f} ms")
    # within a step is counted in-process (tests/test_foresight.py); here, against the
    # alternative: c did not wait for the speculation's whole decode (as long as a's)
    assert waited < lt.decode_ms / 2, f"c waited {waited:.0f} ms, a's whole decode took {lt.decode_ms:.0f} ms"
