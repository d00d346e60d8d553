"""One frozen dataclass per section of the file; each field carries its
default and its check."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
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
    """How much of the document a prompt keeps, in tokens: the prefix window
    before the cursor, the suffix window after it, and the outline of what
    both leave out (0: no outline)."""

    prefix: int
    suffix: int
    outline: int


# The windows a model gets where model.max_prefix_tokens / max_suffix_tokens /
# max_outline_tokens say "auto" (the default), by the embedded model served.
# The 0.5B: llama.cpp's own /infill split (768 before, 256 after), no outline:
# on 128 block holes each same-run comparison found the outline worth no pass
# (15/15, 4/6, 13/14) and 1024 -> 768 at most 1-2 holes, for ~20 % (window)
# and ~13 % (outline) of a cold prompt's time (docs/quality.md).
# The 1.5B keeps the wider prompt: the outline won it a pass and it is the
# model chosen for quality. Any other model (a path, a remote server) gets
# GENERIC_WINDOWS.
WINDOWS_BY_MODEL: dict[str, PromptWindows] = {
    "qwen2.5-coder-0.5b": PromptWindows(768, 256, 0),
    "qwen2.5-coder-1.5b": PromptWindows(1024, 256, 128),
}
GENERIC_WINDOWS = PromptWindows(1024, 256, 128)

# Block candidates (completion.candidates "auto", the default), by the
# embedded model served: the 1.5B, the model chosen for quality, ranks 4
# (greedy 29 -> 34 of 128 block holes passing, its block e2e 1.72x with the
# samples drafted along the greedy answer, on a 2-core CPU; docs/quality.md,
# "Block candidates"). The 0.5B, chosen for speed, gained 1 of 64 at 4x and stays at 1;
# so does any other model (a path, a remote server).
CANDIDATES_BY_MODEL: dict[str, int] = {"qwen2.5-coder-1.5b": 4}


@dataclass(frozen=True)
class SolConfig:
    """``sol:`` — the Sol scheduler (layer prefetch, KV folding, weight
    offload) and the memory it may use."""

    # Sliding window over which per-layer activity is counted to decide which
    # layers stay resident and which are prefetched; seconds, > 0.
    layer_heatmap_window: float = setting(60.0, float_in(0.0, lo_open=True))
    # How many layers ahead of the one computing are fetched to the device;
    # layers, 0 (no prefetch) .. 16.
    prefetch_depth: int = setting(2, int_in(0, 16))
    # KV folding of parked sessions (runtime/kv/fold.py): a 64-token block whose
    # attention mass, relative to the most attended block, is under this is
    # stored as int8; in [0, 1], 0.0 = off. 0.1: measured, greedy output equal
    # to unfolded on 19/20 real holes, 32% of the KV folded (docs/memory.md).
    kv_folding_entropy_threshold: float = setting(0.1, float_in(0.0, hi=1.0))
    # Folding quantizes parked sessions only while the device's free memory
    # (RAM on a CPU) is under this (MB, or a fraction of the device's memory as
    # for memory_budget); with more free, parked sessions are only trimmed, a
    # copy (at 1k tokens on a 2-core CPU: 32 ms a switch against ~200 ms
    # quantized, docs/memory.md). null: always quantize.
    kv_folding_free_below: MemoryBudget | None = setting(MemoryBudget(fraction=0.2), budget_spec())
    # Granularity of weight offload: whole decoder layers or parameter blocks.
    weight_offload_policy: OffloadPolicy = setting(
        "layer", one_of(get_args(OffloadPolicy))
    )
    # When Sol's schedule misses (a prefetch not landed in time), wait this
    # long before falling back to the plain synchronous path; milliseconds, > 0.
    fallback_timeout_ms: float = setting(50.0, float_in(0.0, lo_open=True))
    # Device memory cap for weights + KV; None: no cap (all resident when it fits).
    memory_budget: MemoryBudget | None = setting(None, budget_spec())
    # Release the model's device memory after this long without a request;
    # seconds, >= 0, 0 = never.
    idle_release_s: float = setting(300.0, float_in(0.0))


@dataclass(frozen=True)
class ModelConfig:
    """``model:`` — which model, in which precision, with how much context."""

    # None: an embedded model (``name``); else a local Hugging Face model
    # directory or a .gguf file (then ``name`` does not apply).
    path: Path | None = setting(None, optional(file_path()))
    # Which embedded model: "auto" the largest installed one whose cold TTFT
    # and decode step, predicted from this machine's kernel timings, fit
    # ttft_budget_ms and decode_budget_ms (else the smallest); or a name.
    # The 1.5B is installed by pip install 'soldaemon[model-1-5b]'.
    name: ModelName = setting("auto", one_of(get_args(ModelName)))
    # auto's latency budget: a cold 1k-token prompt to its first token; ms, > 0.
    ttft_budget_ms: float = setting(250.0, float_in(0.0, lo_open=True))
    # auto's budget for one decode step; ms, > 0.
    decode_budget_ms: float = setting(50.0, float_in(0.0, lo_open=True))
    # The draft model of an embedded model: "auto" a smaller installed
    # embedded model (same tokenizer) when both fit in memory and the kernel
    # plan predicts drafting pays; "off"; or a name. draft_model (a path) wins.
    draft: DraftChoice = setting("auto", one_of(get_args(DraftChoice)))
    # The one format the weights are kept in, and so the kernels that read
    # them: "auto" measures the kernels on this machine at start-up (cached
    # per machine, model and torch version) and picks per phase (prefill,
    # decode/verify, output layer); or "float32", "bfloat16", "float16",
    # "int8" (int8 weights; the kernels still chosen by measurement), "int4"
    # (4-bit decoder layers, the output layer int8).
    precision: Precision = setting("auto", one_of(get_args(Precision)))
    # A second copy of the int8 weights in oneDNN's blocked layout, read by
    # every forward of more than one row (prompts, verifications, the typed
    # line) with the same bits: true where the kernel plan measures it
    # faster and free RAM holds it (never under sol.memory_budget); false.
    blocked_copy: bool = setting(True, boolean())
    # Longest prompt + completion the engine allocates for; tokens, 256..131072.
    max_context: int = setting(4096, int_in(256, 131072))
    # Document text before the cursor kept in the prompt; tokens, >= 1, or
    # "auto": the served model's own (WINDOWS_BY_MODEL: the 0.5B 768, the
    # 1.5B and any other model 1024). Read through windows().
    max_prefix_tokens: int | Auto = setting("auto", int_or_auto(1))
    # Document text after the cursor kept in the prompt; tokens, >= 0, or
    # "auto" (256 for every model today).
    max_suffix_tokens: int | Auto = setting("auto", int_or_auto(0))
    # A smaller model for speculative decoding; None: no draft model.
    draft_model: Path | None = setting(None, optional(file_path()))
    # FIM prompt layout: "psm" (prefix, suffix, middle) or "spm" (suffix
    # first: typing only appends, so the whole prompt before the cursor stays
    # in the KV cache; llama.cpp's spm_infill layout).
    fim_order: FimOrder = setting("psm", one_of(get_args(FimOrder)))
    # Where the middle of a PSM prompt starts: "cursor"; "line" (the cursor
    # line so far goes after the middle token, so typing on a line only
    # appends to the prompt); "sticky" (like "line", but the anchor stays
    # where the user started typing, for up to 8 lines, while the text
    # around is unchanged: Enter does not recompute the suffix either).
    fim_anchor: FimAnchor = setting("sticky", one_of(get_args(FimAnchor)))
    # Context from other files in the prompt; tokens, >= 0.
    max_context_tokens: int = setting(1024, int_in(0))
    # Outline of what the prefix and suffix windows cut off, kept from the
    # context budget; tokens, >= 0 (0: off), or "auto": the served model's
    # own (the 0.5B 0, the 1.5B and any other model 128).
    max_outline_tokens: int | Auto = setting("auto", int_or_auto(0))
    # Documents whose KV cache is kept (an LRU, one cache of max_context each).
    kv_sessions: int = setting(4, int_in(1, 64))

    def windows(self, served: str | None = None) -> PromptWindows:
        """The prompt's windows: each key as set, an ``"auto"`` one the
        model ``served``'s (an embedded model's name; None: ``name``). A
        ``path``, and ``name: auto`` before the daemon has chosen, get
        :data:`GENERIC_WINDOWS`."""
        own = GENERIC_WINDOWS if self.path is not None else WINDOWS_BY_MODEL.get(served or self.name, GENERIC_WINDOWS)
        return PromptWindows(own.prefix if self.max_prefix_tokens == "auto" else self.max_prefix_tokens,
                             own.suffix if self.max_suffix_tokens == "auto" else self.max_suffix_tokens,
                             own.outline if self.max_outline_tokens == "auto" else self.max_outline_tokens)

    def served_by(self, served: str | None) -> ModelConfig:
        """This section with every ``"auto"`` window replaced by the model
        ``served``'s (``load_engine`` calls it once the model is chosen)."""
        w = self.windows(served)
        return replace(self, max_prefix_tokens=w.prefix, max_suffix_tokens=w.suffix, max_outline_tokens=w.outline)


