"""Which context from other files goes into the prompt: snippets (top-level definitions, else
blocks of lines) kept only when they define a name used near the cursor that the file itself does
not (anything looser made answers worse: docs/quality.md). Scores weigh names by rarity, imports
and recency. The choice stays stable while typing (the context is cached KV before the prefix):
the query skips the cursor's line, and :class:`ContextSelector` keeps a choice not clearly beaten.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter, OrderedDict
from dataclasses import dataclass
from typing import Sequence

from soldaemon.api import ContextChunk

_IDENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_DEF = re.compile(r"^\s*(?:async\s+def|def|class|fn|func|function|struct|enum|interface|type|const|let|var)\s+"
                  r"([A-Za-z_][A-Za-z0-9_]*)")
_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]*)?=(?!=)")
_PY_FROM = re.compile(r"^\s*from\s+([.\w]+)\s+import\s+(.+)$")
_PY_IMPORT = re.compile(r"^\s*import\s+(.+)$")
_JS_IMPORT = re.compile(r"""^\s*import\s+(.+?)\s+from\s+['"]([^'"]+)['"]""")
_TOP = re.compile(r"^(?:@|async\s+def\s|def\s|class\s|export\s|function\s|fn\s|func\s|pub\s|impl\s|struct\s)")

# Keywords and very common names: they say nothing about relevance.
_STOP = frozenset("""
and as assert async await break class continue def del elif else except finally for from global if import in is
lambda nonlocal not or pass raise return try while with yield None True False self cls
const let var function new this typeof instanceof export default extends implements interface type enum public
private protected static void int float double bool boolean char string str list dict set tuple len range print
fn pub impl struct mut use mod crate match loop func package go defer chan map make nil
null undefined true false i j k n x y s t v e f a b c d ok err args kwargs
""".split())

QUERY_LINES_BEFORE = 40     # lines before the cursor's line that make the query
QUERY_LINES_AFTER = 10      # lines after it
SNIPPET_LINES = 40          # a snippet at most this long (longer definitions are cut in blocks)
MIN_SNIPPET_LINES = 4       # smaller definitions are merged with the next


@dataclass(frozen=True)
class Snippet:
    uri: str
    text: str
    order: int          # candidate index, then line: the order snippets are laid out in
    line: int
    score: float
    relevant: bool = False   # defines a name used near the cursor that the file itself does not define


def identifiers(text: str) -> list[str]:
    return [w for w in _IDENT.findall(text) if w not in _STOP and len(w) > 1]


def _module_stem(uri: str) -> str:
    name = uri.rstrip("/").rsplit("/", 1)[-1]
    return name.split(".", 1)[0]


def imports_of(prefix: str) -> tuple[set[str], set[str]]:
    """(module stems, imported names) of the Python and JS/TS import lines in ``prefix``."""
    stems: set[str] = set()
    names: set[str] = set()
    for line in prefix.splitlines():
        m = _PY_FROM.match(line)
        if m:
            stems.add(m.group(1).strip(".").rsplit(".", 1)[-1])
            names.update(w for w in _IDENT.findall(m.group(2)) if w != "as")
            continue
        m = _JS_IMPORT.match(line)
        if m:
            stems.add(m.group(2).rstrip("/").rsplit("/", 1)[-1].split(".", 1)[0])
            names.update(w for w in _IDENT.findall(m.group(1)) if w not in ("as", "type"))
            continue
        m = _PY_IMPORT.match(line)
        if m:
            for part in m.group(1).split(","):
                mod = part.strip().split(" ")[0]
                if mod:
                    stems.add(mod.rsplit(".", 1)[-1])
    stems.discard("")
    return stems, names


def split_snippets(text: str) -> list[tuple[int, str]]:
    """(first line, text) blocks of ``text``, one per top-level definition, at
    most :data:`SNIPPET_LINES` lines, tiny ones merged forward."""
    lines = text.splitlines(keepends=True)
    starts = [0] + [i for i, ln in enumerate(lines) if i > 0 and _TOP.match(ln)
                    and not (i > 0 and lines[i - 1].startswith("@"))]
    blocks = [(s, min(b, s + SNIPPET_LINES)) for a, b in zip(starts, starts[1:] + [len(lines)])
              for s in range(a, b, SNIPPET_LINES)]
    merged: list[tuple[int, int]] = []
    for a, b in blocks:
        if merged and merged[-1][1] - merged[-1][0] < MIN_SNIPPET_LINES and b - merged[-1][0] <= SNIPPET_LINES:
            merged[-1] = (merged[-1][0], b)
        else:
            merged.append((a, b))
    return [(a, "".join(lines[a:b])) for a, b in merged if "".join(lines[a:b]).strip()]


_ANY_ASSIGN = re.compile(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?::[^=]*)?=(?!=)")


def _defined(text: str, assign: re.Pattern[str] = _ASSIGN) -> set[str]:
    """Names ``text`` defines: defs, classes and ``assign``'s assignments (top-level by default)."""
    return {m.group(1) for line in text.splitlines() if (m := _DEF.match(line) or assign.match(line))}


