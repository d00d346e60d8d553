"""Where soldaemon keeps its files: ``platformdirs``' per-user directories under ``soldaemon/``
(on Linux ``$XDG_CACHE_HOME``, ``$XDG_STATE_HOME``, ``$XDG_CONFIG_HOME``; docs/config.md).
cache: converted models (override ``SOLDAEMON_CACHE_DIR``); state: the token and the daemon
record (override ``SOLDAEMON_STATE_DIR``); config: ``sol_config.yaml``. Nothing here creates a
directory: the callers that write make theirs."""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import PlatformDirs

_DIRS = PlatformDirs("soldaemon", appauthor=False)   # reads the environment on every call


def cache_dir() -> Path:
    return Path(os.environ.get("SOLDAEMON_CACHE_DIR") or _DIRS.user_cache_dir)


def state_dir() -> Path:
    return Path(os.environ.get("SOLDAEMON_STATE_DIR") or _DIRS.user_state_dir)


def config_home() -> Path:
    return Path(_DIRS.user_config_dir)
