"""llama.vscode's completion client, as its users run it: the ``/infill``
request it sends, how it post-processes the answer, its completion cache and
its speculative FIM after a shown suggestion.

Learned from ggml-org/llama.vscode (MIT; ``src/completion.ts``,
``src/llama-server.ts``, ``src/utils.ts``, ``package.json``'s settings
defaults, ``README.md``'s server commands) and llama.cpp's ``/infill``
handling (``tools/server/server-context.cpp``); written here from that
reading, not copied. ``docs/bench.md`` ("The llama.vscode column") lists
each behaviour and where it comes from.

Pure logic except :class:`LlamaVscodeClient`, which talks HTTP to a running
``llama-server`` (:mod:`soldaemon_bench.quality.llama_server`).
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


@dataclass(frozen=True)
class ClientSettings:
    """llama.vscode's settings that shape a completion, at their defaults
    (``package.json`` ``contributes.configuration``)."""

    n_prefix: int = 256          # lines before the cursor line
    n_suffix: int = 64           # lines after the cursor line
    n_predict: int = 128         # tokens
    t_max_prompt_ms: int = 500   # sent; llama.cpp does not enforce it
    t_max_predict_ms: int = 500  # the server stops at the first newline after this long
    max_line_suffix: int = 8     # no automatic request with more characters right of the cursor
    max_cache_keys: int = 250    # LRU size of the completion cache


# Sent with every completion (``defaultRequestParams`` in src/llama-server.ts).
SAMPLING = {"top_k": 40, "top_p": 0.99, "stream": False, "samplers": ["top_k", "top_p", "infill"],
            "cache_prompt": True}


@dataclass(frozen=True)
class Context:
    """What the client reads around the cursor (``getCompletionItems``)."""

    input_prefix: str   # the n_prefix lines before the cursor line, each with "\n"
    input_suffix: str   # the cursor line right of the cursor, "\n", the n_suffix lines after, "\n"
    prompt: str         # the cursor line left of the cursor; "" when it is only blanks
    line_prefix: str    # the cursor line left of the cursor, as typed
    line_suffix: str    # the cursor line right of the cursor
    n_indent: int       # leading blanks of the whole cursor line
    spaces_to_remove: int  # len(line_prefix) when prompt was emptied, else 0
    next_lines: tuple[str, ...]   # the document's lines after the cursor line (for the discard rules)


def read_context(prefix: str, suffix: str, settings: ClientSettings = ClientSettings()) -> Context:
    """The client's view of a document ``prefix + suffix`` with the cursor
    between them. Lines split on "\\n" (as VS Code's ``lineAt``)."""
    before = prefix.split("\n")
    after = suffix.split("\n")
    line_prefix, line_suffix = before[-1], after[0]
    prefix_lines = before[:-1][-settings.n_prefix:] if settings.n_prefix > 0 else []
    next_lines = tuple(after[1:])
    suffix_lines = list(next_lines[: settings.n_suffix])
    line = line_prefix + line_suffix
    prompt, spaces = line_prefix, 0
    if re.fullmatch(r"[ \t]*", line_prefix):
        prompt, spaces = "", len(line_prefix)
    return Context(input_prefix="\n".join(prefix_lines) + "\n",
                   input_suffix=line_suffix + "\n" + "\n".join(suffix_lines) + "\n",
                   prompt=prompt, line_prefix=line_prefix, line_suffix=line_suffix,
                   n_indent=len(line) - len(line.lstrip()), spaces_to_remove=spaces, next_lines=next_lines)


def infill_body(input_prefix: str, input_suffix: str, prompt: str, n_indent: int,
                settings: ClientSettings = ClientSettings(), input_extra: list[dict[str, str]] | None = None,
                ) -> dict[str, Any]:
    """The JSON body of llama.vscode's ``POST /infill`` (``createRequestPayload``):
    ``n_indent`` only when non-zero; ``input_extra`` its ring of chunks
    (``[{"text", "time", "filename"}]``; empty here, see docs/bench.md)."""
    body: dict[str, Any] = {"input_prefix": input_prefix, "input_suffix": input_suffix,
                            "input_extra": list(input_extra or []), "prompt": prompt,
                            "n_predict": settings.n_predict, **SAMPLING}
    if n_indent:
        body["n_indent"] = n_indent
    body["t_max_prompt_ms"] = settings.t_max_prompt_ms
    body["t_max_predict_ms"] = settings.t_max_predict_ms
    return body


def request_body(ctx: Context, settings: ClientSettings = ClientSettings()) -> dict[str, Any]:
    """The ``/infill`` body for the cursor ``ctx`` describes."""
    return infill_body(ctx.input_prefix, ctx.input_suffix, ctx.prompt, ctx.n_indent, settings)


def suggestion_lines(content: str) -> list[str]:
    """The answer split on newlines, trailing blank lines dropped."""
    lines = re.split(r"\r?\n", content)
    while lines and lines[-1].strip() == "":
        lines.pop()
    return lines


def should_discard(lines: list[str], ctx: Context) -> bool:
    """llama.vscode's rules for dropping a suggestion that repeats the text
    already there (``shouldDiscardSuggestion``)."""
    if not lines or (len(lines) == 1 and lines[0].strip() == ""):
        return True
    doc = ctx.next_lines
    if not doc:                      # the cursor is on the last line
        return False
    if (len(lines) > 1 and (lines[0].strip() == "" or lines[0].strip() == ctx.line_suffix.strip())
            and all(i < len(doc) and v == doc[i] for i, v in enumerate(lines[1:]))):
        return True
    if len(lines) == 1 and lines[0] == ctx.line_suffix:
        return True
    first = next((i for i, text in enumerate(doc) if text.strip() != ""), None)
    if first is None:
        return False
    if ctx.line_prefix + lines[0] == doc[first]:
        if len(lines) == 1:
            return True
        if len(lines) == 2 and first + 1 < len(doc) and lines[1] == doc[first + 1][: len(lines[1])]:
            return True
        if len(lines) > 2 and all(first + 1 + i < len(doc) and v == doc[first + 1 + i]
                                  for i, v in enumerate(lines[1:])):
            return True
    return False


def update_suggestion(lines: list[str], line_suffix: str) -> str:
    """With text right of the cursor, only the first line is kept (minus that
    text when it ends with it); otherwise all lines (``updateSuggestion``)."""
    if line_suffix.strip() != "":
        if lines[0].endswith(line_suffix):
            return lines[0][: -len(line_suffix)] if line_suffix else lines[0]
        if len(lines) > 1:
            return lines[0]
    return "\n".join(lines)


def remove_leading_spaces(text: str, n: int) -> str:
    """Drop up to ``n`` leading spaces, and every leading tab, as the
    client's ``removeLeadingSpaces`` does (its loop condition lets tabs
    through regardless of ``n``)."""
    i = 0
    while i < len(text) and ((i < n and text[i] == " ") or text[i] == "\t"):
        i += 1
    return text[i:]


def shown_text(content: str, ctx: Context) -> tuple[str, list[str]] | None:
    """The server's ``content`` as the user sees it inserted at the cursor,
    and the suggestion lines the cache stores; None when discarded."""
    if content.strip() == "":
        return None
    lines = suggestion_lines(content)
    if should_discard(lines, ctx):
        return None
    return update_suggestion(lines, ctx.line_suffix), lines


class ResultCache:
    """llama.vscode's completion cache: an LRU of at most ``max_keys``
    answers keyed by the hash of ``input_prefix|input_suffix|prompt``."""

    def __init__(self, max_keys: int = 250) -> None:
        self.max_keys = max_keys
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(input_prefix: str, input_suffix: str, prompt: str) -> str:
        return hashlib.sha256(f"{input_prefix}|{input_suffix}|{prompt}".encode()).hexdigest()

    def get(self, key: str) -> str | None:
        with self._lock:
            if key not in self._data:
                return None
            self._data.move_to_end(key)
            return self._data[key]

    def put(self, key: str, value: str) -> None:
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_keys:
                self._data.popitem(last=False)

    def lookup(self, input_prefix: str, input_suffix: str, prompt: str) -> str | None:
        """The cached answer for this cursor, or one cached for a shorter
        ``prompt`` whose text the user has since typed (what is left of it):
        typing into a shown suggestion is answered from here
        (``getCachedCompletion``)."""
        hit = self.get(self.key(input_prefix, input_suffix, prompt))
        if hit is not None:
            return hit
        for i in range(len(prompt), -1, -1):
            typed = prompt[i:]
            hit = self.get(self.key(input_prefix, input_suffix, prompt[:i]))
            if hit is not None and hit[: len(typed)] == typed:
                return hit[len(typed):]
        return None


def future_requests(ctx: Context, lines: list[str], n_prefix: int) -> tuple[tuple[str, str, str], str | None]:
    """After a suggestion of ``lines`` was shown (and nothing is right of the
    cursor): the (prefix, suffix, prompt) llama.vscode speculatively requests
    for the state after the user accepts it (``cacheFutureSuggestion``), and,
    for a multi-line suggestion, the answer it caches without a request for
    the state after accepting its first line (``cacheFutureAcceptLineSuggestion``,
    keyed by prefix + first line + "\\n", prompt ""); None for one line."""
    prefix, suffix, prompt = ctx.input_prefix, ctx.input_suffix, ctx.prompt + lines[0]
    if len(lines) > 1:
        prefix = ctx.input_prefix + ctx.prompt + "\n".join(lines[:-1]) + "\n"
        prompt = lines[-1]
        kept = prefix[:-1].split("\n")
        if len(kept) > n_prefix:
            prefix = "\n".join(kept[len(kept) - n_prefix:]) + "\n"
    accept_line = "\n".join(lines[1:]) if len(lines) > 1 else None
    return (prefix, suffix, prompt), accept_line


class Infill(Protocol):
    """Something that answers a ``/infill`` body (the server, or a test's stand-in)."""

    def __call__(self, body: dict[str, Any]) -> dict[str, Any]: ...


@dataclass
class Answer:
    """One completion request as llama.vscode serves it."""

    text: str                 # inserted at the cursor ("" when discarded or no request)
    wait_ms: float            # from the keystroke to the suggestion (the whole answer: stream false)
    cached: bool              # answered from the completion cache
    requested: bool           # an /infill request was sent for it
    body: dict[str, Any] | None = None      # the request sent
    response: dict[str, Any] = field(default_factory=dict)   # the server's JSON


class LlamaVscodeClient:
    """The client side of one editor: request, post-processing, cache and
    speculative FIM against ``infill``.

    ``speculative``: after a shown suggestion with nothing right of the
    cursor, send the future request in a background thread, as llama.vscode
    does right after showing (the user's next keystroke does not wait for it,
    but competes with it on the server). ``use_cache``: False for a cold
    quality column."""

    def __init__(self, infill: Infill, settings: ClientSettings = ClientSettings(), *,
                 use_cache: bool = True, speculative: bool = True) -> None:
        self.infill = infill
        self.settings = settings
        self.cache = ResultCache(settings.max_cache_keys)
        self.use_cache = use_cache
        self.speculative = speculative
        self._background: list[threading.Thread] = []
        self.speculative_sent = 0

    def complete(self, prefix: str, suffix: str, *, automatic: bool = True,
                 clock: Callable[[], int] = time.perf_counter_ns) -> Answer:
        """The suggestion for the cursor between ``prefix`` and ``suffix``."""
        t0 = clock()
        ctx = read_context(prefix, suffix, self.settings)
        if automatic and len(ctx.line_suffix) > self.settings.max_line_suffix:
            return Answer("", (clock() - t0) / 1e6, cached=False, requested=False)
        key = ResultCache.key(ctx.input_prefix, ctx.input_suffix, ctx.prompt)
        content = self.cache.lookup(ctx.input_prefix, ctx.input_suffix, ctx.prompt) if self.use_cache else None
        cached = content is not None
        body, response = None, {}
        if content is None:
            body = request_body(ctx, self.settings)
            response = self.infill(body)
            content = str(response.get("content", ""))
        shown = shown_text(content, ctx)
        if shown is None:
            return Answer("", (clock() - t0) / 1e6, cached, not cached, body, response)
        text, lines = shown
        if not cached and self.use_cache:
            self.cache.put(key, text)
        wait_ms = (clock() - t0) / 1e6
        if self.speculative and self.use_cache and ctx.line_suffix.strip() == "":
            self._after_shown(ctx, lines)
        return Answer(remove_leading_spaces(text, ctx.spaces_to_remove), wait_ms, cached, not cached, body, response)

    def _after_shown(self, ctx: Context, lines: list[str]) -> None:
        (f_prefix, f_suffix, f_prompt), accept_line = future_requests(ctx, lines, self.settings.n_prefix)
        if accept_line is not None:
            key = ResultCache.key(ctx.input_prefix + ctx.prompt + lines[0] + "\n", ctx.input_suffix, "")
            if self.cache.get(key) is None:
                self.cache.put(key, accept_line)
        future_key = ResultCache.key(f_prefix, f_suffix, f_prompt)
        if self.cache.get(future_key) is not None:
            return
        body = infill_body(f_prefix, f_suffix, f_prompt, len(ctx.prompt) - len(ctx.prompt.lstrip()), self.settings)

        def fetch() -> None:
            try:
                content = str(self.infill(body).get("content", ""))
            except Exception:    # noqa: BLE001 -- as the client: a failed speculative request is dropped
                return
            if content.strip():
                self.cache.put(future_key, "\n".join(suggestion_lines(content)))

        self.speculative_sent += 1
        thread = threading.Thread(target=fetch, name="llama.vscode speculative FIM", daemon=True)
        thread.start()
        self._background.append(thread)

    def drain(self, timeout_s: float = 60.0) -> None:
        """Wait for the speculative requests still in flight."""
        for thread in self._background:
            thread.join(timeout_s)
        self._background.clear()