@dataclass(frozen=True)
class DeviceConfig:
    """``device:`` — where the model runs."""

    # "auto" (CUDA when available, else CPU), "cpu", "cuda" or "cuda:N".
    device: str = setting("auto", device_spec())
    # CPU threads for torch; None: torch's default; else >= 1.
    threads: int | None = setting(None, optional(int_in(1)))
    # Decode steps replayed from CUDA graphs on a CUDA device (captured at
    # warm-up; eager fallback when capture fails). Ignored on a CPU.
    cuda_graphs: bool = setting(True, boolean())


@dataclass(frozen=True)
class ServerConfig:
    """``server:`` — the websocket server."""

    host: str = setting("127.0.0.1", nonempty_text())
    # TCP port; 0 = pick a free port.
    port: int = setting(8765, int_in(0, 65535))
    # Must be true to listen on a host that is not loopback.
    allow_remote: bool = setting(False, boolean())
    # Browser Origin headers accepted besides none; empty: no browser origins.
    allowed_origins: tuple[str, ...] = setting((), str_list())
    # None: state_dir()/token (see token_path()).
    token_file: Path | None = setting(None, optional(file_path()))
    # Largest incoming websocket message; bytes, >= 1.
    max_message_bytes: int = setting(1_048_576, int_in(1))
    # Messages accepted per second on one connection; > 0.
    rate_limit_per_s: float = setting(200.0, float_in(0.0, lo_open=True))
    # On shutdown, wait this long for in-flight requests; seconds, >= 0.
    drain_timeout_s: float = setting(5.0, float_in(0.0))
    # Exit after this long with no connection (a daemon an editor started);
    # seconds, >= 0; 0 = never.
    idle_exit_s: float = setting(0.0, float_in(0.0))

    def token_path(self) -> Path:
        """The token file: ``token_file`` or ``state_dir()/token`` (resolved
        now, so it follows ``SOLDAEMON_STATE_DIR``)."""
        return self.token_file if self.token_file is not None else default_token_path()

    def fallback(self) -> Fallback:
        """What :func:`soldaemon.discovery.find_daemon` takes from this
        section: the token file and ``allow_remote``. No address: a client
        sends the token only to a daemon its record names, never to
        whatever listens on ``port`` while the daemon is down."""
        return Fallback(None, self.token_path(), self.allow_remote, "sol_config.yaml")


