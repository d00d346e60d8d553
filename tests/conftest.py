"""Shared fixtures. Keep this small: helpers live in tests/fixtures/.

The suite never writes into the user's soldaemon folders: a private cache
and state directory for the whole run (``SOLDAEMON_CACHE_DIR``,
``SOLDAEMON_STATE_DIR``, inherited by every process a test starts), so
that the tiny model's kernel plans, tokens and records stay out of the
user's. The cache's costly, model-bound parts (converted and assembled
weights, the llama-server build) are links to the user's cache: the
real-model tests still find the converted models there, and a conversion
made by a test is kept for the next run.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

SHARED_CACHE_PARTS = ("models", "llama-server", "functional")   # linked from the user's cache
PRIVATE_CACHE_PARTS = ("kernel-plans",)                         # never linked: each run times its own
_private_root: Path | None = None


def pytest_configure(config: pytest.Config) -> None:
    """Point the run at a private cache (sharing the user's weights) and a
    private state directory, before any test or fixture reads them."""
    global _private_root
    from soldaemon import paths

    shared = paths.cache_dir()
    _private_root = Path(tempfile.mkdtemp(prefix="soldaemon-tests-"))
    cache = _private_root / "cache"
    cache.mkdir()
    names = set(SHARED_CACHE_PARTS) | ({p.name for p in shared.iterdir()} if shared.is_dir() else set())
    for name in sorted(names - set(PRIVATE_CACHE_PARTS)):
        target = shared / name
        if name in SHARED_CACHE_PARTS:
            try:
                target.mkdir(parents=True, exist_ok=True)
            except OSError:             # a read-only home: the run converts into its own cache
                continue
        if target.exists():
            (cache / name).symlink_to(target, target_is_directory=target.is_dir())
    os.environ["SOL_TESTS_USER_CACHE"] = str(shared)
    os.environ["SOLDAEMON_CACHE_DIR"] = str(cache)
    os.environ["SOLDAEMON_STATE_DIR"] = str(_private_root / "state")


def pytest_unconfigure(config: pytest.Config) -> None:
    if _private_root is not None:
        shutil.rmtree(_private_root, ignore_errors=True)


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
    from soldaemon_bench.tiny import build_tiny_model

    return ["--model", str(build_tiny_model(tmp_path_factory.mktemp("tiny-model")))]
