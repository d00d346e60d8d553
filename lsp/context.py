"""Extra context for a completion: a bounded ring of anchors ``(uri, line)`` where documents
were recently edited or opened; the daemon picks the relevant snippets."""

from __future__ import annotations

from dataclasses import dataclass

from soldaemon.api import ContextChunk
from soldaemon.privacy.rules import ContextPolicy

from lsp.documents import DocumentStore


@dataclass
class _Anchor:
    uri: str
    line: int
    snapshot: str | None = None        # set once the document is closed
    whole: bool = False                # an open, not an edit: the whole document


class ContextRing:
    """Recently edited and opened spots, newest last. An edit within half a chunk of an anchor
    moves it; a document the :class:`ContextPolicy` refuses is never anchored."""

    def __init__(self, *, max_entries: int = 16, max_chunks: int = 8, chunk_lines: int = 40,
                 max_chunk_chars: int = 24000, max_total_chars: int = 64000,
                 policy: ContextPolicy | None = None) -> None:
        self.max_entries = max(0, max_entries)
        self.max_chunks = max(0, min(max_chunks, 32))  # protocol: at most 32 chunks
        self.chunk_lines = max(2, chunk_lines)
        self.max_chunk_chars = max(1, max_chunk_chars)
        self.max_total_chars = max(0, max_total_chars)
        self._anchors: list[_Anchor] = []
        self.policy = policy or ContextPolicy()

    def __len__(self) -> int:
        return len(self._anchors)

    def set_policy(self, policy: ContextPolicy) -> None:
        """Take a new policy and forget what it refuses."""
        self.policy = policy
        self._anchors = [a for a in self._anchors if policy.allows(a.uri)]

    def touch(self, uri: str, line: int) -> None:
        """Record activity at ``line`` of ``uri`` (an edit, or an open at 0)."""
        if self.max_entries == 0 or not self.policy.allows(uri):
            return
        half = self.chunk_lines // 2
        for index, anchor in enumerate(self._anchors):
            if anchor.uri == uri and anchor.snapshot is None and abs(anchor.line - line) <= half:
                del self._anchors[index]
                anchor.line, anchor.whole = line, False
                self._anchors.append(anchor)
                return
        self._anchors.append(_Anchor(uri, line))
        if len(self._anchors) > self.max_entries:
            del self._anchors[: len(self._anchors) - self.max_entries]

    def opened(self, uri: str, store: DocumentStore) -> None:
        """Drop a (re)opened document's snapshots and anchor its head."""
        self._anchors = [a for a in self._anchors if not (a.uri == uri and a.snapshot is not None)]
        if store.get(uri) is not None and self.policy.allows(uri):
            self.touch(uri, 0)
            self._anchors[-1].whole = True

    def closed(self, uri: str, store: DocumentStore) -> None:
        """Snapshot ``uri``'s chunks (call before it leaves the store)."""
        for anchor in self._anchors:
            if anchor.uri == uri and anchor.snapshot is None:
                anchor.snapshot = self._read(anchor, store)

    def _read(self, anchor: _Anchor, store: DocumentStore) -> str:
        if anchor.snapshot is not None:
            return anchor.snapshot
        doc = store.get(anchor.uri)
        if doc is None:
            return ""
        first = max(0, anchor.line - self.chunk_lines // 2)
        text = doc.text if anchor.whole else doc.lines(first, first + self.chunk_lines)
        return text[: self.max_chunk_chars]

    def chunks(self, for_uri: str, store: DocumentStore) -> tuple[ContextChunk, ...]:
        """Context for a completion in ``for_uri``: most recent first, never ``for_uri`` itself,
        within ``max_chunks``, ``max_chunk_chars`` and ``max_total_chars``. An edit's chunk is the
        lines around it, an open's the whole document. The order stays stable while only the current
        document is edited, so the daemon's KV cache keeps its prefix."""
        out: list[ContextChunk] = []
        total = 0
        # a document sent whole (it fits max_chunk_chars) needs no other windows
        whole = set()
        for anchor in self._anchors:
            doc = store.get(anchor.uri) if anchor.whole and anchor.snapshot is None else None
            if doc is not None and len(doc.text) <= self.max_chunk_chars:
                whole.add(anchor.uri)
        for anchor in reversed(self._anchors):
            if len(out) >= self.max_chunks:
                break
            if anchor.uri == for_uri or (anchor.uri in whole and not anchor.whole):
                continue
            text = self._read(anchor, store)
            if not text.strip():
                continue
            room = self.max_total_chars - total
            if room <= 0:
                break
            text = text[:room]
            out.append(ContextChunk(anchor.uri, text))
            total += len(text)
        return tuple(out)
