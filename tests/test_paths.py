"""soldaemon.paths on Linux: the folders the docs name (``~/.config/soldaemon``,
``~/.cache/soldaemon``, ``~/.local/state/soldaemon``), moved by ``$XDG_*``
and by soldaemon's own overrides."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from soldaemon import paths

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the Linux layout")

VARS = ("XDG_CACHE_HOME", "XDG_STATE_HOME", "XDG_CONFIG_HOME", "SOLDAEMON_CACHE_DIR", "SOLDAEMON_STATE_DIR")


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    return tmp_path


def test_defaults_under_home(home: Path) -> None:
    assert paths.cache_dir() == home / ".cache" / "soldaemon"
    assert paths.state_dir() == home / ".local" / "state" / "soldaemon"
    assert paths.config_home() == home / ".config" / "soldaemon"


def test_xdg_variables_move_each_folder(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "c"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "s"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home / "k"))
    assert (paths.cache_dir(), paths.state_dir(), paths.config_home()) == (
        home / "c" / "soldaemon", home / "s" / "soldaemon", home / "k" / "soldaemon")


def test_soldaemon_overrides_win_over_xdg(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(home / "c"))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "s"))
    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(home / "my-cache"))
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(home / "my-state"))
    assert paths.cache_dir() == home / "my-cache" and paths.state_dir() == home / "my-state"


def test_empty_or_relative_xdg_values_are_ignored(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The XDG spec: a value that is not absolute is invalid and ignored
    (a relative one would move the token with the daemon's working directory)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", "")
    monkeypatch.setenv("XDG_STATE_HOME", "relative/state")
    assert paths.config_home() == home / ".config" / "soldaemon"
    assert paths.state_dir() == home / ".local" / "state" / "soldaemon"


def test_nothing_is_created(home: Path) -> None:
    for folder in (paths.cache_dir(), paths.state_dir(), paths.config_home()):
        assert not folder.exists()