@dataclass(frozen=True)
class CompletionConfig:
    """``completion:`` — defaults for a completion request (a request's own
    fields override them)."""

    # Generated tokens, hard cap; 1..2048.
    max_tokens: int = setting(128, int_in(1, 2048))
    # Lines in a completion, cap; >= 1.
    max_lines: int = setting(8, int_in(1))
    multiline: Multiline = setting("auto", one_of(get_args(Multiline)))
    # 0 = greedy; >= 0.
    temperature: float = setting(0.0, float_in(0.0))
    # Nucleus sampling mass; in (0, 1].
    top_p: float = setting(1.0, float_in(0.0, lo_open=True, hi=1.0))
    # Wall-clock budget from arrival; milliseconds, > 0; None: no budget.
    budget_ms: float | None = setting(None, optional(float_in(0.0, lo_open=True)))
    # Use speculative decoding when a draft is available.
    speculative: bool = setting(True, boolean())
    # Tokens proposed per speculative step; 1..64.
    draft_tokens: int = setting(8, int_in(1, 64))
    # Token healing for a cursor after text on its line: the prompt's last
    # token is left out and the first generated token must agree with it
    # (local backend; docs/quality.md).
    token_healing: bool = setting(True, boolean())
    # Speculative FIM: after a completion is delivered, compute the next one
    # as if the user accepts it, at the lowest priority, stopped by any
    # request (local backend; docs/config.md).
    speculative_fim: bool = setting(True, boolean())
    # Who ends a multi-line completion: "model" = its own end token, cut only
    # where provably wrong and parse-checked with the suffix (languages with
    # a tree-sitter grammar); "rules" = the text rules alone (docs/config.md).
    block_end: BlockEnd = setting("model", one_of(get_args(BlockEnd)))
    # When a greedy answer's first line, on a line of its own, is the line
    # below the cursor (dropped: it would show that line twice), decode again
    # from the model's closest other choice in that line (local backend;
    # docs/config.md).
    second_choice: bool = setting(True, boolean())
    # A greedy single multi-line answer: decode this many candidates (the
    # greedy one, the others sampled) and show the one the model is surest
    # of (mean log-probability per token; local backend; docs/config.md);
    # 1..8, 1 = the greedy answer alone; "auto": the served model's
    # (CANDIDATES_BY_MODEL: 4 for the 1.5B, 1 for any other).
    candidates: int | Auto = setting("auto", int_or_auto(1, 8))

    def candidate_count(self, served: str | None = None) -> int:
        """How many block candidates: the number set, or for ``"auto"`` the
        model ``served``'s (1 when none is known yet)."""
        if self.candidates != "auto":
            return self.candidates
        return CANDIDATES_BY_MODEL.get(served or "", 1)

    def served_by(self, served: str | None) -> CompletionConfig:
        """This section with ``"auto"`` settings replaced by the model
        ``served``'s (``load_engine`` calls it once the model is chosen)."""
        return replace(self, candidates=self.candidate_count(served))


