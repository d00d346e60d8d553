"""A daemon's lifetime when editors start it: it exits by itself after
``--idle-exit-s`` without a connection (and not while one is open), and
the start lock lets one starter through at a time."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest

from lsp.launcher import DaemonLauncher
from soldaemon.discovery import StartLock
from tests.fixtures.daemon import FAKE_ENGINE, Daemon


@pytest.mark.asyncio
async def test_the_daemon_exits_after_idle_exit_s_without_a_connection(start_daemon: Any) -> None:
    d: Daemon = start_daemon(args=["--engine", FAKE_ENGINE, "--idle-exit-s", "1"])
    ws = await d.connect()
    await asyncio.sleep(2.0)                     # connected: it stays
    assert d.proc.poll() is None
    t0 = time.monotonic()                        # before the close: the daemon cannot have seen it yet
    await ws.close()
    while d.proc.poll() is None and time.monotonic() - t0 < 20:
        await asyncio.sleep(0.1)
    assert d.proc.returncode == 0, d.stderr()[-2000:]           # a graceful exit, as on SIGTERM
    assert time.monotonic() - t0 >= 0.9
    assert "server.idle_exit_s" in d.stderr()
    assert not (d.state_dir / "daemon.json").exists()


def test_one_starter_at_a_time(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    first, second = StartLock(), StartLock()
    assert first.acquire() and not second.acquire() and second.busy() and not first.busy()
    marker = tmp_path / "ran"
    launcher = DaemonLauncher(["sh", "-c", f"touch {marker}"], lock=second)
    assert launcher.start() is False and launcher.other_starting     # another window is starting one
    first.release()
    assert launcher.start() is True and launcher.proc is not None
    launcher.proc.wait(10)
    assert marker.exists()
    launcher.check()                                                 # it exited: the lock is let go
    assert not StartLock().busy()
