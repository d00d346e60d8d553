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

import pytest

from lsp.discovery import resolve_target
from lsp.settings import Settings
from soldaemon.config import config_from_dict
from soldaemon.discovery import Fallback, find_daemon
from soldaemon.errors import ConfigError, Unavailable
from soldaemon.server.auth import load_or_create_token

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    directory = tmp_path / "state"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(directory))
    load_or_create_token(directory / "token")
    return directory


def _record(state: Path, url: str) -> None:
    (state / "daemon.json").write_text(json.dumps({"pid": os.getpid(), "url": url,
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
    assert (target.url, target.pid, target.token_path) == ("ws://127.0.0.1:9999", os.getpid(), state / "token")


def test_sol_lsp_settings_name_the_daemon_and_its_token(state: Path, tmp_path: Path) -> None:
    other = tmp_path / "other-token"
    load_or_create_token(other)
    target = resolve_target(Settings(url="ws://127.0.0.1:7", token_file=other))
    assert (target.url, target.token_path, target.source) == ("ws://127.0.0.1:7", other, "settings")
    assert resolve_target(Settings(url="ws://127.0.0.1:7")).token_path == state / "token"


def test_status_falls_back_to_the_configs_address(state: Path, tmp_path: Path) -> None:
    token = tmp_path / "my-token"
    load_or_create_token(token)
    server = config_from_dict({"server": {"host": "::1", "port": 4567, "token_file": str(token)}}).server
    target = find_daemon(server.fallback())
    assert (target.url, target.token_path, target.source) == ("ws://[::1]:4567", token, "sol_config.yaml")
    _record(state, "ws://127.0.0.1:9999")           # a record wins over the config
    assert find_daemon(server.fallback()).url == "ws://127.0.0.1:9999"


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
