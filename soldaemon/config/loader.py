"""Finding the file and reading its YAML, with the line of every key."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

import yaml

from soldaemon.errors import ConfigError
from soldaemon.paths import config_home

from soldaemon.config.build import Config, build_config

CONFIG_FILENAME = "sol_config.yaml"
ENV_VAR = "SOLDAEMON_CONFIG"

log = logging.getLogger("sol.config")


def find_config_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """``explicit``, else ``$SOLDAEMON_CONFIG``, else ``config_home()/sol_config.yaml``, else None
    (the defaults). Raises ConfigError when a path given on purpose is not a file."""
    if explicit is not None:
        return _must_exist(Path(explicit).expanduser(), "--config")
    env = os.environ.get(ENV_VAR)
    if env:
        return _must_exist(Path(env).expanduser(), f"${ENV_VAR}")
    _note_project_file()
    candidate = config_home() / CONFIG_FILENAME
    return candidate if candidate.is_file() else None


def _note_project_file() -> None:
    """Warn that a project's ``sol_config.yaml`` in the current directory is not read."""
    try:
        here, home = Path.cwd() / CONFIG_FILENAME, config_home() / CONFIG_FILENAME
        if here.is_file() and not (home.is_file() and home.samefile(here)):
            log.warning("%s is not read: a project's directory does not configure the daemon; "
                        "pass --config %s (or set $%s) to use it", here, here, ENV_VAR)
    except OSError:
        pass


def _must_exist(path: Path, origin: str) -> Path:
    if path.is_file():
        return path
    why = "is a directory, not a file" if path.is_dir() else "does not exist"
    raise ConfigError(
        f"{path}: config file {why} (given by {origin})",
        hint="pass the path of a sol_config.yaml, or omit it to use the defaults",
    )


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e3`` (no dot) as a float, as YAML 1.2 does."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def _key_lines(node: yaml.Node, prefix: str, lines: dict[str, int], dups: list[str], source: str) -> None:
    """Record the 1-based line of every dotted key under ``node``, and duplicates."""
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode) or key_node.value == "<<":
                continue
            key = key_node.value
            dotted = f"{prefix}.{key}" if prefix else key
            line = key_node.start_mark.line + 1
            if key in seen:
                dups.append(f"{source}:{line}: {dotted}: duplicate key (first at line {seen[key]})")
            else:
                seen[key] = line
                lines[dotted] = line
            _key_lines(value_node, dotted, lines, dups, source)
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _key_lines(item, f"{prefix}[{index}]", lines, dups, source)


def _parse_yaml(text: str, source: str) -> tuple[object, dict[str, int]]:
    """The data and each dotted key's line; raises ConfigError naming ``source`` and the line."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, {}
        lines: dict[str, int] = {}
        dups: list[str] = []
        _key_lines(node, "", lines, dups, source)
        if dups:
            raise ConfigError("\n".join(dups), hint="remove all but one of each key")
        return loader.construct_document(node), lines
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        what = err.problem or err.context or "invalid YAML"
        if err.problem and err.context:
            what += f" ({err.context}"
            if err.context_mark is not None and err.context_mark is not mark:
                what += f" started at line {err.context_mark.line + 1}"
            what += ")"
        raise ConfigError(
            f"{where}: YAML syntax error: {what}",
            hint="check the indentation and quoting on that line",
        ) from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: cannot parse YAML: {err}") from None
    finally:
        loader.dispose()


def load_config(path: str | os.PathLike[str] | None = None) -> Config:
    """Find, read and validate the config file (none: the defaults); raises only ConfigError."""
    found = find_config_file(path)
    if found is None:
        return Config.default()
    found = found.absolute()
    try:
        text = found.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{found}: not UTF-8 text (byte {err.start})") from None
    except OSError as err:
        raise ConfigError(f"{found}: cannot read: {err.strerror or err}") from None
    data, lines = _parse_yaml(text, str(found))
    return build_config(data, str(found), lines, found.parent, found)
