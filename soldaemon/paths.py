"""Where soldaemon keeps its files (XDG base directories).

- cache: converted model copies (``$XDG_CACHE_HOME/soldaemon``, override
  ``SOLDAEMON_CACHE_DIR``)
- state: the per-user token, the pid file (``$XDG_STATE_HOME/soldaemon``,
  override ``SOLDAEMON_STATE_DIR``)
- config: ``$XDG_CONFIG_HOME/soldaemon/sol_config.yaml``
"""

from __future__ import annotations

import os
from pathlib import Path


def _xdg(var: str, default: str) -> Path:
    value = os.environ.get(var)
    if value:
        return Path(value)
    return Path.home() / default


def cache_dir() -> Path:
    override = os.environ.get("SOLDAEMON_CACHE_DIR")
    if override:
        return Path(override)
    return _xdg("XDG_CACHE_HOME", ".cache") / "soldaemon"


def state_dir() -> Path:
    override = os.environ.get("SOLDAEMON_STATE_DIR")
    if override:
        return Path(override)
    return _xdg("XDG_STATE_HOME", ".local/state") / "soldaemon"


def config_home() -> Path:
    return _xdg("XDG_CONFIG_HOME", ".config") / "soldaemon"
