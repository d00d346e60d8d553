"""From "the editor wants a completion here" to items: the policy between the LSP wiring
(lsp.server) and the daemon (lsp.daemon_client). No LSP I/O here; docs/editors.md describes
each behaviour."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Callable

from lsprotocol import types

from soldaemon.api import CompletionRequest, Delta, Done, Priority, document_window
from soldaemon.protocol import ErrorFrame
from soldaemon.privacy.rules import describe, redact_request
from soldaemon.shown import early_text, rests_after, typed_since

from lsp.context import ContextRing
from lsp.daemon_client import Answer, DaemonClient
from lsp.documents import Document, DocumentStore
from lsp.settings import Settings

log = logging.getLogger("sol.lsp.completer")

_RETRYABLE = {"unavailable", "timeout", "busy", "rate_limited"}


class DaemonRequestFailed(Exception):
    """The daemon refused a completion for a reason retrying cannot fix."""

    def __init__(self, frame: ErrorFrame) -> None:
        super().__init__(f"soldaemon: {frame.code}: {frame.message}")
        self.frame = frame


@dataclass(frozen=True)
class Suggestion:
    """Completions at one position."""

    request_id: str
    items: tuple[str, ...]             # the texts to insert at the cursor
    indices: tuple[int, ...]           # per item: its index in the done.items of its request
    line_prefix: str                   # the cursor line before the cursor
    cached: bool = False
    ids: tuple[str, ...] = ()          # per item: the daemon request (empty: request_id)
    line_suffix: str = ""              # the cursor line after the cursor

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
    again: bool = False                # a request at this very place is answered from it (once)


@dataclass
class _Rest:
    """A daemon request still writing the rest of an answer shown early."""

    request_id: str
    task: asyncio.Task[Answer]
    early: str                         # what was shown


def tidy_items(items: tuple[str, ...], max_lines: int) -> tuple[list[str], list[int]]:
    """The items capped at ``max_lines`` lines, stripped at the end, empty and duplicate ones
    dropped; and their original indices."""
    kept: list[str] = []
    indices: list[int] = []
    for index, item in enumerate(items):
        text = "\n".join(item.split("\n")[:max_lines]).rstrip()
        if text.strip() and text not in kept:
            kept.append(text)
            indices.append(index)
    return kept, indices


class Completer:
    """One per language server. A newer request cancels older ones on the daemon; typing through
    a suggestion is answered from it; with ``early_lines`` a multi-line answer's first lines come
    back while the daemon writes the rest (:attr:`on_rest_ready` is called when it adds any)."""

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
        self._rests: dict[str, _Rest] = {}
        self._warm_tasks: dict[str, asyncio.Task[None]] = {}
        self.on_rest_ready: Callable[[str], None] | None = None   # the rest of an early answer is there

    def edited(self, doc: Document, offset: int) -> None:
        """After a ``didChange``: remember the spot; warm it when typing pauses."""
        self.ring.touch(doc.uri, doc.line_of(offset))
        self._schedule_warm(doc, offset)

    def closing(self, uri: str) -> None:
        """Before the document leaves the store."""
        self.ring.closed(uri, self.documents)
        for table in (self._generation, self._seen, self._answers):
            table.pop(uri, None)
        rest = self._rests.pop(uri, None)
        if rest is not None:
            rest.task.cancel()
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

    def may_send(self, uri: str) -> bool:
        """Whether text of ``uri`` may go to the daemon."""
        return self.settings.complete_in_secret_files or self.ring.policy.may_complete(uri)

    def enabled(self, doc: Document) -> bool:
        return self.settings.language_enabled(doc.language)

    async def suggest(self, uri: str, position: types.Position, *, automatic: bool,
                      alternatives: bool | None = None, tag: str | None = None,
                      early: bool = False, start_wait_s: float | None = None) -> Suggestion | None:
        """Items at ``position``, or None (show nothing): an unknown, disabled or refused
        document (no text leaves the editor), a cursor move without an edit (warmed instead), a
        request overtaken, cancelled, timed out or unanswered, or no daemon within ``start_wait_s``
        (None: wait). Raises :class:`DaemonRequestFailed` only when retrying cannot help."""
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
        offset = doc.offset_at(position, self.documents.encoding)
        version = doc.version
        seen = self._seen.get(uri)
        self._seen[uri] = _Seen(version, offset)
        if automatic and seen is not None and seen.version == version and seen.offset != offset:
            log.debug("lsp %s: cursor moved without an edit; not completing", tag)
            self._schedule_warm(doc, offset, moved=True)
            return None
        generation = self._generation[uri] = self._generation.get(uri, 0) + 1
        line = doc.line_of(offset)
        line_start, line_end = doc.line_span(line)
        line_prefix = doc.text[line_start:offset]
        line_suffix = doc.text[offset:max(offset, line_end)]
        cached = self._typed_through(doc, offset, line_prefix, line_suffix)
        rest = self._rests.get(uri)
        if cached is None and rest is not None and self._typed_all_of(rest, doc, offset):
            # the early lines were typed or accepted: wait for the rest, on its way
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(rest.task), self.settings.timeout_ms / 1000)
            if self._generation.get(uri) != generation or doc.version != version:
                return None
            cached = self._typed_through(doc, offset, line_prefix, line_suffix)
        keep = rest.request_id if cached is not None and rest is not None else None
        for older in self.client.in_flight("complete"):  # a newer request: older work is stale
            if older != keep:        # ... except the rest of the early answer being typed through
                self.client.cancel(older)
        if cached is not None:
            log.info("lsp %s: typed through %s; answered from it in %.2f ms", tag, cached.request_id,
                     (time.perf_counter() - t0) * 1000)
            return cached
        if not self.client.ready:
            self.client.poke()
            try:
                ready = await asyncio.wait_for(self.client.wait_ready(), start_wait_s)
            except asyncio.TimeoutError:
                log.info("lsp %s: the daemon is still starting after %.0f s; empty for now", tag, start_wait_s)
                return None
            if not ready:
                log.debug("lsp %s: daemon not ready; empty", tag)
                return None
            log.info("lsp %s: waited %.0f ms for the daemon to start", tag, (time.perf_counter() - t0) * 1000)
            if self._generation.get(uri) != generation or doc.version != version:
                return None             # overtaken while the daemon started
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
        early = early and self.settings.early_lines and not (alternatives and self.settings.alternatives > 1)
        answer, shown_early = await self._ask(request, doc, offset, line_prefix, early)
        t_done = time.perf_counter()
        if shown_early is not None:
            log.info("lsp %s → %s: %d early line(s) after %.1fms; the rest follows", tag, request.id,
                     shown_early.count("\n") + 1, (t_done - t0) * 1000)
            return Suggestion(request.id, (shown_early,), (0,), line_prefix, ids=(request.id,),
                              line_suffix=line_suffix)
        assert answer is not None
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
        return Suggestion(request.id, tuple(items), tuple(indices), line_prefix, ids=tuple(ids),
                          line_suffix=line_suffix)

    async def _add_alternatives(self, greedy: CompletionRequest, items: list[str], indices: list[int],
                                ids: list[str], tag: str | None, t0: float) -> Done | None:
        """Append a second, sampled request's distinct items to ``items`` in place and return its
        ``done``; None keeps the greedy items only."""
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

    def _typed_through(self, doc: Document, offset: int, line_prefix: str, line_suffix: str) -> Suggestion | None:
        prev = self._answers.get(doc.uri)
        if prev is None:
            return None
        typed = typed_since(prev.prefix, prev.suffix, doc.text[:offset], doc.text[offset:])
        if typed is None or (not typed and not prev.again):
            return None
        rests = rests_after(typed, prev.items)
        items, kept = tidy_items(tuple(left for _, left in rests), self.settings.max_lines)
        if not items:
            return None
        at = [rests[k][0] for k in kept]           # each item's index in prev.items
        indices = [prev.indices[i] if i < len(prev.indices) else i for i in at]
        ids = [prev.ids[i] if i < len(prev.ids) else prev.request_id for i in at]
        if prev.again:
            self._answers[doc.uri] = dataclasses.replace(prev, again=False)
        return Suggestion(prev.request_id, tuple(items), tuple(indices), line_prefix, cached=True,
                          ids=tuple(ids), line_suffix=line_suffix)

    async def _ask(self, request: CompletionRequest, doc: Document, offset: int, line_prefix: str,
                   early: bool) -> tuple[Answer | None, str | None]:
        """The daemon's answer, or with ``early`` ``(None, lines)`` once :func:`early_text` allows
        the first lines (the request goes on)."""
        timeout_s = self.settings.timeout_ms / 1000
        if not early:
            return await self.client.complete(request, timeout_s=timeout_s), None
        after = doc.text[offset:].split("\n")[1:]
        next_line = next((ln for ln in after if ln.strip()), None)
        streamed: list[str] = []
        ready = asyncio.Event()

        def on_delta(delta: Delta) -> None:
            streamed.append(delta.text)
            if "\n" in delta.text and early_text("".join(streamed), line_prefix, next_line) is not None:
                ready.set()

        task = asyncio.ensure_future(self.client.complete(request, timeout_s=timeout_s, on_delta=on_delta))
        waiter = asyncio.ensure_future(ready.wait())
        try:
            await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            raise
        finally:
            waiter.cancel()
        if task.done():
            return task.result(), None
        text = early_text("".join(streamed), line_prefix, next_line)
        assert text is not None
        self._answers[doc.uri] = _Answer(request.id, doc.text[:offset], doc.text[offset:], (text,))
        old = self._rests.pop(doc.uri, None)
        if old is not None:
            old.task.cancel()
        rest = self._rests[doc.uri] = _Rest(request.id, task, text)
        task.add_done_callback(lambda _t: self._rest_done(doc.uri, rest))
        return None, text

    def _rest_done(self, uri: str, rest: _Rest) -> None:
        """Serve typing (and, once, the same place) from the finished rest of an early answer;
        tell the client when it adds to what was shown."""
        if self._rests.get(uri) is rest:
            del self._rests[uri]
        if rest.task.cancelled() or rest.task.exception() is not None:
            return
        answer = rest.task.result()
        prev = self._answers.get(uri)
        if isinstance(answer, ErrorFrame) or answer.finish_reason in ("cancelled", "superseded") \
                or not answer.items or prev is None or prev.request_id != rest.request_id:
            log.info("lsp: the rest of %s is not shown (%s)", rest.request_id,
                     answer.code if isinstance(answer, ErrorFrame) else answer.finish_reason)
            return
        items, _ = tidy_items(answer.items, self.settings.max_lines)
        more = bool(items) and items[0] != rest.early
        kept = answer.items
        if answer.streamed is not None and answer.streamed not in kept:
            kept += (answer.streamed,)     # a candidate replaced the lines shown: typing along them goes on
        self._answers[uri] = _Answer(rest.request_id, prev.prefix, prev.suffix, kept,
                                     (rest.request_id,) * len(kept), tuple(range(len(kept))), again=more)
        log.info("lsp: the rest of %s is there (%d line(s)%s)", rest.request_id,
                 items[0].count("\n") + 1 if items else 0, "" if more else ", nothing more than shown")
        if more and self.on_rest_ready is not None:
            self.on_rest_ready(uri)

    def _typed_all_of(self, rest: _Rest, doc: Document, offset: int) -> bool:
        """Whether all of the early answer is typed or accepted at the cursor."""
        prev = self._answers.get(doc.uri)
        if prev is None or prev.request_id != rest.request_id:
            return False
        return doc.text[:offset] == prev.prefix + rest.early and doc.text[offset:] == prev.suffix

    def build_request(self, doc: Document, offset: int, request_id: str, *,
                      priority: Priority = "normal") -> CompletionRequest:
        """The daemon request at ``offset``: the windowed document, context from the ring, secrets
        redacted."""
        text = doc.text
        start, end = document_window(text, offset, self.settings.max_prefix_chars, self.settings.max_suffix_chars)
        context = self.ring.chunks(doc.uri, self.documents) if self.settings.context_chunks else ()
        request, withheld = redact_request(CompletionRequest(
            id=request_id, prefix=text[start:offset], suffix=text[offset:end], uri=doc.uri,
            version=doc.version, language=doc.language, context=context,
            max_tokens=self.settings.max_tokens, budget_ms=self.settings.budget_ms,
            multiline=self.settings.multiline,
            priority=priority,
        ))
        if withheld:      # secrets in the text itself (soldaemon.privacy.scan): redacted, not sent
            log.info("%s: withheld from the daemon (redacted): %s", request_id, describe(withheld))
        if self.on_withheld is not None:
            self.on_withheld(describe(withheld) if withheld else None)
        return request

    def _schedule_warm(self, doc: Document, offset: int, *, moved: bool = False) -> None:
        if not self.settings.warm or not self.enabled(doc):
            return
        old = self._warm_tasks.pop(doc.uri, None)
        if old is not None:
            old.cancel()
        self._warm_tasks[doc.uri] = asyncio.get_running_loop().create_task(
            self._warm_later(doc.uri, doc.version, offset, moved=moved), name=f"sol-warm {doc.uri}")

    async def _warm_later(self, uri: str, version: int, offset: int, *, moved: bool = False) -> None:
        """After ``warm_delay_ms`` with no edit or completion since (``moved``: no other move
        either), prefill the daemon's cache at ``offset``."""
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
