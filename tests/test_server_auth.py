"""The token file and the handshake checks (pure; no server)."""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from soldaemon.server.auth import (
    bearer_ok,
    check_bind,
    host_header_ok,
    load_or_create_token,
    origin_ok,
)
from soldaemon.discovery import read_token
from soldaemon.errors import ConfigError, Unavailable


def test_token_is_created_private_and_stable(tmp_path: Path) -> None:
    path = tmp_path / "state" / "token"
    token = load_or_create_token(path)
    assert len(token) >= 43
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert load_or_create_token(path) == token == read_token(path)
    assert [p.name for p in path.parent.iterdir()] == ["token"]  # no temp files left


def test_tokens_differ_per_file(tmp_path: Path) -> None:
    assert load_or_create_token(tmp_path / "a") != load_or_create_token(tmp_path / "b")


def test_concurrent_creation_agrees_on_one_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    results: list[str] = []
    threads = [threading.Thread(target=lambda: results.append(load_or_create_token(path))) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(results)) == 1 and len(results) == 16


def test_token_file_readable_by_others_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "token"
    load_or_create_token(path)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError) as info:
        load_or_create_token(path)
    assert "chmod 600" in (info.value.hint or "")


def test_symlinked_or_empty_token_file_is_refused(tmp_path: Path) -> None:
    real = tmp_path / "real"
    load_or_create_token(real)
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError):
        load_or_create_token(link)
    empty = tmp_path / "empty"
    empty.touch(mode=0o600)
    with pytest.raises(ConfigError):
        load_or_create_token(empty)


def test_read_token_without_a_daemon(tmp_path: Path) -> None:
    with pytest.raises(Unavailable) as info:
        read_token(tmp_path / "token")
    assert "soldaemon serve" in (info.value.hint or "")


def test_bearer() -> None:
    token = "A" * 43
    assert bearer_ok(f"Bearer {token}", token)
    assert bearer_ok(f"bearer  {token} ", token)
    assert not bearer_ok(None, token)
    assert not bearer_ok("", token)
    assert not bearer_ok(token, token)
    assert not bearer_ok(f"Basic {token}", token)
    assert not bearer_ok("Bearer " + "A" * 42, token)
    assert not bearer_ok("Bearer " + "é" * 43, token)


def test_origin() -> None:
    assert origin_ok(None, ())
    assert not origin_ok("https://evil.example", ())
    assert not origin_ok("null", ())
    assert not origin_ok("http://127.0.0.1:8765", ())
    assert origin_ok("vscode-webview://abc", ("vscode-webview://abc",))
    assert origin_ok("HTTPS://Tool.Example/", ("https://tool.example",))
    assert not origin_ok("https://tool.example.evil", ("https://tool.example",))


def test_host_header() -> None:
    for ok in ("127.0.0.1:8765", "localhost:1", "localhost", "[::1]:8765", "127.0.0.2"):
        assert host_header_ok(ok, True), ok
    for bad in ("evil.example:8765", "evil.example", "", None, "10.0.0.1:80", "localhost.evil.example"):
        assert not host_header_ok(bad, True), bad
    assert host_header_ok("anything", False)


def test_bind() -> None:
    for ok in ("127.0.0.1", "localhost", "::1", "127.0.0.5"):
        check_bind(ok, allow_remote=False)
    for bad in ("0.0.0.0", "::", "192.168.1.10", "example.com"):
        with pytest.raises(ConfigError) as info:
            check_bind(bad, allow_remote=False)
        assert "allow_remote" in (info.value.hint or "")
        check_bind(bad, allow_remote=True)
