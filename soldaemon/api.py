"""The contract between the front doors (websocket, CLI, benchmark) and an inference engine.
Pure data: no torch, no asyncio."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any, Iterator, Literal, Protocol

Multiline = Literal["auto", "single", "multi"]
Priority = Literal["normal", "high"]
# Why a completion ended: "stop" (a stop token, the hole's end or a cut), "length" (max_tokens),
# "budget" (budget_ms), "cancelled", "superseded" (by a newer request for the document), "error".
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
    max_tokens: int = 128                  # generated tokens, hard cap (completion.max_tokens)
    budget_ms: float | None = None         # wall-clock budget from arrival, ms
    multiline: Multiline = "auto"
    priority: Priority = "normal"
    temperature: float = 0.0               # 0 → greedy
    top_p: float = 1.0
    n: int = 1                             # candidates (n > 1 needs temperature > 0)
    seed: int | None = None
    received_ns: int = 0                   # perf_counter_ns() at arrival (0: engine start)


@dataclass(frozen=True)
class Timings:
    """Per-request stage timings: the source of every figure the API, logs and benchmark
    report. ``source``: "model", "type-through" (from the last completion), "resumed" (a
    superseded generation continued) or "speculative" (computed ahead)."""

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
    source: str = "model"                  # see the class doc

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
    """The last event of a request. ``items`` are the final completions a client shows (the
    deltas preview item 0)."""

    id: str
    items: tuple[str, ...]
    finish_reason: FinishReason
    timings: Timings = field(default_factory=Timings)
    # per item: "model" (its end token) or the cut rule that ended it; () when not known
    ends: tuple[str, ...] = ()
    # the post-processed streamed answer when a block candidate replaced it as item 0
    streamed: str | None = None


Event = Delta | Done


class CancelToken:
    """Set once, by any thread; the first operation wins. The engine reads it between steps.
    :meth:`cancel`: the client no longer wants the answer. :meth:`supersede`: a newer request
    for the same document took its place (a generation it may go on with is parked)."""

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
        """The finish reason of an answer this token stopped: whoever stops on a token reports it."""
        return "superseded" if self.superseded else "cancelled"


class Engine(Protocol):
    """An inference engine, driven from one worker thread. It checks the :class:`CancelToken`
    between prefill chunks and before every decode step, so a stop takes effect within one step."""

    def complete(self, req: CompletionRequest, cancel: CancelToken) -> Iterator[Event]:
        """Stream a completion: zero or more ``Delta`` then one ``Done``. Request problems raise
        ``SolError`` subclasses only."""
        ...

    def warm(self, req: CompletionRequest, cancel: CancelToken) -> Timings:
        """Prefill the prompt of ``req`` into the KV cache; generate nothing."""
        ...

    def diagnosis(self) -> dict[str, Any]:
        """The ``sol_diagnosis`` fields (see ``SOL_DIAGNOSIS_KEYS``) and engine counters."""
        ...

    def info(self) -> dict[str, Any]:
        """Model name, device, dtype, context length, threads."""
        ...


# How much of a document an editor client sends around the cursor (sol-lsp's defaults, also
# used by ``bench --quality``); the outline (``soldaemon.fim.outline``) reads beyond the windows.
DOCUMENT_PREFIX_CHARS = 128_000
DOCUMENT_SUFFIX_CHARS = 64_000
DOCUMENT_GRAIN = 4096   # chars: the prefix start moves in these steps (the KV cache keeps it)


def document_window(text: str, offset: int, max_prefix_chars: int = DOCUMENT_PREFIX_CHARS,
                    max_suffix_chars: int = DOCUMENT_SUFFIX_CHARS) -> tuple[int, int]:
    """``(start, end)`` of the text a client sends around ``offset``: the start rounded up to
    :data:`DOCUMENT_GRAIN`, then to a line start (nearby cursors share it); the end follows a
    newline."""
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
