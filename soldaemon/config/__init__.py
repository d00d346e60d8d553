"""The configuration file, ``sol_config.yaml``: six sections (``sol``,
``model``, ``device``, ``server``, ``completion``, ``backend``), each a frozen
dataclass (:mod:`.sections`); a missing key keeps its default. docs/config.md
describes every key; :func:`find_config_file` says where the file is found
(never the current directory: a project does not configure the daemon).

- Every problem is a :class:`~soldaemon.errors.ConfigError` naming the file,
  line, dotted key, bad value and what is allowed; all of a file's problems
  are reported together. Unknown keys are errors (with "did you mean").
- Types are strict (a string is no number, a bool no int); relative paths
  are relative to the file; ``~`` is expanded.
- A ``Config`` is immutable: :meth:`Config.with_overrides` validates a change,
  ``dataclasses.replace`` does not.
"""

from __future__ import annotations

from soldaemon.config.budget import MemoryBudget
from soldaemon.config.build import Config, config_from_dict
from soldaemon.config.loader import ENV_VAR, find_config_file, load_config
from soldaemon.config.sections import (BackendConfig, CompletionConfig, DeviceConfig, ModelConfig, ServerConfig,
                                       SolConfig)

__all__ = ["ENV_VAR", "BackendConfig", "CompletionConfig", "Config", "DeviceConfig", "MemoryBudget", "ModelConfig",
           "ServerConfig", "SolConfig", "config_from_dict", "find_config_file", "load_config"]
