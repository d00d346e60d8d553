"""A token goes only to our own daemon (issue 57, finding 6). The attack:
while the daemon is down any local user can listen on its configured port;
a client that falls back to that port sends them ``Authorization: Bearer
<token>``, and ``soldaemon stop`` signals whatever pid they report. Real
``soldaemon`` processes; a loopback listener stands in for the attacker."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest

from soldaemon import discovery
from soldaemon.api import CompletionRequest
from soldaemon.config import config_from_dict
from soldaemon.errors import Unavailable
from soldaemon.server.auth import load_or_create_token
from tests.fixtures.daemon import FAKE_ENGINE, REPO, daemon_command


class Listener:
    """A loopback TCP server that records every connection and what it sends."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.received = b""
        self.sock.settimeout(0.2)
        self.running = True
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()

    def _accept(self) -> None:
        while self.running:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            with conn:
                conn.settimeout(2)
                try:
                    self.received += conn.recv(65536)
                except OSError:
                    pass

    def close(self) -> None:
        self.running = False
        self.thread.join(2)
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    yield server
    server.close()


@pytest.fixture
def state(tmp_path: Path) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    load_or_create_token(directory / "token")
    return directory


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process of ours that is not a daemon (a reused pid)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield proc
    proc.kill()
    proc.wait()