@dataclass(frozen=True)
class BackendConfig:
    """``backend:`` — where completions are computed: ``local`` (the Sol
    runtime in this process) or ``remote`` (an inference engine speaking the
    OpenAI-compatible ``/v1/completions`` streaming API: vLLM, TGI, a
    llama.cpp server; see docs/remote.md)."""

    kind: BackendKind = setting("local", one_of(get_args(BackendKind)))
    # The engine's base URL (``http://host:8000`` or ``http://host:8000/v1``);
    # required when kind is "remote".
    url: str | None = setting(None, optional(http_url()))
    # The model name sent in each request; None: the engine's only model.
    model_name: str | None = setting(None, optional(nonempty_text()))
    # Name of the environment variable holding the API key (never the key).
    api_key_env: str | None = setting(None, optional(env_name()))
    # A file whose first line is the API key (used when api_key_env is unset
    # or names an empty variable).
    api_key_file: Path | None = setting(None, optional(file_path()))
    # Tokenizer of the remote model's family, for FIM prompts: a Hugging Face
    # model/tokenizer directory or a .gguf file; None: model.path's, else the
    # embedded model's (Qwen2.5-Coder: every size shares it).
    tokenizer: Path | None = setting(None, optional(file_path()))
    # How the prompt is sent: "text" (special tokens as text; every engine)
    # or "tokens" (token ids; vLLM and the native llama.cpp server).
    prompt_format: PromptFormat = setting("text", one_of(get_args(PromptFormat)))
    # Connecting to the engine; seconds, > 0.
    connect_timeout_s: float = setting(2.0, float_in(0.0, lo_open=True))
    # Waiting for the engine's answer: its first byte, then each streamed
    # chunk; seconds, > 0.
    timeout_s: float = setting(30.0, float_in(0.0, lo_open=True))
    # Extra connection attempts within one request when the engine cannot be
    # reached (never after text was streamed); 0..5.
    retries: int = setting(1, int_in(0, 5))
    # Wait after the first failed attempt; doubles per consecutive failure up
    # to max_backoff_s. While it runs, requests fail at once (retryable) or
    # go to the local model; seconds, > 0.
    backoff_s: float = setting(0.5, float_in(0.0, lo_open=True))
    max_backoff_s: float = setting(30.0, float_in(0.0, lo_open=True))
    # Reachability probe (GET /v1/models) for health, cached this long;
    # seconds, > 0.
    health_interval_s: float = setting(5.0, float_in(0.0, lo_open=True))
    # When the engine is unreachable, answer from the local model (model.path
    # or the embedded one), loaded on first need.
    fallback_local: bool = setting(False, boolean())
    # Send untitled buffers (never saved, no file name) to the remote engine;
    # off: completing in one is refused there (the local backend still may).
    send_untitled: bool = setting(False, boolean())
    # Allow a plain http:// url to a host that is not loopback (the API key
    # and every prompt cross the network in clear text); off: refused.
    allow_insecure: bool = setting(False, boolean())


SECTIONS: dict[str, type[Any]] = {
    "sol": SolConfig,
    "model": ModelConfig,
    "device": DeviceConfig,
    "server": ServerConfig,
    "completion": CompletionConfig,
    "backend": BackendConfig,
}

