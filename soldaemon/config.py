"""The configuration file, ``sol_config.yaml``.

Where it is found (first hit wins; see :func:`find_config_file`):

1. an explicit path (``soldaemon --config PATH``) — it must exist;
2. the environment variable ``SOLDAEMON_CONFIG`` (when set and non-empty) —
   it must exist too;
3. ``./sol_config.yaml`` in the current directory;
4. ``paths.config_home() / "sol_config.yaml"``
   (``$XDG_CONFIG_HOME/soldaemon/sol_config.yaml``).

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
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, TypeVar, get_args

import yaml

from soldaemon.api import Multiline
from soldaemon.errors import ConfigError
from soldaemon.paths import config_home, state_dir

__all__ = [
    "CONFIG_FILENAME",
    "ENV_VAR",
    "BackendConfig",
    "BackendKind",
    "CompletionConfig",
    "Config",
    "DeviceConfig",
    "Dtype",
    "Precision",
    "effective_precision",
    "MemoryBudget",
    "ModelConfig",
    "OffloadPolicy",
    "ServerConfig",
    "SolConfig",
    "config_from_dict",
    "find_config_file",
    "is_loopback_host",
    "load_config",
]

CONFIG_FILENAME = "sol_config.yaml"
ENV_VAR = "SOLDAEMON_CONFIG"
_HINT = "see docs/config.md or sol_config.example.yaml for every key and its allowed values"

OffloadPolicy = Literal["layer", "block"]
Dtype = Literal["auto", "float32", "float16", "bfloat16"]
DecodeDtype = Literal["auto", "same", "float16", "bfloat16"]
Precision = Literal["auto", "float32", "bfloat16", "float16", "int8", "int4"]
BackendKind = Literal["local", "remote"]
PromptFormat = Literal["text", "tokens"]
FimOrder = Literal["psm", "spm"]
ContextChoice = Literal["relevance", "order"]
FimAnchor = Literal["cursor", "line", "sticky"]

_T = TypeVar("_T")


# --------------------------------------------------------------------------
# Validators. Each takes the raw YAML value and the directory relative paths
# are taken from (None: leave them as given) and returns the typed value, or
# raises _Bad with a description of what is allowed.
# --------------------------------------------------------------------------


class _Bad(Exception):
    """A value is not allowed. ``expected`` says what is."""

    def __init__(self, expected: str) -> None:
        super().__init__(expected)
        self.expected = expected


_Check = Callable[[object, "Path | None"], Any]


def _setting(default: _T, check: _Check) -> _T:
    """A dataclass field with a default and the validator for its YAML value."""
    return field(default=default, metadata={"check": check})


def _int(lo: int, hi: int | None = None) -> _Check:
    expected = f"an integer in {lo}..{hi}" if hi is not None else f"an integer >= {lo}"

    def check(value: object, _base: Path | None) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _Bad(expected)
        if value < lo or (hi is not None and value > hi):
            raise _Bad(expected)
        return value

    return check


def _float(lo: float, *, lo_open: bool = False, hi: float | None = None) -> _Check:
    """A finite number (int or float) with ``value > lo`` (``lo_open``) or
    ``value >= lo``, and ``value <= hi`` when ``hi`` is given."""
    low = f"> {lo:g}" if lo_open else f">= {lo:g}"
    if hi is None:
        expected = f"a number {low}"
    else:
        expected = f"a number {low} and <= {hi:g}"

    def check(value: object, _base: Path | None) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise _Bad(expected)
        number = float(value)
        if not math.isfinite(number):
            raise _Bad(expected)
        if number < lo or (lo_open and number == lo) or (hi is not None and number > hi):
            raise _Bad(expected)
        return number

    return check


def _bool() -> _Check:
    def check(value: object, _base: Path | None) -> bool:
        if not isinstance(value, bool):
            raise _Bad("true or false")
        return value

    return check


def _choice(options: tuple[str, ...]) -> _Check:
    expected = "one of " + ", ".join(json.dumps(o) for o in options)

    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or value not in options:
            close = difflib.get_close_matches(str(value), options, n=1)
            raise _Bad(expected + (f"; did you mean '{close[0]}'?" if close else ""))
        return value

    return check


def _text() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("a non-empty string")
        return value

    return check


def _optional(inner: _Check) -> _Check:
    """``null`` or whatever ``inner`` allows."""

    def check(value: object, base: Path | None) -> Any:
        if value is None:
            return None
        try:
            return inner(value, base)
        except _Bad as bad:
            raise _Bad("null or " + bad.expected) from None

    return check


def _path() -> _Check:
    def check(value: object, base: Path | None) -> Path:
        if not isinstance(value, str) or not value.strip():
            raise _Bad("a path (a non-empty string)")
        path = Path(value).expanduser()
        if base is not None and not path.is_absolute():
            path = base / path
        return path

    return check


_DEVICE_RE = re.compile(r"auto|cpu|cuda|cuda:[0-9]+")


def _device() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _DEVICE_RE.fullmatch(value):
            raise _Bad('"auto", "cpu", "cuda" or "cuda:N" (N = 0, 1, ...)')
        return value

    return check


def _str_list() -> _Check:
    def check(value: object, _base: Path | None) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(
            isinstance(item, str) and item.strip() for item in value
        ):
            raise _Bad("a list of non-empty strings")
        return tuple(value)

    return check


_URL_RE = re.compile(r"https?://[^\s/]+\S*")


def _url() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _URL_RE.fullmatch(value):
            raise _Bad("an http:// or https:// URL")
        return value

    return check


_ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _env_name() -> _Check:
    def check(value: object, _base: Path | None) -> str:
        if not isinstance(value, str) or not _ENV_NAME_RE.fullmatch(value):
            raise _Bad("the name of an environment variable (letters, digits, _)")
        return value

    return check


def _memory_budget() -> _Check:
    def check(value: object, _base: Path | None) -> MemoryBudget | None:
        if value is None:
            return None
        try:
            return MemoryBudget.parse(value)
        except ValueError:
            raise _Bad(MemoryBudget.EXPECTED) from None

    return check


# --------------------------------------------------------------------------
# The memory budget.
# --------------------------------------------------------------------------

_MIB = 1 << 20  # bytes
_SIZE_UNITS: dict[str, int] = {  # unit → MiB
    "mb": 1, "mib": 1, "m": 1,
    "gb": 1024, "gib": 1024, "g": 1024,
    "tb": 1024 * 1024, "tib": 1024 * 1024, "t": 1024 * 1024,
}
_SIZE_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(%|[a-z]+)\s*", re.IGNORECASE)


@dataclass(frozen=True)
class MemoryBudget:
    """A cap on the device memory Sol may use for the model's resident
    weights and KV cache; what does not fit is offloaded per
    ``sol.weight_offload_policy``.

    Exactly one of ``mb`` and ``fraction`` is set: an absolute size, or a
    share of the device's total memory. ``MB``/``MiB``/``M`` all mean
    2**20 bytes and ``GB``/``GiB``/``G`` 2**30 bytes (as nvidia-smi and
    torch report memory).
    """

    mb: int | None = None          # MiB (2**20 bytes), >= 1
    fraction: float | None = None  # of the device's total memory, in (0, 1]

    EXPECTED = (
        'null, an integer number of MB (>= 1), a size string like "1500MB" or "2GB", '
        'or a fraction of device memory like "75%" or 0.75'
    )

    def __post_init__(self) -> None:
        if (self.mb is None) == (self.fraction is None):
            raise ValueError("MemoryBudget: set exactly one of mb and fraction")
        if self.mb is not None and self.mb < 1:
            raise ValueError(f"MemoryBudget: mb must be >= 1, got {self.mb}")
        if self.fraction is not None and not 0.0 < self.fraction <= 1.0:
            raise ValueError(f"MemoryBudget: fraction must be in (0, 1], got {self.fraction}")

    @classmethod
    def parse(cls, value: object) -> MemoryBudget:
        """Parse the YAML value of ``sol.memory_budget`` (not null).

        - an int: MB (``1500`` → 1500 MiB);
        - a float in (0, 1]: a fraction (``0.75``);
        - a string with a unit: ``"1500MB"``, ``"1.5 GB"``, ``"2GiB"``,
          ``"1T"`` (rounded to the nearest MiB, at least 1), or a percentage
          ``"75%"`` in (0, 100].

        Raises ``ValueError`` for anything else.
        """
        if isinstance(value, bool):
            raise ValueError("a bool is not a memory budget")
        if isinstance(value, int):
            return cls(mb=value)
        if isinstance(value, float):
            if not math.isfinite(value) or not 0.0 < value <= 1.0:
                raise ValueError("a plain float must be a fraction in (0, 1]")
            return cls(fraction=value)
        if isinstance(value, str):
            match = _SIZE_RE.fullmatch(value)
            if match is None:
                raise ValueError(f"not a size: {value!r}")
            number, unit = float(match.group(1)), match.group(2).lower()
            if unit == "%":
                return cls(fraction=number / 100.0)
            if unit not in _SIZE_UNITS:
                raise ValueError(f"unknown unit {unit!r}")
            return cls(mb=round(number * _SIZE_UNITS[unit]))
        raise ValueError(f"not a memory budget: {value!r}")

    def resolve_bytes(self, total_bytes: int) -> int:
        """The budget in bytes on a device with ``total_bytes`` of memory."""
        if self.mb is not None:
            return self.mb * _MIB
        assert self.fraction is not None
        return int(total_bytes * self.fraction)

    def to_yaml(self) -> int | float:
        """The value that parses back to this budget (an int MB or a float
        fraction)."""
        if self.mb is not None:
            return self.mb
        assert self.fraction is not None
        return self.fraction

    def __str__(self) -> str:
        if self.mb is not None:
            return f"{self.mb}MB"
        assert self.fraction is not None
        return f"{self.fraction * 100:g}%"


# --------------------------------------------------------------------------
# The sections.
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class SolConfig:
    """``sol:`` — the Sol scheduler (layer prefetch, KV folding, weight
    offload) and the memory it may use."""

    # Sliding window over which per-layer activity is counted to decide which
    # layers stay resident and which are prefetched; seconds, > 0.
    layer_heatmap_window: float = _setting(60.0, _float(0.0, lo_open=True))
    # How many layers ahead of the one computing are fetched to the device;
    # layers, 0 (no prefetch) .. 16.
    prefetch_depth: int = _setting(2, _int(0, 16))
    # KV folding of parked sessions (runtime/kvfold.py): a 64-token block whose
    # attention mass, relative to the most attended block, is under this is
    # stored as int8; in [0, 1], 0.0 = off. 0.1: measured, greedy output equal
    # to unfolded on 19/20 real holes, 32% of the KV folded (docs/memory.md).
    kv_folding_entropy_threshold: float = _setting(0.1, _float(0.0, hi=1.0))
    # Folding quantizes parked sessions only while the device's free memory
    # (RAM on a CPU) is under this (MB, or a fraction of the device's memory as
    # for memory_budget); with more free, parked sessions are only trimmed, a
    # copy (at 1k tokens on a 2-core CPU: 32 ms a switch against ~200 ms
    # quantized, docs/memory.md). null: always quantize.
    kv_folding_free_below: MemoryBudget | None = _setting(MemoryBudget(fraction=0.2), _memory_budget())
    # Granularity of weight offload: whole decoder layers or parameter blocks.
    weight_offload_policy: OffloadPolicy = _setting(
        "layer", _choice(get_args(OffloadPolicy))
    )
    # When Sol's schedule misses (a prefetch not landed in time), wait this
    # long before falling back to the plain synchronous path; milliseconds, > 0.
    fallback_timeout_ms: float = _setting(50.0, _float(0.0, lo_open=True))
    # Device memory cap for weights + KV; None: no cap (all resident when it fits).
    memory_budget: MemoryBudget | None = _setting(None, _memory_budget())
    # Release the model's device memory after this long without a request;
    # seconds, >= 0, 0 = never.
    idle_release_s: float = _setting(300.0, _float(0.0))


@dataclass(frozen=True)
class ModelConfig:
    """``model:`` — which model, in which precision, with how much context."""

    # None: the embedded default (Qwen2.5-Coder-0.5B); else a local Hugging Face
    # model directory or a .gguf file.
    path: Path | None = _setting(None, _optional(_path()))
    # The one format the weights are kept in, and so the kernels that read
    # them: "auto" measures the kernels on this machine at start-up (cached
    # per machine, model and torch version) and picks per phase (prefill,
    # decode/verify, output layer); or "float32", "bfloat16", "float16",
    # "int8" (int8 weights; the kernels still chosen by measurement), "int4"
    # (4-bit decoder layers, the output layer int8).
    precision: Precision = _setting("auto", _choice(get_args(Precision)))
    # Replaced by precision (accepted with a notice): dtype "float32",
    # "float16" or "bfloat16" reads as that precision when precision is
    # "auto"; decode_dtype no longer applies (one weight copy).
    dtype: Dtype = _setting("auto", _choice(get_args(Dtype)))
    decode_dtype: DecodeDtype = _setting("auto", _choice(get_args(DecodeDtype)))
    # Longest prompt + completion the engine allocates for; tokens, 256..131072.
    max_context: int = _setting(4096, _int(256, 131072))
    # Document text before the cursor kept in the prompt; tokens, >= 1.
    max_prefix_tokens: int = _setting(1024, _int(1))
    # Document text after the cursor kept in the prompt; tokens, >= 0.
    max_suffix_tokens: int = _setting(256, _int(0))
    # A smaller model for speculative decoding; None: no draft model.
    draft_model: Path | None = _setting(None, _optional(_path()))
    # Moved-chunk KV reuse (like llama.cpp's --cache-reuse): the text after the
    # cursor is re-rotated instead of recomputed when at least this many of its
    # tokens merely moved; tokens, 0 = off (exact prefix reuse only). Off by
    # default: measured on the embedded model, FIM completions then ignore
    # what was just typed (docs/config.md).
    cache_reuse: int = _setting(0, _int(0))
    # FIM prompt layout: "psm" (prefix, suffix, middle) or "spm" (suffix
    # first: typing only appends, so the whole prompt before the cursor stays
    # in the KV cache; llama.cpp's spm_infill layout).
    fim_order: FimOrder = _setting("psm", _choice(get_args(FimOrder)))
    # Where the middle of a PSM prompt starts: "cursor"; "line" (the cursor
    # line so far goes after the middle token, so typing on a line only
    # appends to the prompt); "sticky" (like "line", but the anchor stays
    # where the user started typing, for up to 8 lines, while the text
    # around is unchanged: Enter does not recompute the suffix either).
    fim_anchor: FimAnchor = _setting("sticky", _choice(get_args(FimAnchor)))
    # Context from other files (a request's context chunks): "relevance" cuts
    # them into snippets and keeps those that share the most names with the
    # code around the cursor (soldaemon/relevance.py); "order" keeps the
    # chunks as sent, in order, until the budget is spent.
    context: ContextChoice = _setting("relevance", _choice(get_args(ContextChoice)))
    # Context from other files in the prompt; tokens, >= 0.
    max_context_tokens: int = _setting(1024, _int(0))
    # Outline of the scopes the prefix window cut off, taken from the context budget; tokens, >= 0 (0: off).
    max_outline_tokens: int = _setting(0, _int(0))
    # Documents whose KV cache is kept (an LRU, one cache of max_context each).
    kv_sessions: int = _setting(4, _int(1, 64))


@dataclass(frozen=True)
class DeviceConfig:
    """``device:`` — where the model runs."""

    # "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N".
    device: str = _setting("auto", _device())
    # CPU threads for torch; None: torch's default; else >= 1.
    threads: int | None = _setting(None, _optional(_int(1)))
    # Decode steps replayed from CUDA graphs on a CUDA device (captured at
    # warm-up; eager fallback when capture fails). Ignored on a CPU.
    cuda_graphs: bool = _setting(True, _bool())


@dataclass(frozen=True)
class ServerConfig:
    """``server:`` — the websocket server."""

    host: str = _setting("127.0.0.1", _text())
    # TCP port; 0 = pick a free port.
    port: int = _setting(8765, _int(0, 65535))
    # Must be true to listen on a host that is not loopback.
    allow_remote: bool = _setting(False, _bool())
    # Browser Origin headers accepted besides none; empty: no browser origins.
    allowed_origins: tuple[str, ...] = _setting((), _str_list())
    # None: state_dir()/token (see token_path()).
    token_file: Path | None = _setting(None, _optional(_path()))
    # Largest incoming websocket message; bytes, >= 1.
    max_message_bytes: int = _setting(1_048_576, _int(1))
    # Messages accepted per second on one connection; > 0.
    rate_limit_per_s: float = _setting(200.0, _float(0.0, lo_open=True))
    # On shutdown, wait this long for in-flight requests; seconds, >= 0.
    drain_timeout_s: float = _setting(5.0, _float(0.0))

    def token_path(self) -> Path:
        """The token file: ``token_file`` or ``state_dir()/token`` (resolved
        now, so it follows ``SOLDAEMON_STATE_DIR``)."""
        return self.token_file if self.token_file is not None else state_dir() / "token"


@dataclass(frozen=True)
class CompletionConfig:
    """``completion:`` — defaults for a completion request (a request's own
    fields override them)."""

    # Generated tokens, hard cap; 1..2048.
    max_tokens: int = _setting(64, _int(1, 2048))
    # Lines in a completion, cap; >= 1.
    max_lines: int = _setting(8, _int(1))
    multiline: Multiline = _setting("auto", _choice(get_args(Multiline)))
    # 0 = greedy; >= 0.
    temperature: float = _setting(0.0, _float(0.0))
    # Nucleus sampling mass; in (0, 1].
    top_p: float = _setting(1.0, _float(0.0, lo_open=True, hi=1.0))
    # Wall-clock budget from arrival; milliseconds, > 0; None: no budget.
    budget_ms: float | None = _setting(None, _optional(_float(0.0, lo_open=True)))
    # Use speculative decoding when a draft is available.
    speculative: bool = _setting(True, _bool())
    # Tokens proposed per speculative step; 1..64.
    draft_tokens: int = _setting(8, _int(1, 64))
    # Token healing for a cursor after text on its line: the prompt's last
    # token is left out and the first generated token must agree with it
    # (local backend; docs/quality.md).
    token_healing: bool = _setting(True, _bool())
    # Speculative FIM: after a completion is delivered, compute the next one
    # as if the user accepts it, at the lowest priority, stopped by any
    # request (local backend; docs/config.md).
    speculative_fim: bool = _setting(True, _bool())


@dataclass(frozen=True)
class BackendConfig:
    """``backend:`` — where completions are computed: ``local`` (the Sol
    runtime in this process) or ``remote`` (an inference engine speaking the
    OpenAI-compatible ``/v1/completions`` streaming API: vLLM, TGI, a
    llama.cpp server; see docs/remote.md)."""

    kind: BackendKind = _setting("local", _choice(get_args(BackendKind)))
    # The engine's base URL (``http://host:8000`` or ``http://host:8000/v1``);
    # required when kind is "remote".
    url: str | None = _setting(None, _optional(_url()))
    # The model name sent in each request; None: the engine's only model.
    model_name: str | None = _setting(None, _optional(_text()))
    # Name of the environment variable holding the API key (never the key).
    api_key_env: str | None = _setting(None, _optional(_env_name()))
    # A file whose first line is the API key (used when api_key_env is unset
    # or names an empty variable).
    api_key_file: Path | None = _setting(None, _optional(_path()))
    # Tokenizer of the remote model's family, for FIM prompts: a Hugging Face
    # model/tokenizer directory or a .gguf file; None: model.path's, else the
    # embedded model's (Qwen2.5-Coder: every size shares it).
    tokenizer: Path | None = _setting(None, _optional(_path()))
    # How the prompt is sent: "text" (special tokens as text; every engine)
    # or "tokens" (token ids; vLLM and the native llama.cpp server).
    prompt_format: PromptFormat = _setting("text", _choice(get_args(PromptFormat)))
    # Connecting to the engine; seconds, > 0.
    connect_timeout_s: float = _setting(2.0, _float(0.0, lo_open=True))
    # Waiting for the engine's answer: its first byte, then each streamed
    # chunk; seconds, > 0.
    timeout_s: float = _setting(30.0, _float(0.0, lo_open=True))
    # Extra connection attempts within one request when the engine cannot be
    # reached (never after text was streamed); 0..5.
    retries: int = _setting(1, _int(0, 5))
    # Wait after the first failed attempt; doubles per consecutive failure up
    # to max_backoff_s. While it runs, requests fail at once (retryable) or
    # go to the local model; seconds, > 0.
    backoff_s: float = _setting(0.5, _float(0.0, lo_open=True))
    max_backoff_s: float = _setting(30.0, _float(0.0, lo_open=True))
    # Reachability probe (GET /v1/models) for health, cached this long;
    # seconds, > 0.
    health_interval_s: float = _setting(5.0, _float(0.0, lo_open=True))
    # When the engine is unreachable, answer from the local model (model.path
    # or the embedded one), loaded on first need.
    fallback_local: bool = _setting(False, _bool())


_SECTIONS: dict[str, type[Any]] = {
    "sol": SolConfig,
    "model": ModelConfig,
    "device": DeviceConfig,
    "server": ServerConfig,
    "completion": CompletionConfig,
    "backend": BackendConfig,
}


@dataclass(frozen=True)
class Config:
    """The whole configuration. ``source`` is the file it was loaded from
    (absolute), or None for defaults / a dict."""

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
        """Plain YAML-able data (paths as strings, tuples as lists, the
        memory budget as an int MB or a float fraction) such that
        ``config_from_dict(c.to_dict())`` equals ``c`` apart from ``source``."""
        out: dict[str, dict[str, Any]] = {}
        for name in _SECTIONS:
            section = getattr(self, name)
            out[name] = {f.name: _plain(getattr(section, f.name)) for f in dataclasses.fields(section)}
        return out

    def with_overrides(
        self, overrides: Mapping[str, object], source: str = "<overrides>"
    ) -> Config:
        """A copy with dotted keys set (``{"sol.prefetch_depth": 4}``), validated
        as if they were in the file; errors name ``source``. Relative paths
        are kept as given (relative to the process's current directory).
        ``source`` of the result is this config's ``source``."""
        data = self.to_dict()
        problems: list[str] = []
        for dotted, value in overrides.items():
            section, sep, key = dotted.partition(".")
            if not sep or not key or "." in key:
                problems.append(
                    f"{source}: {dotted}: expected a key of the form section.key "
                    f"(sections: {', '.join(_SECTIONS)})"
                )
                continue
            target = data.setdefault(section, {})
            if isinstance(target, dict):
                target[key] = value
        if problems:
            raise ConfigError("\n".join(problems), hint=_HINT)
        return _build(data, source, {}, None, self.source)


def _plain(value: object) -> object:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    if isinstance(value, MemoryBudget):
        return value.to_yaml()
    return value


# --------------------------------------------------------------------------
# Building and checking.
# --------------------------------------------------------------------------


def _show(value: object) -> str:
    """A value as the user wrote it (YAML-ish), truncated."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = json.dumps(value)
    else:
        text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _kind(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a bool"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a mapping"
    return f"a {type(value).__name__}"


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
        close = difflib.get_close_matches(name, known, n=1)
        if close:
            tip = f"; did you mean '{close[0]}'?"
        elif elsewhere:
            tip = f"; did you mean '{elsewhere[0]}'?"
        else:
            tip = f"; known keys here: {', '.join(known)}"
        self.items.append(f"{self.where(dotted)}: {dotted}: unknown key {_show(key)}{tip}")

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigError("\n".join(self.items), hint=_HINT)


def _elsewhere(key: str, exclude: str | None) -> list[str]:
    """Dotted names of sections or keys elsewhere that are exactly ``key``."""
    found: list[str] = []
    for name, cls in _SECTIONS.items():
        if name == exclude:
            continue
        if key in {f.name for f in dataclasses.fields(cls)}:
            found.append(f"{name}.{key}")
    return found


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
        if not isinstance(key, str) or key not in fields:
            problems.unknown(dotted, key, list(fields), _elsewhere(str(key), name))
            continue
        try:
            values[key] = fields[key].metadata["check"](value, base)
        except _Bad as bad:
            problems.invalid(dotted, value, bad.expected)
    return cls(**values)


def effective_precision(model: ModelConfig) -> tuple[str, list[str]]:
    """``model.precision`` after the keys it replaced (``model.dtype``,
    ``model.decode_dtype``), and the notices to show for those keys."""
    notices: list[str] = []
    precision: str = model.precision
    if model.dtype != "auto":
        if precision == "auto":
            precision = model.dtype
            notices.append(f"model.dtype is replaced by model.precision: read as model.precision: {model.dtype}")
        else:
            notices.append(f"model.dtype ({model.dtype}) is ignored: model.precision ({precision}) is set")
    if model.decode_dtype != "auto":
        notices.append(f"model.decode_dtype ({model.decode_dtype}) no longer applies: the weights are kept once, "
                       "and the kernel for decode steps is chosen by measurement (model.precision)")
    return precision, notices


def is_loopback_host(host: str) -> bool:
    """True when ``host`` only listens locally: ``localhost`` or a loopback
    IPv4/IPv6 address (``127.0.0.0/8``, ``::1``). Any other name or address
    (``0.0.0.0``, ``::``, a hostname) is not loopback."""
    name = host.strip().lower().rstrip(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


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
    needed = model.max_prefix_tokens + model.max_suffix_tokens + completion.max_tokens
    if needed > model.max_context:
        problems.items.append(
            f"{problems.where('model.max_context')}: model.max_context = {model.max_context}: "
            f"too small for model.max_prefix_tokens ({model.max_prefix_tokens}) + "
            f"model.max_suffix_tokens ({model.max_suffix_tokens}) + "
            f"completion.max_tokens ({completion.max_tokens}) = {needed}; "
            "expected max_context >= their sum"
        )


def _build(
    data: object,
    source: str,
    lines: Mapping[str, int],
    base: Path | None,
    source_path: Path | None,
) -> Config:
    problems = _Problems(source, lines)
    if data is None:
        return Config(source=source_path)
    if not isinstance(data, dict):
        raise ConfigError(
            f"{source}: the top level must be a mapping of sections "
            f"({', '.join(_SECTIONS)}), got {_kind(data)} {_show(data)}",
            hint=_HINT,
        )
    sections: dict[str, Any] = {}
    for key, raw in data.items():
        if not isinstance(key, str) or key not in _SECTIONS:
            problems.unknown(str(key), key, list(_SECTIONS), _elsewhere(str(key), None))
            continue
        sections[key] = _build_section(key, _SECTIONS[key], raw, problems, base)
    problems.raise_if_any()
    config = Config(**sections, source=source_path)
    _cross_checks(config, problems)
    problems.raise_if_any()
    return config


def config_from_dict(
    data: Mapping[str, Any] | None, source: str = "<dict>", *, base_dir: Path | None = None
) -> Config:
    """Validate ``data`` (what the YAML file would parse to) into a Config.

    ``source`` names the origin in error messages. Relative paths are joined
    to ``base_dir`` when given, else kept as given. ``None`` or ``{}`` gives
    the defaults. The result's ``source`` is None. Raises ConfigError.
    """
    plain = dict(data) if isinstance(data, Mapping) else data
    return _build(plain, source, {}, base_dir, None)


# --------------------------------------------------------------------------
# Finding and reading the file.
# --------------------------------------------------------------------------


def find_config_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """The config file to load, by the search order in the module docstring,
    or None when there is none (use the defaults).

    Raises ConfigError when ``explicit`` or ``$SOLDAEMON_CONFIG`` names a
    path that is not an existing file: a path the user gave on purpose is
    never silently skipped.
    """
    if explicit is not None:
        return _must_exist(Path(explicit).expanduser(), "--config")
    env = os.environ.get(ENV_VAR)
    if env:
        return _must_exist(Path(env).expanduser(), f"${ENV_VAR}")
    for candidate in (Path.cwd() / CONFIG_FILENAME, config_home() / CONFIG_FILENAME):
        if candidate.is_file():
            return candidate
    return None


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
    """Record the 1-based line of every dotted key under ``node``; note
    duplicate keys (YAML would silently keep the last)."""
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
    """Parse YAML text; return the data and the line of each dotted key.
    Syntax errors become ConfigError naming ``source`` and the line."""
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
    """Find (see :func:`find_config_file`), read, parse and validate the
    config file. No file → ``Config.default()``; an empty file → the defaults
    with ``source`` set. Raises ConfigError (never a YAML or OS error)."""
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
    return _build(data, str(found), lines, found.parent, found)
