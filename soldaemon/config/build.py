"""The whole Config, built from parsed data: every problem collected with
its line, then the checks across sections."""

from __future__ import annotations

import dataclasses
import difflib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, TypeVar

from soldaemon.discovery import is_loopback_host
from soldaemon.errors import ConfigError

from soldaemon.config.budget import MemoryBudget
from soldaemon.config.checks import Bad
from soldaemon.config.sections import (SECTIONS, BackendConfig, CompletionConfig, DeviceConfig, ModelConfig,
                                       ServerConfig, SolConfig)

log = logging.getLogger("soldaemon.config")

_HINT = "see docs/config.md or sol_config.example.yaml for every key and its allowed values"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Config:
    """The whole configuration; ``source``: the file loaded (absolute), None for defaults/a dict."""

    sol: SolConfig = field(default_factory=SolConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    device: DeviceConfig = field(default_factory=DeviceConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    completion: CompletionConfig = field(default_factory=CompletionConfig)
    backend: BackendConfig = field(default_factory=BackendConfig)
    source: Path | None = None

    @classmethod
    def default(cls) -> Config:
        """Every key at its default; ``source`` is None."""
        return cls()

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain YAML-able data; ``config_from_dict(c.to_dict())`` is ``c`` but for ``source``."""
        sections = {name: getattr(self, name) for name in SECTIONS}
        return {name: {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
                for name, section in sections.items()}

    def with_overrides(
        self, overrides: Mapping[str, object], source: str = "<overrides>"
    ) -> Config:
        """A copy with dotted keys set (``{"sol.prefetch_depth": 4}``), validated as in the file;
        errors name ``source``. Relative paths stay as given; the result keeps this ``source``."""
        data = self.to_dict()
        problems: list[str] = []
        for dotted, value in overrides.items():
            section, sep, key = dotted.partition(".")
            if not sep or not key or "." in key:
                problems.append(
                    f"{source}: {dotted}: expected a key of the form section.key "
                    f"(sections: {', '.join(SECTIONS)})"
                )
                continue
            target = data.setdefault(section, {})
            if isinstance(target, dict):
                target[key] = value
        if problems:
            raise ConfigError("\n".join(problems), hint=_HINT)
        return build_config(data, source, {}, None, self.source)


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, MemoryBudget):     # what parses back to it
        return value.mb if value.mb is not None else value.fraction
    return value


def _show(value: object) -> str:
    """A value as the user wrote it (YAML-ish), truncated."""
    text = json.dumps(value) if value is None or isinstance(value, (bool, str)) else repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


_KINDS: tuple[tuple[type, str], ...] = ((bool, "a bool"), (int, "an integer"), (float, "a float"),
                                         (str, "a string"), (list, "a list"), (dict, "a mapping"))


def _kind(value: object) -> str:
    if value is None:
        return "null"
    return next((name for cls, name in _KINDS if isinstance(value, cls)), f"a {type(value).__name__}")


class _Problems:
    """Collects problems; each line names the source, line, key and value."""

    def __init__(self, source: str, lines: Mapping[str, int]) -> None:
        self.source = source
        self.lines = lines
        self.items: list[str] = []

    def where(self, dotted: str) -> str:
        line = self.lines.get(dotted)
        return f"{self.source}:{line}" if line is not None else self.source

    def invalid(self, dotted: str, value: object, expected: str) -> None:
        self.items.append(
            f"{self.where(dotted)}: {dotted} = {_show(value)} ({_kind(value)}): expected {expected}"
        )

    def unknown(self, dotted: str, key: object, known: list[str], elsewhere: list[str]) -> None:
        name = str(key)
        guess = difflib.get_close_matches(name, known, n=1) or elsewhere
        tip = f"; did you mean '{guess[0]}'?" if guess else f"; known keys here: {', '.join(known)}"
        self.items.append(f"{self.where(dotted)}: {dotted}: unknown key {_show(key)}{tip}")

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError("\n".join(self.items), hint=_HINT)


# Keys a release removed: a file that still sets one loads, with a warning saying why.
RETIRED: dict[str, str] = {
    "model.cache_reuse": "moved-chunk KV reuse made answers ignore what was just typed; removed 2026-12-05",
    "completion.hold_end": "it never changed an answer on the measured holes; removed 2026-12-05",
    "model.dtype": "replaced by model.precision; removed 2026-12-05",
    "model.decode_dtype": "one copy of the weights serves every phase (model.precision); removed 2026-12-05",
    "model.rotate": "activations are rotated wherever the plan quantizes them; removed 2026-12-05",
    "model.context": "context from other files is always chosen by relevance; removed 2026-12-05",
}


def _elsewhere(key: str, exclude: str | None) -> list[str]:
    """Dotted names of sections or keys elsewhere that are exactly ``key``."""
    return [f"{name}.{key}" for name, cls in SECTIONS.items()
            if name != exclude and key in {f.name for f in dataclasses.fields(cls)}]


def _build_section(
    name: str, cls: type[_T], raw: object, problems: _Problems, base: Path | None
) -> _T:
    if raw is None:
        return cls()
    if not isinstance(raw, dict):
        problems.invalid(name, raw, f"a mapping of {name} keys")
        return cls()
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    values: dict[str, Any] = {}
    for key, value in raw.items():
        dotted = f"{name}.{key}"
        if dotted in RETIRED:
            log.warning("%s: %s is no longer read (%s); remove it", problems.where(dotted), dotted, RETIRED[dotted])
            continue
        if not isinstance(key, str) or key not in fields:
            problems.unknown(dotted, key, list(fields), _elsewhere(str(key), name))
            continue
        try:
            values[key] = fields[key].metadata["check"](value, base)
        except Bad as bad:
            problems.invalid(dotted, value, bad.expected)
    return cls(**values)


def _cross_checks(config: Config, problems: _Problems) -> None:
    server = config.server
    if not server.allow_remote and not is_loopback_host(server.host):
        problems.items.append(
            f"{problems.where('server.host')}: server.host = {_show(server.host)}: "
            "not a loopback address; anyone who can reach it could use the daemon. "
            "Set server.allow_remote: true to allow it, or use 127.0.0.1"
        )
    backend = config.backend
    if backend.kind == "remote" and backend.url is None:
        problems.items.append(
            f"{problems.where('backend.kind')}: backend.kind = \"remote\": "
            "backend.url is required (an http:// or https:// URL)"
        )
    if backend.max_backoff_s < backend.backoff_s:
        problems.items.append(
            f"{problems.where('backend.max_backoff_s')}: backend.max_backoff_s = {backend.max_backoff_s:g}: "
            f"smaller than backend.backoff_s ({backend.backoff_s:g}); expected max_backoff_s >= backoff_s"
        )
    model, completion = config.model, config.completion
    windows = model.windows()     # "auto" before a model is chosen: the widest (GENERIC_WINDOWS)
    needed = windows.prefix + windows.suffix + completion.max_tokens
    if needed > model.max_context:
        problems.items.append(
            f"{problems.where('model.max_context')}: model.max_context = {model.max_context}: "
            f"too small for model.max_prefix_tokens ({windows.prefix}) + "
            f"model.max_suffix_tokens ({windows.suffix}) + "
            f"completion.max_tokens ({completion.max_tokens}) = {needed}; "
            "expected max_context >= their sum"
        )


def build_config(
    data: object,
    source: str,
    lines: Mapping[str, int],
    base: Path | None,
    source_path: Path | None,
) -> Config:
    """The Config of ``data`` (the parsed file); ``lines`` maps a dotted key to its line in
    ``source``. Raises ConfigError naming every problem found."""
    problems = _Problems(source, lines)
    if data is None:
        return Config(source=source_path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections "
            f"({', '.join(SECTIONS)}), got {_kind(data)} {_show(data)}",
            hint=_HINT,
        )
    sections: dict[str, Any] = {}
    for key, raw in data.items():
        if not isinstance(key, str) or key not in SECTIONS:
            problems.unknown(str(key), key, list(SECTIONS), _elsewhere(str(key), None))
            continue
        sections[key] = _build_section(key, SECTIONS[key], raw, problems, base)
    problems.raise_if_any()
    config = Config(**sections, source=source_path)
    _cross_checks(config, problems)
    problems.raise_if_any()
    return config


def config_from_dict(
    data: Mapping[str, Any] | None, source: str = "<dict>", *, base_dir: Path | None = None
) -> Config:
    """``data`` (what the YAML file would parse to) validated into a Config whose ``source`` is
    None; errors name ``source``. Relative paths join ``base_dir`` if given. Raises ConfigError."""
    plain = dict(data) if isinstance(data, Mapping) else data
    return build_config(plain, source, {}, base_dir, None)
