"""What the window cut off: an outline of the scopes enclosing the cursor,
the definitions of names used near it, and the imports."""

from __future__ import annotations

import re
from typing import Any

from soldaemon.fim.windows import _count_tokens, _split_lines


_IMPORT = re.compile(r"^(import\s|from\s+\S+\s+import\s|#include\s|use\s|using\s|require\b|package\s)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:export\s+)?(?:pub(?:\(\w+\))?\s+)?"
                  r"(?:def|class|function|fn|func|struct|enum|interface|trait|type|impl)\s+(\w+)")
_IDENT = re.compile(r"[A-Za-z_]\w*")


def _indent_width(line: str) -> int:
    return len(line[: len(line) - len(line.lstrip(" \t"))].expandtabs(4))


def _statement_end(lines: list[str], i: int, max_lines: int = 6) -> int:
    """The index after the last line of the statement starting at line
    ``i``: continuation lines follow while a bracket is open or the line
    ends with a backslash (at most ``max_lines`` lines in all)."""
    depth = 0
    j = i
    while j < len(lines) and j - i < max_lines:
        text = lines[j].rstrip()
        for ch in text:
            if ch in "([{":
                depth += 1
            elif ch in ")]}" and depth > 0:
                depth -= 1
        j += 1
        if depth == 0 and not text.endswith("\\"):
            break
    return j


def scope_outline(prefix: str, n_cut: int, suffix: str, *, near_lines: int = 12) -> list[tuple[int, str]]:
    """Statements from the first ``n_cut`` characters of ``prefix`` (the part
    the window left out) worth showing the model, as ``(priority, text)`` in
    file order; lower numbers matter more:

    0. the headers of the scopes that enclose the cursor: walking up from the
       cursor line, each non-blank line indented less than every line below it
       (``class``/``def``/``if`` ...), with its continuation lines;
    1. the definitions (``def``/``class``/``function``/``fn``/... line and its
       continuation) of names used in the last ``near_lines`` lines of the
       prefix or the first lines of ``suffix``;
    2. top-level import statements.

    Pure; each returned text ends with a newline.
    """
    lines = _split_lines(prefix)
    cut_lines = len(_split_lines(prefix[:n_cut])) - 1  # lines wholly in the cut part
    if cut_lines <= 0:
        return []
    in_string = _string_lines(lines[:cut_lines])
    pri: dict[int, int] = {}
    cursor = lines[-1]
    limit = _indent_width(cursor) if cursor.strip() else len(cursor.expandtabs(4))
    for i in range(len(lines) - 2, -1, -1):
        if limit == 0:
            break
        line = lines[i]
        if line.strip() and _indent_width(line) < limit and not (i < cut_lines and i in in_string):
            limit = _indent_width(line)
            if i < cut_lines and _looks_like_header(line):
                pri[i] = 0
    near = "".join(lines[-near_lines:]) + "".join(_split_lines(suffix)[:near_lines // 2])
    names = set(_IDENT.findall(near))
    for i in range(cut_lines):
        line = lines[i]
        if i in in_string:
            continue
        m = _DEF.match(line)
        if m and m.group(1) in names:
            pri.setdefault(i, 1)
        elif _IMPORT.match(line):
            pri.setdefault(i, 2)
    out: list[tuple[int, str]] = []
    covered = -1
    for i in sorted(pri):
        if i < covered:
            continue
        covered = min(_statement_end(lines, i), cut_lines)
        text = "".join(lines[i:covered])
        out.append((pri[i], text if text.endswith("\n") else text + "\n"))
    # a name defined several times (nested helpers): the last definition only
    last = {text: k for k, (_, text) in enumerate(out)}
    return [item for k, item in enumerate(out) if last[item[1]] == k]


_HEADER_WORDS = ("if", "elif", "else", "for", "while", "with", "try", "except", "finally", "match", "case",
                 "switch", "do", "loop", "unsafe", "impl", "namespace", "module", "async", "export", "public",
                 "private", "protected", "static")


def _looks_like_header(line: str) -> bool:
    """A line that opens a scope: a definition, a control keyword, or a line
    ending with ``:`` or ``{`` (a comment after it aside)."""
    stripped = line.strip()
    if _DEF.match(line):
        return True
    word = _IDENT.match(stripped)
    if word and word.group(0) in _HEADER_WORDS:
        return True
    code = stripped.split(" #", 1)[0].split(" //", 1)[0].rstrip()
    return code.endswith((":", "{"))


def _string_lines(lines: list[str]) -> set[int]:
    """Indices of lines inside (or opening or closing) a triple-quoted
    string, by counting the quotes: a cheap guard against taking a
    docstring's text for code."""
    out: set[int] = set()
    quote: str | None = None
    for i, line in enumerate(lines):
        pos = 0
        touched = quote is not None
        while True:
            if quote is None:
                hits = [(line.find(q, pos), q) for q in ('"""', "'''")]
                hits = [(k, q) for k, q in hits if k >= 0]
                if not hits:
                    break
                k, quote = min(hits)
                touched = True
                pos = k + 3
            else:
                k = line.find(quote, pos)
                if k < 0:
                    break
                quote = None
                pos = k + 3
        if touched:
            out.add(i)
    return out


def _fit_outline(tokenizer: Any, items: list[tuple[int, str]], max_tokens: int) -> str:
    """The outline lines that fit ``max_tokens``, the most important first,
    shown in file order."""
    if max_tokens <= 0 or not items:
        return ""
    counts = _count_tokens(tokenizer, [line for _, line in items])
    keep: set[int] = set()
    total = 0
    for k in sorted(range(len(items)), key=lambda k: (items[k][0], -k)):
        if total + counts[k] <= max_tokens:
            keep.add(k)
            total += counts[k]
    return "".join(items[k][1] for k in sorted(keep))
