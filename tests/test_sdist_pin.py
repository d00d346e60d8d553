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


def test_the_functional_bench_fetches_its_sdist_pinned(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The functional holes' project (more-itertools) is fetched the same way:
    pip asked with ``--require-hashes`` and the project's sha256, and an
    archive of another hash refused before it is unpacked."""
    from soldaemon_bench import functional

    project = functional.PROJECTS["more_itertools.more"]
    asked: list[list[str]] = []

    def fake_pip(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        asked.append(cmd)
        pinned = Path(cmd[cmd.index("-r") + 1]).read_text()
        assert f"{project.dist}=={project.version} --hash=sha256:{project.sha256}" in pinned
        Path(cmd[cmd.index("-d") + 1], f"{project.top}.tar.gz").write_bytes(b"a tampered sdist")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setenv("SOLDAEMON_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(functional.subprocess, "run", fake_pip)
    with pytest.raises(FileNotFoundError, match="not the pinned"):
        functional.project_root(project)
    assert "--require-hashes" in asked[0] and "--no-binary" in asked[0]
    assert not (tmp_path / "functional" / project.top).exists()
