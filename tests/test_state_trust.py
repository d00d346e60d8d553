"""The state directory and ``daemon.json`` are trusted only when nobody
else could have written them. The attack: with a world-writable state
directory another user plants a ``daemon.json`` naming their port and a
private file of ours as the token file; ``soldaemon status`` then sends the
file's contents to them as a Bearer token. Real ``soldaemon`` processes,
a real listener standing in for the attacker."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import pytest

from soldaemon import discovery
from soldaemon.discovery import read_token
from soldaemon.server import statefiles
from soldaemon.errors import ConfigError
from tests.fixtures.daemon import FAKE_ENGINE, REPO, daemon_command, spawn

SECRET = "s3cret-file-contents-that-look-like-a-token-xyz"


class Listener:
    """A loopback TCP server that records what the first client sends."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.received = b""
        self.sock.settimeout(15)
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:
            return
        with conn:
            conn.settimeout(5)
            try:
                self.received = conn.recv(65536)
            except OSError:
                pass

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(scope="module", autouse=True)
def daemon_pid() -> Iterator[int]:
    """A live process of ours whose command line is a daemon's (``… soldaemon serve``):
    a planted record names it, so it is judged by what else it says."""
    global DAEMON_PID
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "soldaemon", "serve"])
    DAEMON_PID = proc.pid
    yield proc.pid
    proc.kill()
    proc.wait()


DAEMON_PID = 0


def _plant(state: Path, url: str, token_file: Path, *, dir_mode: int = 0o777, file_mode: int = 0o644) -> None:
    state.mkdir(parents=True, exist_ok=True)
    os.chmod(state, dir_mode)
    record = state / "daemon.json"
    record.write_text(json.dumps({"pid": DAEMON_PID, "url": url, "token_file": str(token_file)}))
    os.chmod(record, file_mode)


def _status(state: Path, tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update({"SOLDAEMON_STATE_DIR": str(state), "PYTHONPATH": str(REPO)})
    config = tmp / "sol_config.yaml"
    config.write_text("server: {host: 127.0.0.1, port: 1}\n")
    return subprocess.run([*daemon_command(), "--config", str(config), "status", "--timeout", "3"], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "private" / "notes.txt"
    path.parent.mkdir()
    path.write_text(SECRET + "\n")
    os.chmod(path, 0o600)
    return path


def test_status_does_not_trust_a_world_writable_state_dir(tmp_path: Path, secret: Path) -> None:
    attacker = Listener()
    try:
        state = tmp_path / "state"
        _plant(state, f"ws://127.0.0.1:{attacker.port}", secret)
        out = _status(state, tmp_path)
    finally:
        attacker.close()
    assert SECRET.encode() not in attacker.received
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "writable by other users" in out.stderr and f"chmod go-w {state}" in out.stderr


def test_a_writable_record_in_a_private_dir_is_refused(tmp_path: Path, secret: Path) -> None:
    state = tmp_path / "state"
    _plant(state, "ws://127.0.0.1:9", secret, dir_mode=0o700, file_mode=0o666)
    out = _status(state, tmp_path)
    assert out.returncode == 2 and "daemon record" in out.stderr and "chmod go-w" in out.stderr, out.stderr


def test_a_remote_url_in_the_record_needs_allow_remote(tmp_path: Path, secret: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    state = tmp_path / "state"
    _plant(state, "ws://203.0.113.7:8765", secret, dir_mode=0o700, file_mode=0o600)
    out = _status(state, tmp_path)
    assert out.returncode == 2 and "not a loopback address" in out.stderr, out.stderr
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    record = discovery.read_daemon_record(allow_remote=True)
    assert record is not None and record.url == "ws://203.0.113.7:8765"


def test_serve_refuses_a_world_writable_state_dir(tmp_path: Path) -> None:
    state = tmp_path / "d" / "state"
    state.mkdir(parents=True)
    os.chmod(state, 0o777)
    out = spawn(tmp_path / "d", args=["--engine", FAKE_ENGINE], expect_ready=False, ready_timeout=60)
    assert isinstance(out, subprocess.CompletedProcess)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert "writable by other users" in out.stderr and "chmod go-w" in out.stderr
    assert not (state / "token").exists() and "Traceback" not in out.stderr


def test_the_record_is_written_through_a_fresh_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A planted symlink at ``daemon.json`` is replaced, its target untouched."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (state / "daemon.json").symlink_to(victim)
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    path = statefiles.write_daemon_record("ws://127.0.0.1:1", tmp_path / "token")
    assert victim.read_text() == "keep me\n"
    assert not path.is_symlink() and oct(path.stat().st_mode & 0o777) == "0o600"
    assert json.loads(path.read_text())["pid"] == os.getpid()
    assert [p.name for p in state.iterdir()] == ["daemon.json"]     # no temporary file left


def test_a_private_key_is_never_read_as_a_token(tmp_path: Path) -> None:
    key = tmp_path / "id_ed25519"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
                   "-----END OPENSSH PRIVATE KEY-----\n")
    os.chmod(key, 0o600)
    with pytest.raises(ConfigError, match="no valid token"):
        read_token(key)


@pytest.mark.parametrize("dir_mode", [0o777, 0o700])
def test_sol_lsp_never_follows_a_planted_daemon_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    dir_mode: int) -> None:
    """sol-lsp's launcher appends the daemon's output to ``daemon.log`` in
    the state dir: a planted link there must not make it write elsewhere."""
    from lsp.launcher import DaemonLauncher

    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, dir_mode)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (state / "daemon.log").symlink_to(victim)
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    marker = tmp_path / "ran"
    launcher = DaemonLauncher(["sh", "-c", f"echo ran > {marker}; echo output"])
    assert launcher.start() is False
    assert launcher.error is not None and victim.read_text() == "keep me\n" and not marker.exists()


def test_a_state_dir_others_can_read_is_tightened(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Issue 57, finding 9: a state directory of mode 0755 would let every
    local user read the rotated ``daemon.log`` and ``doctor.txt``."""
    state = tmp_path / "state"
    state.mkdir()
    os.chmod(state, 0o755)
    with caplog.at_level("WARNING"):
        statefiles.ensure_state_dir(state)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert "readable by other users (mode 755); it is now mode 700" in caplog.text
