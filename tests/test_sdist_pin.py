"""The bench's llama-cpp-python sdist is pinned by sha256 (issue 57,
finding 9): pip is asked with ``--require-hashes`` (it refuses another file
before running any of its code), and a file of another hash is refused and
removed."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from soldaemon_bench.quality import llama_server_build as build


def test_a_fetched_sdist_of_another_hash_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[list[str]] = []

    def fake_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        asked.append(cmd)
        if "-r" in cmd:
            assert f"--hash=sha256:{build.SDIST_SHA256}" in Path(cmd[cmd.index("-r") + 1]).read_text()
        Path(cmd[cmd.index("-d") + 1], build.SDIST_NAME).write_bytes(b"a tampered sdist")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(build.subprocess, "run", fake_pip)
    with pytest.raises(build.BuildError, match="not the pinned"):
        build.fetch_sdist(tmp_path)
    assert "--require-hashes" in asked[0]
    assert not (tmp_path / "sdist" / build.SDIST_NAME).exists()
