"""``sol_config.yaml``: six sections, each a frozen dataclass (:mod:`.sections`, docs/config.md);
a missing key keeps its default. The file is never found in the current directory (a project does
not configure the daemon). All of a file's problems raise one ConfigError naming file, line, key,
value and what is allowed; unknown keys are errors; types are strict; relative paths are relative
to the file. Change a Config with :meth:`Config.with_overrides` (``replace`` does not validate)."""

from __future__ import annotations

from soldaemon.config.budget import MemoryBudget
from soldaemon.config.build import Config, config_from_dict
from soldaemon.config.loader import ENV_VAR, find_config_file, load_config
from soldaemon.config.sections import (BackendConfig, CompletionConfig, DeviceConfig, ModelConfig, ServerConfig,
                                       SolConfig)

__all__ = ["ENV_VAR", "BackendConfig", "CompletionConfig", "Config", "DeviceConfig", "MemoryBudget", "ModelConfig",
           "ServerConfig", "SolConfig", "config_from_dict", "find_config_file", "load_config"]
