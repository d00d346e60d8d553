"""The language server's copy of the editor's open documents; every conversion between LSP
positions (code units of the negotiated encoding, UTF-16 by default) and string indices
happens here. Lines end at ``\\n``, ``\\r\\n`` or ``\\r`` (LSP's rule; pygls' store also
breaks at a form feed)."""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass, field
from typing import Literal

from lsprotocol import types

Encoding = Literal["utf-8", "utf-16", "utf-32"]
_NEWLINE = re.compile(r"\r\n|\r|\n")


def normalize_encoding(value: object) -> Encoding:
    """The encoding an LSP ``PositionEncodingKind`` names (else UTF-16)."""
    text = getattr(value, "value", value)
    if text in ("utf-8", "utf-32"):
        return text  # type: ignore[return-value]
    return "utf-16"


def units(text: str, encoding: Encoding) -> int:
    """Length of ``text`` in code units of ``encoding``."""
    if encoding == "utf-32" or text.isascii():
        return len(text)
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def column_to_index(line: str, character: int, encoding: Encoding) -> int:
    """Index into ``line`` of ``character`` code units, clamped, rounded down."""
    if character <= 0:
        return 0
    if encoding == "utf-32" or line.isascii():
        return min(character, len(line))
    counted = 0
    for index, ch in enumerate(line):
        width = units(ch, encoding)
        if counted + width > character:
            return index
        counted += width
    return len(line)


def line_starts(text: str) -> list[int]:
    """Offsets at which each line starts (the first is 0)."""
    return [0] + [m.end() for m in _NEWLINE.finditer(text)]


@dataclass
class Document:
    """One open document; its line starts are kept in step with every edit."""

    uri: str
    text: str
    version: int = 0
    language: str | None = None
    _starts: list[int] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._starts = line_starts(self.text)

    def line_span(self, line: int) -> tuple[int, int]:
        """``(start, end)`` offsets of ``line`` without its terminator, clamped."""
        if line >= len(self._starts):
            return len(self.text), len(self.text)
        start = self._starts[max(0, line)]
        end = self._starts[line + 1] if line + 1 < len(self._starts) else len(self.text)
        while end > start and self.text[end - 1] in "\r\n":
            end -= 1
        return start, end

    def line_of(self, offset: int) -> int:
        return max(0, bisect.bisect_right(self._starts, offset) - 1)

    def offset_at(self, position: types.Position, encoding: Encoding = "utf-16") -> int:
        """String index of an LSP position; never raises for a non-negative one: past the line's end
        means its end, past the last line the document's end, inside a character its start."""
        if position.line >= len(self._starts):
            return len(self.text)
        start, end = self.line_span(position.line)
        return start + column_to_index(self.text[start:end], position.character, encoding)

    def lines(self, first: int, last: int) -> str:
        """Text of lines ``first`` ..< ``last`` (clamped), terminators kept."""
        first = max(0, min(first, len(self._starts)))
        last = max(first, min(last, len(self._starts)))
        start = self._starts[first] if first < len(self._starts) else len(self.text)
        end = self._starts[last] if last < len(self._starts) else len(self.text)
        return self.text[start:end]

    def apply(self, change: types.TextDocumentContentChangeEvent, encoding: Encoding = "utf-16") -> int:
        """Apply one ``didChange`` content change; the offset after the inserted text."""
        if isinstance(change, types.TextDocumentContentChangePartial):
            start = self.offset_at(change.range.start, encoding)
            end = max(start, self.offset_at(change.range.end, encoding))
            self._replace(start, end, change.text)
            return start + len(change.text)
        self.text = change.text
        self._starts = line_starts(self.text)
        return len(self.text)

    def _replace(self, start: int, end: int, new: str) -> None:
        old = self.text
        self.text = old[:start] + new + old[end:]
        # a carriage return may pair up differently with a neighbouring line feed: recount
        if "\r" in new or (start > 0 and old[start - 1] == "\r") or "\r" in old[start:end]:
            self._starts = line_starts(self.text)
            return
        delta = len(new) - (end - start)
        first = bisect.bisect_right(self._starts, start)
        last = bisect.bisect_right(self._starts, end)
        inserted = [start + m.end() for m in _NEWLINE.finditer(new)]
        self._starts[first:] = inserted + [s + delta for s in self._starts[last:]]


class DocumentStore:
    """Open documents by URI, in the position encoding agreed in ``initialize``."""

    def __init__(self, encoding: Encoding = "utf-16") -> None:
        self.encoding: Encoding = encoding
        self._docs: dict[str, Document] = {}

    def __len__(self) -> int:
        return len(self._docs)

    def get(self, uri: str) -> Document | None:
        return self._docs.get(uri)

    def open(self, item: types.TextDocumentItem) -> Document:
        doc = Document(item.uri, item.text, item.version, item.language_id or None)
        self._docs[item.uri] = doc
        return doc

    def change(self, params: types.DidChangeTextDocumentParams) -> tuple[Document, int] | None:
        """Apply every change in order: the document and the offset after the last edit, or None
        when it is not open."""
        doc = self._docs.get(params.text_document.uri)
        if doc is None:
            return None
        offset = 0
        for change in params.content_changes:
            offset = doc.apply(change, self.encoding)
        doc.version = params.text_document.version
        return doc, offset

    def close(self, uri: str) -> Document | None:
        return self._docs.pop(uri, None)
