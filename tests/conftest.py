"""Shared fixtures. Keep this small: helpers live in tests/fixtures/."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest


@pytest.fixture
def start_daemon(tmp_path: Path) -> Iterator[Callable[..., Any]]:
    """``start_daemon(args=[...], server={...}, env={...})`` starts a real
    ``soldaemon serve`` on a free port and returns a tests.fixtures.daemon.Daemon;
    every daemon started is stopped (SIGTERM) at teardown."""
    from tests.fixtures.daemon import Daemon, spawn

    started: list[Daemon] = []

    def start(**kwargs: Any) -> Daemon:
        result = spawn(tmp_path / f"d{len(started)}", **kwargs)
        assert isinstance(result, Daemon)
        started.append(result)
        return result

    yield start
    for daemon in started:
        daemon.stop()


@pytest.fixture(scope="session")
def engine_args(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """``serve`` arguments selecting the engine for end-to-end tests: always
    the real engine on the tiny model. The import is here, not in the daemon,
    so that a broken engine fails the tests that use it at once, with its
    traceback; there is no fallback to the scripted engine (a test that
    wants that one names ``tests.fixtures.daemon.FAKE_ENGINE``)."""
    import soldaemon.runtime.engine.local  # noqa: F401
    from soldaemon.testing.tiny import build_tiny_model

    return ["--model", str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))]