@functools.lru_cache(maxsize=256)
def _analysed(text: str) -> tuple[tuple[int, str, frozenset[str], frozenset[str]], ...]:
    """:func:`split_snippets` with identifiers and definitions, cached per text."""
    return tuple((line, snippet, frozenset(identifiers(snippet)), frozenset(_defined(snippet)))
                 for line, snippet in split_snippets(text))


def rank(prefix: str, suffix: str, chunks: Sequence[ContextChunk], *,
         exclude_uri: str | None = None) -> list[Snippet]:
    """Every snippet of ``chunks`` but ``exclude_uri``'s, scored, best first."""
    before = prefix.rsplit("\n", 1)[0] if "\n" in prefix else ""
    near = "\n".join(before.split("\n")[-QUERY_LINES_BEFORE:]) + "\n" + "\n".join(
        suffix.split("\n")[1:QUERY_LINES_AFTER + 1])
    query = Counter(identifiers(near))
    stems, imported = imports_of(prefix)
    local = _defined(prefix + suffix, _ANY_ASSIGN)
    wanted = {w for w in query if w not in local}
    wanted_imports = {w for w in imported if w not in local}
    snippets: list[tuple[int, int, str, str, frozenset[str], frozenset[str]]] = []
    df: Counter[str] = Counter()
    for order, chunk in enumerate(chunks):
        if exclude_uri is not None and chunk.uri == exclude_uri:
            continue
        for line, text, words, defined in _analysed(chunk.text):
            df.update(words)
            snippets.append((order, line, chunk.uri, text, words, defined))
    if not snippets:
        return []
    n = len(snippets)
    idf = {w: math.log(1 + n / (1 + df[w])) for w in set(query) | imported}
    out: list[Snippet] = []
    for order, line, uri, text, words, defined in snippets:
        evidence = 0.0
        for w in defined & wanted:
            evidence += 3.0 * idf[w] * (1 + math.log(query[w]))
        for w in defined & wanted_imports:
            evidence += 0.5 * idf[w]
        score = evidence
        if evidence > 0:
            for w, count in query.items():
                if w in words and w not in defined:
                    score += idf[w] * (1 + math.log(count))
            if _module_stem(uri) in stems:
                score += 1.0
            score /= 1 + len(text) / 2000      # a compact snippet over a long one that mentions everything
            score += 0.01 * (len(chunks) - order) / max(1, len(chunks))   # recent first on ties
        out.append(Snippet(uri, text, order, line, score, evidence > 0))
    out.sort(key=lambda s: -s.score)
    return out


def choose(snippets: Sequence[Snippet], max_chars: int) -> list[Snippet]:
    """The best ``relevant`` snippets within ``max_chars``, best first."""
    chosen: list[Snippet] = []
    total = 0
    for s in snippets:
        if not s.relevant or total + len(s.text) > max_chars:
            continue
        chosen.append(s)
        total += len(s.text)
    return chosen


def pack(chosen: Sequence[Snippet]) -> list[ContextChunk]:
    """``chosen`` in candidate order, one chunk per file, snippets in file order."""
    files: OrderedDict[str, list[str]] = OrderedDict()
    for s in sorted(chosen, key=lambda s: (s.order, s.line)):
        files.setdefault(s.uri, []).append(s.text if s.text.endswith("\n") else s.text + "\n")
    return [ContextChunk(uri, "".join(parts)) for uri, parts in files.items()]


class ContextSelector:
    """:func:`rank`, :func:`choose` and :func:`pack`, keeping a document's previous choice while
    its snippets are all still there and it scores at least ``1 / stickiness`` of the new best."""

    def __init__(self, max_chars: int = 4096, stickiness: float = 1.5, max_docs: int = 64) -> None:
        self.max_chars = max_chars
        self.stickiness = stickiness
        self.max_docs = max_docs
        self._last: OrderedDict[str, frozenset[tuple[str, str]]] = OrderedDict()

    def select(self, uri: str, prefix: str, suffix: str, chunks: Sequence[ContextChunk]) -> tuple[ContextChunk, ...]:
        if not chunks:
            return ()
        ranked = rank(prefix, suffix, chunks, exclude_uri=uri)
        best = choose(ranked, self.max_chars)
        prev = self._last.get(uri)
        if prev is not None and prev != frozenset((s.uri, s.text) for s in best):
            now = {(s.uri, s.text): s for s in ranked}
            if all(key in now for key in prev):
                old = [now[key] for key in prev]
                if sum(s.score for s in old) * self.stickiness >= sum(s.score for s in best):
                    best = old
        self._last[uri] = frozenset((s.uri, s.text) for s in best)
        self._last.move_to_end(uri)
        while len(self._last) > self.max_docs:
            self._last.popitem(last=False)
        return tuple(pack(best))
