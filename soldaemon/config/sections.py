"""One frozen dataclass per section of the file; each field carries its
default and its check. docs/config.md describes every key and why it is there."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, get_args

from soldaemon.api import Multiline
from soldaemon.discovery import Fallback, default_token_path

from soldaemon.config.budget import MemoryBudget
from soldaemon.config.checks import (boolean, budget_spec, device_spec, env_name, file_path, float_in, http_url, int_in,
                                     int_or_auto, nonempty_text, one_of, optional, setting, str_list)

OffloadPolicy = Literal["layer", "block"]
BlockEnd = Literal["model", "rules"]
Precision = Literal["auto", "float32", "bfloat16", "float16", "int8", "int4"]
BackendKind = Literal["local", "remote"]
PromptFormat = Literal["text", "tokens"]
FimOrder = Literal["psm", "spm"]
ModelName = Literal["auto", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]
DraftChoice = Literal["auto", "off", "qwen2.5-coder-0.5b"]
FimAnchor = Literal["cursor", "line", "sticky"]
Auto = Literal["auto"]


@dataclass(frozen=True)
class PromptWindows:
    """How much of the document a prompt keeps, in tokens (outline 0: none)."""

    prefix: int
    suffix: int
    outline: int


# The "auto" windows by embedded model served (docs/quality.md); any other model: GENERIC_WINDOWS.
WINDOWS_BY_MODEL: dict[str, PromptWindows] = {
    "qwen2.5-coder-0.5b": PromptWindows(768, 256, 0),
    "qwen2.5-coder-1.5b": PromptWindows(1024, 256, 128),
}
GENERIC_WINDOWS = PromptWindows(1024, 256, 128)

# The "auto" block candidates by embedded model served (docs/quality.md); any other model: 1.
CANDIDATES_BY_MODEL: dict[str, int] = {"qwen2.5-coder-1.5b": 4}


@dataclass(frozen=True)
class SolConfig:
    """``sol:`` — the Sol scheduler (prefetch, KV folding, offload) and the memory it may use."""

    # window over which per-layer activity decides residency and prefetch; s
    layer_heatmap_window: float = setting(60.0, float_in(0.0, lo_open=True))
    # layers fetched ahead of the one computing (0: no prefetch)
    prefetch_depth: int = setting(2, int_in(0, 16))
    # a parked 64-token KV block with relative attention mass under this is kept int8 (0: off; docs/memory.md)
    kv_folding_entropy_threshold: float = setting(0.1, float_in(0.0, hi=1.0))
    # fold only while free device memory is under this (else only trim); None: always
    kv_folding_free_below: MemoryBudget | None = setting(MemoryBudget(fraction=0.2), budget_spec())
    # weight offload by whole decoder layers or parameter blocks
    weight_offload_policy: OffloadPolicy = setting(
        "layer", one_of(get_args(OffloadPolicy))
    )
    # wait for a late prefetch this long before the synchronous path; ms
    fallback_timeout_ms: float = setting(50.0, float_in(0.0, lo_open=True))
    # device memory cap for weights + KV; None: no cap
    memory_budget: MemoryBudget | None = setting(None, budget_spec())
    # release the model's device memory after this long idle; s, 0: never
    idle_release_s: float = setting(300.0, float_in(0.0))


@dataclass(frozen=True)
class ModelConfig:
    """``model:`` — which model, in which precision, with how much context."""

    # a Hugging Face model directory or a .gguf file; None: the embedded model ``name``
    path: Path | None = setting(None, optional(file_path()))
    # "auto": the largest installed embedded model predicted to fit the two budgets below
    name: ModelName = setting("auto", one_of(get_args(ModelName)))
    # auto's budget for a cold 1k-token prompt to its first token; ms
    ttft_budget_ms: float = setting(250.0, float_in(0.0, lo_open=True))
    # auto's budget for one decode step; ms
    decode_budget_ms: float = setting(50.0, float_in(0.0, lo_open=True))
    # "auto": a smaller installed embedded model when both fit and drafting pays; draft_model wins
    draft: DraftChoice = setting("auto", one_of(get_args(DraftChoice)))
    # the weights' format; "auto": measured per phase on this machine (docs/kernels.md)
    precision: Precision = setting("auto", one_of(get_args(Precision)))
    # a blocked-layout copy of int8 weights for multi-row forwards, where measured faster and RAM holds it
    blocked_copy: bool = setting(True, boolean())
    # longest prompt + completion allocated for; tokens
    max_context: int = setting(4096, int_in(256, 131072))
    # the prefix window; tokens, or "auto" (WINDOWS_BY_MODEL); read through windows()
    max_prefix_tokens: int | Auto = setting("auto", int_or_auto(1))
    # the suffix window; tokens, or "auto"
    max_suffix_tokens: int | Auto = setting("auto", int_or_auto(0))
    # a smaller model for speculative decoding
    draft_model: Path | None = setting(None, optional(file_path()))
    # the FIM layout: prefix-suffix-middle, or suffix first (typing only appends)
    fim_order: FimOrder = setting("psm", one_of(get_args(FimOrder)))
    # where a PSM prompt's middle starts: the cursor, the line, or where typing began (sticky)
    fim_anchor: FimAnchor = setting("sticky", one_of(get_args(FimAnchor)))
    # context from other files; tokens
    max_context_tokens: int = setting(1024, int_in(0))
    # the outline of what the windows cut off, from the context budget; tokens (0: off), or "auto"
    max_outline_tokens: int | Auto = setting("auto", int_or_auto(0))
    # documents whose KV cache is kept (LRU)
    kv_sessions: int = setting(4, int_in(1, 64))

    def windows(self, served: str | None = None, own: PromptWindows | None = None) -> PromptWindows:
        """The prompt's windows; an ``"auto"`` one is ``own``'s (the engine's fit), else the
        embedded model ``served``'s (None: ``name``; with a ``path``: :data:`GENERIC_WINDOWS`)."""
        if own is None:
            own = GENERIC_WINDOWS if self.path is not None else WINDOWS_BY_MODEL.get(served or self.name,
                                                                                   GENERIC_WINDOWS)
        return PromptWindows(own.prefix if self.max_prefix_tokens == "auto" else self.max_prefix_tokens,
                             own.suffix if self.max_suffix_tokens == "auto" else self.max_suffix_tokens,
                             own.outline if self.max_outline_tokens == "auto" else self.max_outline_tokens)

    def served_by(self, served: str | None, own: PromptWindows | None = None) -> ModelConfig:
        """This section with every ``"auto"`` window ``own`` or else the model ``served``'s."""
        w = self.windows(served, own)
        return replace(self, max_prefix_tokens=w.prefix, max_suffix_tokens=w.suffix, max_outline_tokens=w.outline)


@dataclass(frozen=True)
class DeviceConfig:
    """``device:`` — where the model runs."""

    # "auto" (CUDA when available), "cpu", "cuda" or "cuda:N"
    device: str = setting("auto", device_spec())
    # CPU threads for torch; None: torch's default
    threads: int | None = setting(None, optional(int_in(1)))
    # replay decode steps from CUDA graphs (ignored on a CPU)
    cuda_graphs: bool = setting(True, boolean())


@dataclass(frozen=True)
class ServerConfig:
    """``server:`` — the websocket server."""

    host: str = setting("127.0.0.1", nonempty_text())
    # 0: a free port
    port: int = setting(8765, int_in(0, 65535))
    # needed to listen on a host that is not loopback
    allow_remote: bool = setting(False, boolean())
    # browser Origin headers accepted besides none
    allowed_origins: tuple[str, ...] = setting((), str_list())
    # None: state_dir()/token
    token_file: Path | None = setting(None, optional(file_path()))
    # largest incoming websocket message; bytes
    max_message_bytes: int = setting(1_048_576, int_in(1))
    # messages accepted per second on one connection
    rate_limit_per_s: float = setting(200.0, float_in(0.0, lo_open=True))
    # on shutdown, wait this long for requests in flight; s
    drain_timeout_s: float = setting(5.0, float_in(0.0))
    # exit after this long with no connection; s, 0: never
    idle_exit_s: float = setting(0.0, float_in(0.0))

    def token_path(self) -> Path:
        """``token_file``, or ``state_dir()/token`` resolved now."""
        return self.token_file if self.token_file is not None else default_token_path()

    def fallback(self) -> Fallback:
        """What :func:`find_daemon` takes."""
        return Fallback(self.token_path(), self.allow_remote)


@dataclass(frozen=True)
class CompletionConfig:
    """``completion:`` — defaults for a request (its own fields override them)."""

    max_tokens: int = setting(128, int_in(1, 2048))
    max_lines: int = setting(8, int_in(1))
    multiline: Multiline = setting("auto", one_of(get_args(Multiline)))
    # 0: greedy
    temperature: float = setting(0.0, float_in(0.0))
    top_p: float = setting(1.0, float_in(0.0, lo_open=True, hi=1.0))
    # wall-clock budget from arrival; ms, None: none
    budget_ms: float | None = setting(None, optional(float_in(0.0, lo_open=True)))
    # speculative decoding when a draft is available
    speculative: bool = setting(True, boolean())
    # tokens proposed per speculative step
    draft_tokens: int = setting(8, int_in(1, 64))
    # leave the prompt's last token out; the first generated must agree with it (local)
    token_healing: bool = setting(True, boolean())
    # compute the next completion as if this one is accepted, at the lowest priority (local)
    speculative_fim: bool = setting(True, boolean())
    # who ends a multi-line completion: the model (parse-checked) or the text rules
    block_end: BlockEnd = setting("model", one_of(get_args(BlockEnd)))
    # decode again from the next choice when the first line repeats the line below (local)
    second_choice: bool = setting(True, boolean())
    # block candidates ranked by mean log-probability (1: greedy alone), or "auto" (local)
    candidates: int | Auto = setting("auto", int_or_auto(1, 8))

    def candidate_count(self, served: str | None = None) -> int:
        """How many block candidates (``"auto"``: the model ``served``'s)."""
        if self.candidates != "auto":
            return self.candidates
        return CANDIDATES_BY_MODEL.get(served or "", 1)

    def served_by(self, served: str | None) -> CompletionConfig:
        """This section with ``"auto"`` settings the model ``served``'s."""
        return replace(self, candidates=self.candidate_count(served))


@dataclass(frozen=True)
class BackendConfig:
    """``backend:`` — the Sol runtime here (``local``) or an OpenAI-compatible engine (remote)."""

    kind: BackendKind = setting("local", one_of(get_args(BackendKind)))
    # the engine's base URL, required when remote
    url: str | None = setting(None, optional(http_url()))
    # None: the engine's only model
    model_name: str | None = setting(None, optional(nonempty_text()))
    api_key_env: str | None = setting(None, optional(env_name()))
    # a file whose first line is the API key (when api_key_env gives none)
    api_key_file: Path | None = setting(None, optional(file_path()))
    # the remote model family's tokenizer; None: model.path's, else the embedded model's
    tokenizer: Path | None = setting(None, optional(file_path()))
    # the prompt as text (every engine) or token ids (vLLM, llama.cpp's server)
    prompt_format: PromptFormat = setting("text", one_of(get_args(PromptFormat)))
    connect_timeout_s: float = setting(2.0, float_in(0.0, lo_open=True))
    # for the first byte, then each chunk; s
    timeout_s: float = setting(30.0, float_in(0.0, lo_open=True))
    # extra connection attempts within a request (never after text streamed)
    retries: int = setting(1, int_in(0, 5))
    # wait after a failure, doubling up to max_backoff_s; meanwhile requests fail at once; s
    backoff_s: float = setting(0.5, float_in(0.0, lo_open=True))
    max_backoff_s: float = setting(30.0, float_in(0.0, lo_open=True))
    # the reachability probe (GET /v1/models) is cached this long; s
    health_interval_s: float = setting(5.0, float_in(0.0, lo_open=True))
    # answer from the local model while the engine is unreachable
    fallback_local: bool = setting(False, boolean())
    # send untitled buffers to the remote engine
    send_untitled: bool = setting(False, boolean())
    # allow a clear-text http:// url to a host that is not loopback
    allow_insecure: bool = setting(False, boolean())


SECTIONS: dict[str, type[Any]] = {
    "sol": SolConfig,
    "model": ModelConfig,
    "device": DeviceConfig,
    "server": ServerConfig,
    "completion": CompletionConfig,
    "backend": BackendConfig,
}

