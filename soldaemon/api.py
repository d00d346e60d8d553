"""The contract between the front doors (websocket, CLI, benchmark) and an
inference engine. Pure data: no torch, no asyncio.

An :class:`Engine` turns a :class:`CompletionRequest` into a stream of
:class:`Delta` events ending in exactly one :class:`Done`. It is driven from one
worker thread; the caller cancels it through a :class:`CancelToken`, which the
engine checks between prefill chunks and before every decode step, so a cancel
takes effect within one step.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Protocol

Multiline = Literal["auto", "single", "multi"]
Priority = Literal["normal", "high"]
# Why a completion ended. "stop": a stop token, the end of the hole, or a
# post-processing cut; "length": max_tokens; "budget": budget_ms ran out;
# "cancelled": the client cancelled or disconnected; "superseded": a newer
# request for the same document replaced it; "error": see the error frame.
FinishReason = Literal["stop", "length", "budget", "cancelled", "superseded", "error"]


@dataclass(frozen=True)
class ContextChunk:
    """Extra context from another file (or another part of this one)."""

    uri: str
    text: str


@dataclass(frozen=True)
class CompletionRequest:
    id: str                                # client-chosen, unique per connection
    prefix: str                            # document text before the cursor
    suffix: str                            # document text after the cursor
    uri: str = "untitled:"                 # document identity (supersede key)
    version: int | None = None             # editor's document version
    language: str | None = None            # LSP language id ("python", ...)
    context: tuple[ContextChunk, ...] = ()
    max_tokens: int = 128                  # generated tokens, hard cap (config completion.max_tokens)
    budget_ms: float | None = None         # wall-clock budget from arrival, ms
    multiline: Multiline = "auto"
    priority: Priority = "normal"
    temperature: float = 0.0               # 0 → greedy
    top_p: float = 1.0
    n: int = 1                             # candidates (n > 1 needs temperature > 0)
    seed: int | None = None
    received_ns: int = 0                   # time.perf_counter_ns() at arrival (0: when the engine starts it)


@dataclass(frozen=True)
class Timings:
    """Per-request stage timings. Every figure the API, the logs and the
    benchmark report comes from here."""

    queue_ms: float = 0.0                  # arrival → worker picks it up
    prompt_ms: float = 0.0                 # windowing + tokenizing + FIM template
    prefill_ms: float = 0.0                # forward over the computed prompt tokens
    ttft_ms: float = 0.0                   # arrival → first token sampled
    decode_ms: float = 0.0                 # first token → last token
    total_ms: float = 0.0                  # arrival → done
    prompt_tokens: int = 0                 # tokens in the full prompt
    cached_tokens: int = 0                 # prompt tokens whose KV was reused
    generated_tokens: int = 0              # tokens sampled (incl. accepted drafts)
    draft_tokens: int = 0                  # speculative tokens proposed
    accepted_tokens: int = 0               # speculative tokens accepted
    ttft_start_ns: int = 0                 # time.time_ns() at arrival
    ttft_end_ns: int = 0                   # time.time_ns() at first token
    source: str = "model"                  # "model" | "type-through" (from the last completion) | "resumed" (a superseded generation continued) | "speculative" (computed ahead, runtime/engine/foresight.py)

    @property
    def tokens_per_s(self) -> float:
        if self.generated_tokens <= 1 or self.decode_ms <= 0:
            return 0.0
        return (self.generated_tokens - 1) / (self.decode_ms / 1000.0)


@dataclass(frozen=True)
class Delta:
    """Streamed text, appended in order. Never splits a UTF-8 character."""

    id: str
    text: str


@dataclass(frozen=True)
class Done:
    """The last event of a request. ``items`` are the final, post-processed
    completions; a client shows these (the deltas are a preview of item 0)."""

    id: str
    items: tuple[str, ...]
    finish_reason: FinishReason
    timings: Timings = field(default_factory=Timings)
    # per item, why it ends where it does: "model" (its end token) or a cut
    # rule (soldaemon.pipeline.ending); () when not known
    ends: tuple[str, ...] = ()
    # the streamed answer (what the deltas previewed), post-processed, when
    # item 0 is another one: a block candidate chosen over it
    # (soldaemon.pipeline.candidates); None otherwise
    streamed: str | None = None


Event = Delta | Done


class CancelToken:
    """Set once, by any thread, through one of two named operations; read by
    the engine between steps. :meth:`cancel`: the client no longer wants the
    answer. :meth:`supersede`: a newer request for the same document took
    its place; a generation that request may go on with is parked, not
    ended (the local model part). The first operation wins."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._superseded = False

    def cancel(self) -> None:
        self._stop(superseded=False)

    def supersede(self) -> None:
        self._stop(superseded=True)

    def _stop(self, *, superseded: bool) -> None:
        if not self._event.is_set():
            self._superseded = superseded
            self._event.set()

    @property
    def cancelled(self) -> bool:
        """Stopped, by either operation."""
        return self._event.is_set()

    @property
    def superseded(self) -> bool:
        """Stopped by :meth:`supersede`."""
        return self._event.is_set() and self._superseded

    @property
    def reason(self) -> FinishReason:
        """The wire's finish reason of an answer this token stopped."""
        return "superseded" if self.superseded else "cancelled"

    def finish(self, reason: FinishReason) -> FinishReason:
        """The finish reason of an answer that ended with ``reason``: one the
        engine ended because this token was stopped ("cancelled" or
        "superseded") is told by the operation that stopped it."""
        return self.reason if self.cancelled and reason in ("cancelled", "superseded") else reason


class Engine(Protocol):
    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        """Stream a completion. Yields zero or more ``Delta`` then one ``Done``.
        Raises ``SolError`` subclasses for bad requests; never anything else
        for a request problem."""
        ...

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Prefill the prompt of ``req`` into the KV cache; generate nothing."""
        ...

    def diagnosis(self) -> dict[str, Any]:
        """The ``sol_diagnosis`` object: active, ttft_optimized,
        prefetch_hit_rate, kv_fold_ratio, offloaded_layers."""
        ...

    def info(self) -> dict[str, Any]:
        """Model name, device, dtype, context length, threads."""
        ...


# What an editor client sends of a document around the cursor (sol-lsp's
# defaults, and what ``bench --quality`` gives the daemon so that its figures
# are an editor's): the token windows take their part, and the outline
# (``soldaemon.fim.outline``) reads the rest.
DOCUMENT_PREFIX_CHARS = 128_000
DOCUMENT_SUFFIX_CHARS = 64_000
DOCUMENT_GRAIN = 4096   # chars: the start of the prefix sent moves in these steps (the KV cache keeps its start)


def document_window(text: str, offset: int, max_prefix_chars: int = DOCUMENT_PREFIX_CHARS,
                    max_suffix_chars: int = DOCUMENT_SUFFIX_CHARS) -> tuple[int, int]:
    """``(start, end)``: the part of ``text`` around the cursor at
    ``offset`` a client sends, at most ``max_prefix_chars`` before it and
    ``max_suffix_chars`` after it. The start moves in steps of
    :data:`DOCUMENT_GRAIN` and then to the next line start (nearby cursors
    share the prefix's start), the end is cut after a line's newline."""
    start = max(0, offset - max_prefix_chars)
    if start > 0:
        start = min(offset, -(-start // DOCUMENT_GRAIN) * DOCUMENT_GRAIN)
        newline = text.find("\n", start, offset)
        start = newline + 1 if newline != -1 else start
    end = min(len(text), offset + max_suffix_chars)
    if end < len(text):
        newline = text.rfind("\n", offset, end)
        end = newline + 1 if newline != -1 else end
    return start, end