def _run(state: Path, tmp: Path, port: int, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({"SOLDAEMON_STATE_DIR": str(state), "PYTHONPATH": str(REPO)})
    config = tmp / "sol_config.yaml"
    config.write_text(f"server: {{host: 127.0.0.1, port: {port}}}\n")
    return subprocess.run([*daemon_command(), "--config", str(config), *args], cwd=tmp, env=env,
                          capture_output=True, text=True, timeout=120)


def _plant(state: Path, pid: int, port: int) -> None:
    record = state / "daemon.json"
    record.write_text(json.dumps({"pid": pid, "url": f"ws://127.0.0.1:{port}", "token_file": str(state / "token")}))
    os.chmod(record, 0o600)


@pytest.mark.parametrize("command", [("status", "--timeout", "3"), ("stop", "--timeout", "3")])
def test_no_record_no_daemon_nothing_sent(tmp_path: Path, state: Path, listener: Listener,
                                          command: tuple[str, ...]) -> None:
    done = _run(state, tmp_path, listener.port, *command)
    assert done.returncode == 4, done.stderr
    assert "no daemon running" in done.stderr
    assert listener.connections == 0 and listener.received == b""


def test_doctor_without_a_record_sends_nothing(tmp_path: Path, state: Path, listener: Listener) -> None:
    done = _run(state, tmp_path, listener.port, "doctor", "--json")
    assert listener.connections == 0 and listener.received == b"", done.stdout[-2000:]
    assert "held by another program" in done.stdout


def test_complete_without_a_record_sends_nothing(tmp_path: Path, state: Path, listener: Listener,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from soldaemon.cli import _complete_on_daemon

    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    config = config_from_dict({"server": {"host": "127.0.0.1", "port": listener.port}})
    req = CompletionRequest(id="c", prefix="x = ", suffix="\n", uri=(tmp_path / "a.py").as_uri())
    assert _complete_on_daemon(config, req, lambda ev: None) is None
    assert listener.connections == 0 and listener.received == b""


def test_a_record_naming_a_process_that_is_no_daemon_is_stale(tmp_path: Path, state: Path, listener: Listener,
                                                             bystander: subprocess.Popen[bytes]) -> None:
    """The record's pid was reused by a process of ours that is no daemon:
    no daemon runs, nothing is sent, and the bystander is not signalled."""
    _plant(state, bystander.pid, listener.port)
    done = _run(state, tmp_path, listener.port, "stop", "--timeout", "3")
    assert done.returncode == 4 and "no daemon running" in done.stderr, done.stderr
    assert listener.connections == 0 and bystander.poll() is None


def test_another_users_pid_is_not_alive_and_ours(state: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """pid 1 (init: another user's, EPERM, where the tests do not run as
    root) is not "alive and ours"; another uid is not either
    (``test_what_counts_as_our_daemon``)."""
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    _plant(state, 1, 9)
    assert discovery.read_daemon_record() is None
    assert not discovery.is_our_daemon(1)


def test_stop_never_signals_a_pid_the_listener_names(tmp_path: Path, state: Path,
                                                     bystander: subprocess.Popen[bytes],
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """With ``--url`` naming a server that answers health with a foreign
    pid (here: one of ours that is no daemon), nothing is signalled."""
    from websockets.asyncio.server import serve

    from soldaemon.protocol import Status, encode_server
    from soldaemon.client.commands import stop_daemon

    async def handler(ws: Any) -> None:
        async for _msg in ws:
            await ws.send(encode_server(Status("health", {"daemon": "0.1", "state": "ready",
                                                          "process": {"pid": bystander.pid}}, id="status")))

    async def scenario() -> BaseException | None:
        async with serve(handler, "127.0.0.1", 0) as server:
            port = server.sockets[0].getsockname()[1]
            try:
                await asyncio.to_thread(stop_daemon, config_from_dict({}), url=f"ws://127.0.0.1:{port}", timeout=3)
            except Unavailable as exc:
                return exc
        return None

    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    refused = asyncio.run(scenario())
    assert refused is not None and "not a soldaemon of this user" in str(refused)
    assert bystander.poll() is None


def test_a_real_daemons_pid_is_ours(start_daemon: Any) -> None:
    daemon = start_daemon(args=["--engine", FAKE_ENGINE])
    assert discovery.is_our_daemon(daemon.proc.pid)


@pytest.mark.parametrize("argv,ours", [
    (["/venv/bin/python", "/venv/bin/soldaemon", "serve"], True),
    (["/venv/bin/python", "-I", "-m", "soldaemon.cli", "--config", "/c.yaml", "serve", "--idle-exit-s", "0"], True),
    (["python3", "-c", "import sys; from soldaemon.cli import main; sys.exit(main())", "serve"], True),
    (["/venv/bin/python", "/venv/bin/soldaemon", "status"], False),
    (["/home/me/soldaemon/.venv/bin/python", "-m", "http.server", "serve"], False),
    (["/usr/bin/sleep", "600"], False),
])
def test_what_counts_as_our_daemon(monkeypatch: pytest.MonkeyPatch, argv: list[str], ours: bool) -> None:
    monkeypatch.setattr(discovery, "_process", lambda pid: (os.getuid(), argv))
    assert discovery.is_our_daemon(4242) is ours
    monkeypatch.setattr(discovery, "_process", lambda pid: (os.getuid() + 1, argv))
    assert not discovery.is_our_daemon(4242)


def test_complete_through_a_daemon_follows_the_secret_rule(tmp_path: Path, state: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """``soldaemon complete`` sends a daemon what sol-lsp would: secrets
    redacted, nothing of a secret file."""
    from websockets.asyncio.server import serve

    from soldaemon.cli import _complete_on_daemon
    from soldaemon.privacy.rules import SecretDocument
    from soldaemon.protocol import ErrorFrame, encode_server

    frames: list[str] = []

    async def handler(ws: Any) -> None:
        async for msg in ws:
            frames.append(str(msg))
            await ws.send(encode_server(ErrorFrame("c", "unavailable", "loading")))

    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "soldaemon", "serve"])
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    config = config_from_dict({})
    key = "AKIAIOSFODNN7EXAMPLE"
    secret = CompletionRequest(id="c", prefix=f"aws = '{key}'\nx = ", suffix="\n", uri=(tmp_path / "a.py").as_uri())

    async def scenario() -> None:
        async with serve(handler, "127.0.0.1", 0) as server:
            _plant(state, fake.pid, server.sockets[0].getsockname()[1])
            assert await asyncio.to_thread(_complete_on_daemon, config, secret, lambda ev: None) is None
            with pytest.raises(SecretDocument):
                env_file = CompletionRequest(id="c", prefix="A=", suffix="", uri=(tmp_path / ".env").as_uri())
                await asyncio.to_thread(_complete_on_daemon, config, env_file, lambda ev: None)

    try:
        asyncio.run(scenario())
    finally:
        fake.kill()
        fake.wait()
    assert len(frames) == 1 and key not in frames[0] and "<redacted>" in frames[0]
