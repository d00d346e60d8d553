"""Where soldaemon keeps its files: the user's base directories as
``platformdirs`` finds them, under ``soldaemon/``.

On Linux (the XDG base-directory spec; a ``$XDG_*`` value that is not an
absolute path is ignored, as the spec says):

- cache: converted model copies (``$XDG_CACHE_HOME/soldaemon``, default
  ``~/.cache/soldaemon``; override ``SOLDAEMON_CACHE_DIR``)
- state: the per-user token, the pid file (``$XDG_STATE_HOME/soldaemon``,
  default ``~/.local/state/soldaemon``; override ``SOLDAEMON_STATE_DIR``)
- config: ``$XDG_CONFIG_HOME/soldaemon/sol_config.yaml`` (default
  ``~/.config/soldaemon``)

Elsewhere the platform's own folders, unless a ``$XDG_*`` variable is set:
on macOS ``~/Library/Caches/soldaemon`` and ``~/Library/Application
Support/soldaemon`` (config and state); on Windows
``%LOCALAPPDATA%\\soldaemon\\Cache`` and ``%LOCALAPPDATA%\\soldaemon``.

Nothing here creates a directory; the callers that write make theirs.
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import PlatformDirs

_DIRS = PlatformDirs("soldaemon", appauthor=False)   # reads the environment on every call


def cache_dir() -> Path:
    override = os.environ.get("SOLDAEMON_CACHE_DIR")
    if override:
        return Path(override)
    return Path(_DIRS.user_cache_dir)


def state_dir() -> Path:
    override = os.environ.get("SOLDAEMON_STATE_DIR")
    if override:
        return Path(override)
    return Path(_DIRS.user_state_dir)


def config_home() -> Path:
    return Path(_DIRS.user_config_dir)
