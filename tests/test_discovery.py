"""Finding the daemon (soldaemon/discovery.py): the daemon's record first,
then the caller's fallback. ``soldaemon status`` passes its config's address;
sol-lsp passes none and reads no config, so without a record it finds no
daemon instead of sending our token to whatever holds the configured port."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from lsp.launcher import resolve_target
from lsp.settings import Settings
from soldaemon.config import config_from_dict
from soldaemon.discovery import Fallback, find_daemon
from soldaemon.errors import ConfigError, Unavailable
from soldaemon.server.auth import load_or_create_token

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def daemon_pid() -> Iterator[int]:
    """A live process of ours whose command line is a daemon's (``… soldaemon serve``)."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "soldaemon", "serve"])
    yield proc.pid
    proc.kill()
    proc.wait()


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, daemon_pid: int) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(directory))
    load_or_create_token(directory / "token")
    monkeypatch.setattr(sys.modules[__name__], "DAEMON_PID", daemon_pid)
    return directory


DAEMON_PID = 0


def _record(state: Path, url: str) -> None:
    (state / "daemon.json").write_text(json.dumps({"pid": DAEMON_PID, "url": url,
                                                   "token_file": str(state / "token")}))
    os.chmod(state / "daemon.json", 0o600)


def test_sol_lsp_without_a_record_finds_no_daemon_whatever_the_config_says(state: Path, tmp_path: Path) -> None:
    """A config naming a port (and a token file that exists) is not an
    address for sol-lsp: only the record of a daemon that is ready is."""
    config = tmp_path / "sol_config.yaml"
    config.write_text("server: {host: 127.0.0.1, port: 4567}\n")
    with pytest.raises(Unavailable) as info:
        resolve_target(Settings(config=str(config)))
    assert "daemon.json" in info.value.message
    _record(state, "ws://127.0.0.1:9999")
    target = resolve_target(Settings(config=str(config)))
    assert (target.url, target.pid, target.token_path) == ("ws://127.0.0.1:9999", DAEMON_PID, state / "token")


def test_sol_lsp_settings_name_the_daemon_and_its_token(state: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-token"
    load_or_create_token(other)
    target = resolve_target(Settings(url="ws://127.0.0.1:7", token_file=other))
    assert (target.url, target.token_path, target.source) == ("ws://127.0.0.1:7", other, "settings")
    assert resolve_target(Settings(url="ws://127.0.0.1:7")).token_path == state / "token"


def test_status_never_falls_back_to_the_configs_address(state: Path, tmp_path: Path) -> None:
    """Whatever listens on the configured port while the daemon is down is
    not sent the token: without a record, no daemon runs."""
    token = tmp_path / "my-token"
    load_or_create_token(token)
    server = config_from_dict({"server": {"host": "::1", "port": 4567, "token_file": str(token)}}).server
    with pytest.raises(Unavailable, match="no daemon running"):
        find_daemon(server.fallback())
    _record(state, "ws://127.0.0.1:9999")
    target = find_daemon(server.fallback())
    assert (target.url, target.token_path) == ("ws://127.0.0.1:9999", state / "token")   # the record's token file


def test_a_remote_record_needs_the_callers_allow_remote(state: Path) -> None:
    _record(state, "ws://203.0.113.7:8765")
    with pytest.raises(ConfigError, match="not a loopback address"):
        find_daemon(Fallback())
    assert find_daemon(Fallback(allow_remote=True)).url == "ws://203.0.113.7:8765"


def test_importing_discovery_loads_no_config_reader() -> None:
    code = ("import sys, soldaemon.discovery\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('soldaemon', 'yaml')))\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["['soldaemon',", "'soldaemon.discovery',", "'soldaemon.errors',",
                                   "'soldaemon.paths']"]
