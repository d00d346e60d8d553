"""The configuration file, ``sol_config.yaml``.

Where it is found (first hit wins; see :func:`find_config_file`):

1. an explicit path (``soldaemon --config PATH``) — it must exist;
2. the environment variable ``SOLDAEMON_CONFIG`` (when set and non-empty) —
   it must exist too;
3. ``paths.config_home() / "sol_config.yaml"``
   (``$XDG_CONFIG_HOME/soldaemon/sol_config.yaml``).

Never ``./sol_config.yaml``: the current directory is the project an editor
opened, and a project does not configure the daemon (docs/security.md).

When none is found every key has its default. The file has six sections —
``sol``, ``model``, ``device``, ``server``, ``completion``, ``backend`` — each
parsed into one frozen dataclass below; a missing section or key keeps its
default. ``docs/config.md`` describes every key; ``sol_config.example.yaml``
lists them all with their defaults.

Contracts:

- Every problem is a :class:`~soldaemon.errors.ConfigError`. Its message names
  the file (and line, when the value came from a file), the full dotted key
  (``sol.prefetch_depth``), the bad value, and what is allowed. All problems of
  one file are reported together, one per line.
- Unknown keys, at any level, are errors, with a "did you mean 'x'?" when a
  known key is close.
- Types are strict: a string is never taken for a number, and a bool is not an
  int. An int is accepted where a float belongs.
- Relative paths in a file are relative to the directory of that file; ``~``
  is expanded. Paths are not checked for existence here (the model loader does
  that and raises ``ModelError``).
- A ``Config`` is immutable. To change a value, use
  :meth:`Config.with_overrides` (validated) or ``dataclasses.replace``
  (not validated: the caller vouches for the value).

The code is split by concern: :mod:`.checks` (the value checks),
:mod:`.budget` (:class:`MemoryBudget`), :mod:`.sections` (one dataclass per
section), :mod:`.build` (:class:`Config`, problems, cross-section checks)
and :mod:`.loader` (finding the file, YAML with line numbers).
"""

from __future__ import annotations

from soldaemon.config.budget import MemoryBudget
from soldaemon.config.build import Config, config_from_dict
from soldaemon.config.loader import CONFIG_FILENAME, ENV_VAR, find_config_file, load_config
from soldaemon.config.sections import (
    BackendConfig,
    BackendKind,
    CompletionConfig,
    DeviceConfig,
    FimAnchor,
    FimOrder,
    ModelConfig,
    OffloadPolicy,
    Precision,
    PromptFormat,
    ServerConfig,
    SolConfig,
)

__all__ = [
    "CONFIG_FILENAME",
    "ENV_VAR",
    "BackendConfig",
    "BackendKind",
    "CompletionConfig",
    "Config",
    "DeviceConfig",
    "FimAnchor",
    "FimOrder",
    "Precision",
    "PromptFormat",
    "MemoryBudget",
    "ModelConfig",
    "OffloadPolicy",
    "ServerConfig",
    "SolConfig",
    "config_from_dict",
    "find_config_file",
    "load_config",
]
