"""From "the editor wants a completion here" to items: the policy between the
LSP wiring (lsp.server) and the daemon (lsp.daemon_client). No LSP I/O here.

Contracts of :meth:`Completer.suggest`:

- returns ``None`` (the editor shows nothing) when the document is unknown,
  the daemon is not ready (at once: no waiting), the request was overtaken by
  a newer one, the daemon cancelled or superseded it, it timed out, or the
  daemon had nothing; raises :class:`DaemonRequestFailed` only for a daemon
  error that retrying cannot fix (a bug to surface, as a typed JSON-RPC
  error);
- an *automatic* trigger (typing) waits ``debounce_ms`` and gives up if a
  newer request for the document arrived or the document changed meanwhile;
  an *invoked* one (the user asked) is sent at once, with high priority;
- no trigger on cursor moves alone: an automatic request at a new position
  in a document that has not changed since the previous request returns
  ``None`` without asking the daemon; the new position is warmed instead
  when the cursor stays there ``warm_delay_ms`` (the same request a
  completion there would send, so the first one after the move reuses it);
- a newer request cancels every older completion still running on the daemon
  (``cancel`` frames; the daemon also supersedes by URI);
- typing through a suggestion (the new text is the old prefix plus a start of
  an item, the suffix unchanged) is answered from the previous answer,
  without a daemon round trip — the item stays on screen, no flicker;
- an *invoked* request (with ``alternatives``: sol-lsp asks for them for
  inline completions) returns up to ``alternatives`` distinct items: the
  greedy one first, then the items of a second request with ``n`` sampled
  candidates (``alternatives_temperature``) — measured in docs/editors.md;
  automatic ones stay at the one greedy item (fast, and what is shown
  without asking);
- nothing at all is sent (no warm, no complete, and no daemon is started)
  for a document whose language the settings turn off (``enable``,
  ``languages``: :meth:`Settings.language_enabled`);
- nothing is asked for a document the context policy refuses (a secret
  file, a file outside the workspace folders) unless
  ``complete_in_secret_files``: its text never leaves the editor;
- cancellation of the calling task propagates (the daemon-side cancel is sent
  by :meth:`DaemonClient.complete`'s ``finally``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

from lsprotocol import types

from soldaemon.api import CompletionRequest, Done
from soldaemon.protocol import ErrorFrame
from soldaemon.privacy.rules import describe, redact_request

from lsp.context import ContextRing
from lsp.daemon_client import DaemonClient
from lsp.documents import Document, DocumentStore
from lsp.settings import Settings

log = logging.getLogger("sol.lsp.completer")

_PREFIX_GRAIN = 4096      # chars: the prefix window start moves in these steps (KV-cache friendly)
_RETRYABLE = {"unavailable", "timeout", "busy", "rate_limited"}


class DaemonRequestFailed(Exception):
    """The daemon refused a completion for a reason retrying cannot fix."""

    def __init__(self, frame: ErrorFrame) -> None:
        super().__init__(f"soldaemon: {frame.code}: {frame.message}")
        self.frame = frame


@dataclass(frozen=True)
class Suggestion:
    """Completions at one position. ``items[i]`` is the text to insert at the
    cursor; ``indices[i]`` its index in the ``done.items`` of the daemon
    request ``ids[i]`` (for telemetry events; ``request_id`` when ``ids`` is
    empty); ``line_prefix`` the cursor line's text before the cursor,
    ``line_suffix`` its text after the cursor."""

    request_id: str
    items: tuple[str, ...]
    indices: tuple[int, ...]
    line: int
    line_prefix: str
    cached: bool = False
    ids: tuple[str, ...] = ()
    line_suffix: str = ""

    def id_of(self, i: int) -> str:
        """The daemon request that produced ``items[i]``."""
        return self.ids[i] if i < len(self.ids) else self.request_id


@dataclass(frozen=True)
class _Seen:
    version: int
    offset: int


@dataclass(frozen=True)
class _Answer:
    request_id: str
    prefix: str
    suffix: str
    items: tuple[str, ...]
    ids: tuple[str, ...] = ()          # per item: the daemon request (alternatives)
    indices: tuple[int, ...] = ()      # per item: its index in that request's done.items


def tidy_items(items: tuple[str, ...], max_lines: int) -> tuple[list[str], list[int]]:
    """Cap each item at ``max_lines`` lines, drop trailing whitespace, empty
    and duplicate items; return the kept items and their original indices."""
    kept: list[str] = []
    indices: list[int] = []
    for index, item in enumerate(items):
        text = "\n".join(item.split("\n")[:max_lines]).rstrip()
        if text.strip() and text not in kept:
            kept.append(text)
            indices.append(index)
    return kept, indices


class Completer:
    """One per language server. See the module contract."""

    def __init__(self, settings: Settings, documents: DocumentStore, ring: ContextRing,
                 client: DaemonClient, on_withheld: Callable[[str | None], None] | None = None) -> None:
        self.settings = settings
        self.documents = documents
        self.ring = ring
        self.client = client
        self.on_withheld = on_withheld      # told what each request had redacted (None: nothing)
        self._generation: dict[str, int] = {}
        self._seen: dict[str, _Seen] = {}
        self._answers: dict[str, _Answer] = {}
        self._warm_tasks: dict[str, asyncio.Task[None]] = {}

    # -- document events ---------------------------------------------------------

    def opened(self, doc: Document) -> None:
        self.ring.opened(doc.uri, self.documents)

    def edited(self, doc: Document, offset: int) -> None:
        """After a ``didChange``: remember the spot; warm it when typing pauses."""
        self.ring.touch(doc.uri, doc.line_of(offset))
        self._schedule_warm(doc, offset)

    def closing(self, uri: str) -> None:
        """Before the document leaves the store."""
        self.ring.closed(uri, self.documents)
        for table in (self._generation, self._seen, self._answers):
            table.pop(uri, None)
        task = self._warm_tasks.pop(uri, None)
        if task is not None:
            task.cancel()

    async def aclose(self) -> None:
        tasks = list(self._warm_tasks.values())
        self._warm_tasks.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- completions ---------------------------------------------------------------

    def may_send(self, uri: str) -> bool:
        """May text of ``uri`` go to the daemon for a completion or a warm?"""
        return self.settings.complete_in_secret_files or self.ring.policy.may_complete(uri)

    def enabled(self, doc: Document) -> bool:
        """Completions are on for ``doc``'s language (the settings now)."""
        return self.settings.language_enabled(doc.language)

    async def suggest(self, uri: str, position: types.Position, *, automatic: bool,
                      alternatives: bool | None = None, tag: str | None = None) -> Suggestion | None:
        """See the module contract. ``alternatives``: ask for them (default:
        when invoked). ``tag`` is the editor's request id (for the daemon
        request id and the logs)."""
        if alternatives is None:
            alternatives = not automatic
        t0 = time.perf_counter()
        doc = self.documents.get(uri)
        if doc is None:
            log.info("lsp %s: %s is not open; nothing to complete", tag, uri)
            return None
        if not self.enabled(doc):
            log.debug("lsp %s: completions are off for %s (%s)", tag, uri, doc.language)
            return None
        if not self.may_send(uri):
            log.info("lsp %s: not completing in %s (%s)", tag, uri, self.ring.policy.refusal(uri))
            return None
        offset = self.documents.offset_at(doc, position)
        version = doc.version
        seen = self._seen.get(uri)
        self._seen[uri] = _Seen(version, offset)
        if automatic and seen is not None and seen.version == version and seen.offset != offset:
            log.debug("lsp %s: cursor moved without an edit; not completing", tag)
            self._schedule_warm(doc, offset, moved=True)
            return None
        generation = self._generation[uri] = self._generation.get(uri, 0) + 1
        for older in self.client.in_flight("complete"):  # a newer request: older work is stale
            self.client.cancel(older)
        line = doc.line_of(offset)
        line_start, line_end = doc.line_span(line)
        line_prefix = doc.text[line_start:offset]
        line_suffix = doc.text[offset:max(offset, line_end)]
        cached = self._typed_through(doc, offset, line, line_prefix, line_suffix)
        if cached is not None:
            log.info("lsp %s: typed through %s; answered from it in %.2f ms", tag, cached.request_id,
                     (time.perf_counter() - t0) * 1000)
            return cached
        if not self.client.ready:
            self.client.poke()
            log.debug("lsp %s: daemon not ready; empty", tag)
            return None
        if automatic and self.settings.debounce_ms > 0:
            await asyncio.sleep(self.settings.debounce_ms / 1000)
            if self._generation.get(uri) != generation or doc.version != version:
                log.debug("lsp %s: overtaken during the debounce", tag)
                return None
        t_built = time.perf_counter()
        request = self.build_request(doc, offset, self.client.new_id("c", tag),
                                     priority="normal" if automatic else "high")
        if not request.prefix and not request.suffix:
            return None
        t_sent = time.perf_counter()
        answer = await self.client.complete(request, timeout_s=self.settings.timeout_ms / 1000)
        t_done = time.perf_counter()
        stages = (f"debounce={(t_built - t0) * 1000:.1f}ms build={(t_sent - t_built) * 1000:.1f}ms "
                  f"daemon={(t_done - t_sent) * 1000:.1f}ms")
        if isinstance(answer, ErrorFrame):
            log.info("lsp %s → %s: %s (%s) %s", tag, request.id, answer.code, answer.message, stages)
            if answer.retryable or answer.code in _RETRYABLE:
                return None
            raise DaemonRequestFailed(answer)
        items, indices = tidy_items(answer.items, self.settings.max_lines)
        log.info("lsp %s → %s: finish=%s items=%d/%d context=%d %s total=%.1fms", tag, request.id,
                 answer.finish_reason, len(items), len(answer.items), len(request.context), stages,
                 (t_done - t0) * 1000)
        if answer.finish_reason in ("cancelled", "superseded") or not items:
            return None
        ids = [request.id] * len(items)
        # what typing through is answered from: the untrimmed items
        raw = _Answer(request.id, doc.text[:offset], doc.text[offset:], tuple(answer.items),
                      (request.id,) * len(answer.items), tuple(range(len(answer.items))))
        if alternatives and self.settings.alternatives > 1:
            extra = await self._add_alternatives(request, items, indices, ids, tag, t0)
            if self._generation.get(uri) != generation or doc.version != version:
                return None                 # overtaken while the alternatives ran
            if extra is not None:
                raw = dataclasses.replace(raw, items=raw.items + extra.items,
                                          ids=raw.ids + (extra.id,) * len(extra.items),
                                          indices=raw.indices + tuple(range(len(extra.items))))
        self._answers[uri] = raw
        return Suggestion(request.id, tuple(items), tuple(indices), line, line_prefix, ids=tuple(ids),
                          line_suffix=line_suffix)

    async def _add_alternatives(self, greedy: CompletionRequest, items: list[str], indices: list[int],
                                ids: list[str], tag: str | None, t0: float) -> Done | None:
        """Append distinct sampled items (a second request, ``n`` = the
        missing count) to the greedy ``items``, in place; return that
        request's ``done``. A failure, or no time left, keeps the greedy
        items only (and returns ``None``)."""
        want = self.settings.alternatives - len(items)
        left_s = self.settings.timeout_ms / 1000 - (time.perf_counter() - t0)
        if want <= 0 or left_s <= 0.05:
            return None
        request = dataclasses.replace(
            greedy, id=self.client.new_id("a", tag), n=want, seed=None,
            temperature=self.settings.alternatives_temperature, priority="high")
        answer = await self.client.complete(request, timeout_s=left_s)
        if isinstance(answer, ErrorFrame) or answer.finish_reason in ("cancelled", "superseded"):
            log.info("lsp %s: no alternatives (%s)", tag,
                     answer.code if isinstance(answer, ErrorFrame) else answer.finish_reason)
            return None
        extra, extra_indices = tidy_items(answer.items, self.settings.max_lines)
        for text, index in zip(extra, extra_indices):
            if text not in items and len(items) < self.settings.alternatives:
                items.append(text)
                indices.append(index)
                ids.append(request.id)
        log.info("lsp %s → %s: %d alternative(s) of %d sampled", tag, request.id, len(items) - 1, want)
        return answer

    def _typed_through(self, doc: Document, offset: int, line: int, line_prefix: str,
                       line_suffix: str) -> Suggestion | None:
        prev = self._answers.get(doc.uri)
        if prev is None or offset <= len(prev.prefix):
            return None
        text = doc.text
        if len(text) - offset != len(prev.suffix) or not text.startswith(prev.prefix) \
                or not text.endswith(prev.suffix):
            return None
        typed = text[len(prev.prefix):offset]
        items: list[str] = []
        indices: list[int] = []
        ids: list[str] = []
        for i, item in enumerate(prev.items):
            if item.startswith(typed) and item[len(typed):].strip():
                rest = "\n".join(item[len(typed):].split("\n")[: self.settings.max_lines]).rstrip()
                if rest and rest not in items:
                    items.append(rest)
                    indices.append(prev.indices[i] if i < len(prev.indices) else i)
                    ids.append(prev.ids[i] if i < len(prev.ids) else prev.request_id)
        if not items:
            return None
        return Suggestion(prev.request_id, tuple(items), tuple(indices), line, line_prefix, cached=True,
                          ids=tuple(ids), line_suffix=line_suffix)

    def build_request(self, doc: Document, offset: int, request_id: str, *,
                      priority: str = "normal") -> CompletionRequest:
        """The daemon request for the cursor at ``offset``: windowed prefix
        (its start moves in coarse steps and at line starts, so successive
        prompts share their beginning) and suffix (cut at a line end), and
        context from the ring."""
        text = doc.text
        start = max(0, offset - self.settings.max_prefix_chars)
        if start > 0:
            start = min(offset, -(-start // _PREFIX_GRAIN) * _PREFIX_GRAIN)
            newline = text.find("\n", start, offset)
            start = newline + 1 if newline != -1 else start
        end = min(len(text), offset + self.settings.max_suffix_chars)
        if end < len(text):
            newline = text.rfind("\n", offset, end)
            end = newline + 1 if newline != -1 else end
        context = self.ring.chunks(doc.uri, self.documents) if self.settings.context_chunks else ()
        request, withheld = redact_request(CompletionRequest(
            id=request_id, prefix=text[start:offset], suffix=text[offset:end], uri=doc.uri,
            version=doc.version, language=doc.language, context=context,
            max_tokens=self.settings.max_tokens, budget_ms=self.settings.budget_ms,
            multiline=self.settings.multiline,
            priority="high" if priority == "high" else "normal",
        ))
        if withheld:      # secrets in the text itself (soldaemon.privacy.scan): redacted, not sent
            log.info("%s: withheld from the daemon (redacted): %s", request_id, describe(withheld))
        if self.on_withheld is not None:
            self.on_withheld(describe(withheld) if withheld else None)
        return request

    # -- background warm -------------------------------------------------------------

    def _schedule_warm(self, doc: Document, offset: int, *, moved: bool = False) -> None:
        if not self.settings.warm or not self.enabled(doc):
            return
        old = self._warm_tasks.pop(doc.uri, None)
        if old is not None:
            old.cancel()
        self._warm_tasks[doc.uri] = asyncio.get_running_loop().create_task(
            self._warm_later(doc.uri, doc.version, offset, moved=moved), name=f"sol-warm {doc.uri}")

    async def _warm_later(self, uri: str, version: int, offset: int, *, moved: bool = False) -> None:
        """After ``warm_delay_ms`` without edits (and without a completion for
        this text), prefill the daemon's cache for the spot just edited;
        ``moved``: the spot the cursor moved to, while no edit, completion
        or other move came since."""
        try:
            generation = self._generation.get(uri)
            await asyncio.sleep(self.settings.warm_delay_ms / 1000)
            doc = self.documents.get(uri)
            seen = self._seen.get(uri)
            if doc is None or doc.version != version or not self.may_send(uri) or not self.enabled(doc):
                return
            if moved:
                if seen is None or seen.offset != offset or self._generation.get(uri) != generation:
                    return
            elif seen is not None and seen.version == version:
                return
            if not self.client.ready:
                self.client.poke()          # an edit in an enabled document: the daemon is wanted
                return
            request = self.build_request(doc, offset, self.client.new_id("w"))
            if request.prefix or request.suffix:
                self.client.warm(request)
                log.debug("warm %s sent for %s v%d (context %d)", request.id, uri, version, len(request.context))
        finally:
            if self._warm_tasks.get(uri) is asyncio.current_task():
                del self._warm_tasks[uri]
