"""Outlines of what the windows cut off: above (:func:`scope_outline`) and
below (:func:`below_outline`), fitted together by :func:`fit_outlines`."""

from __future__ import annotations

import re
from typing import Any

from soldaemon.fim.windows import count_tokens, split_lines


_IMPORT = re.compile(r"^(import\s|from\s+\S+\s+import\s|#include\s|use\s|using\s|require\b|package\s)")
_DEF = re.compile(r"^\s*(?:async\s+)?(?:export\s+)?(?:pub(?:\(\w+\))?\s+)?"
                  r"(?:def|class|function|fn|func|struct|enum|interface|trait|type|impl)\s+(\w+)")
_IDENT = re.compile(r"[A-Za-z_]\w*")
_SELF_ATTR = re.compile(r"\bself\.([A-Za-z_]\w*)\b(?!\s*\()")  # an attribute, not a method call


def _indent_width(line: str) -> int:
    return len(line[: len(line) - len(line.lstrip(" \t"))].expandtabs(4))


def _statement_end(lines: list[str], i: int, max_lines: int = 6) -> int:
    """The index after the statement at line ``i``; brackets and ``\\`` continue it (max_lines)."""
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
    """``(priority, statement)`` in file order from the first ``n_cut`` characters of ``prefix``:
    0 headers of the scopes enclosing the cursor, 1 definitions of names used near it, 2 imports,
    ``3 + rank`` other definitions at the enclosing depths, nearest first. Texts end with "\\n"."""
    lines = split_lines(prefix)
    cut_lines = len(split_lines(prefix[:n_cut])) - 1  # lines wholly in the cut part
    if cut_lines <= 0:
        return []
    in_string = _string_lines(lines[:cut_lines])
    pri = {i: 0 for i, _, _ in _enclosing(lines, in_string) if i < cut_lines}
    near = "".join(lines[-near_lines:]) + "".join(split_lines(suffix)[:near_lines // 2])
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
    depths = {ind for _, ind, _ in _enclosing(lines)} | {0}
    others = 0
    for i in range(cut_lines - 1, -1, -1):
        if i not in pri and i not in in_string and _DEF.match(lines[i]) and _indent_width(lines[i]) in depths:
            pri[i] = 3 + others
            others += 1
    return _statements(lines, pri, cut_lines)


def _statements(lines: list[str], pri: dict[int, int], stop: int) -> list[tuple[int, str]]:
    """``(priority, statement)`` per line of ``pri`` up to ``stop``; a repeated text only last."""
    out: list[tuple[int, str]] = []
    covered = -1
    for i in sorted(pri):
        if i < covered:
            continue
        covered = min(_statement_end(lines, i), stop)
        text = "".join(lines[i:covered])
        out.append((pri[i], text if text.endswith("\n") else text + "\n"))
    last = {text: k for k, (_, text) in enumerate(out)}
    return [item for k, item in enumerate(out) if last[item[1]] == k]


def _enclosing(prefix_lines: list[str], skip: set[int] | frozenset[int] = frozenset()) -> list[tuple[int, int, str]]:
    """``(index, indentation, line)`` of the scope headers enclosing the last line, innermost
    first; the lines in ``skip`` (inside strings) are passed over."""
    cursor = prefix_lines[-1] if prefix_lines else ""
    limit = _indent_width(cursor) if cursor.strip() else len(cursor.expandtabs(4))
    out = []
    for i in range(len(prefix_lines) - 2, -1, -1):
        if limit == 0:
            break
        line = prefix_lines[i]
        if line.strip() and _indent_width(line) < limit and i not in skip:
            limit = _indent_width(line)
            if _looks_like_header(line):
                out.append((i, limit, line))
    return out


def below_outline(prefix: str, suffix: str, n_kept: int, visible: str, *,
                  near_lines: int = 12, max_line_chars: int = 120, max_lines: int = 400) -> list[tuple[int, str]]:
    """``(priority, statement)`` in file order from ``suffix`` past ``n_kept`` characters: 0 in a
    method, the first line using each ``self`` attribute ``visible`` never names; 1 definitions of
    names used near the cursor that ``visible`` lacks; ``3 + rank`` other definitions at the
    enclosing depths. Reads at most ``max_lines`` lines, skips longer than ``max_line_chars``."""
    kept_lines = len(split_lines(suffix[:n_kept])) - 1 if n_kept > 0 else 0
    lines = split_lines(suffix)[:kept_lines + max_lines]
    if kept_lines >= len(lines):
        return []
    in_string = _string_lines(lines)
    headers = [(ind, h) for _, ind, h in _enclosing(split_lines(prefix))]
    if not headers:
        return []
    cls = next(((ind, h) for ind, h in headers if h.lstrip().startswith("class ")), None)
    depths = {ind for ind, _ in headers} | {0}
    near = "".join(split_lines(prefix)[-near_lines:]) + "".join(lines[:min(kept_lines, near_lines // 2)])
    names = set(_IDENT.findall(near)) - set(_IDENT.findall(" ".join(
        m.group(1) for m in map(_DEF.match, split_lines(visible)) if m)))
    seen_attrs = set(_SELF_ATTR.findall(visible))
    in_class = cls is not None and any(ind > cls[0] and _DEF.match(h) for ind, h in headers)
    pri: dict[int, int] = {}
    others = 0
    for i in range(kept_lines, len(lines)):
        line = lines[i]
        if i in in_string or not line.strip() or len(line) > max_line_chars:
            continue
        ind = _indent_width(line)
        if in_class and cls is not None and ind <= cls[0]:
            in_class = False
        if in_class:
            new = [a for a in _SELF_ATTR.findall(line) if a not in seen_attrs]
            if new:
                seen_attrs.update(new)
                pri.setdefault(i, 0)
        m = _DEF.match(line)
        if m and m.group(1) in names:
            pri.setdefault(i, 1)
        elif m and ind in depths and i not in pri:
            pri[i] = 3 + others
            others += 1
    return _statements(lines, pri, len(lines))


_HEADER_WORDS = ("if", "elif", "else", "for", "while", "with", "try", "except", "finally", "match", "case",
                 "switch", "do", "loop", "unsafe", "impl", "namespace", "module", "async", "export", "public",
                 "private", "protected", "static")


def _looks_like_header(line: str) -> bool:
    """Whether ``line`` opens a scope: a definition, control keyword, or ``:``/``{`` at its end."""
    stripped = line.strip()
    if _DEF.match(line):
        return True
    word = _IDENT.match(stripped)
    if word and word.group(0) in _HEADER_WORDS:
        return True
    code = stripped.split(" #", 1)[0].split(" //", 1)[0].rstrip()
    return code.endswith((":", "{"))


def _string_lines(lines: list[str]) -> set[int]:
    """Indices of lines inside, opening or closing a triple-quoted string."""
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


def fit_outlines(tokenizer: Any, above: list[tuple[int, str]], below: list[tuple[int, str]],
                 max_tokens: int) -> tuple[str, str]:
    """The items of both sides that fit ``max_tokens`` together, lowest
    priority (then nearest) first; each side in file order."""
    if max_tokens <= 0 or not (above or below):
        return "", ""
    items = [(p, len(above) - k, 0, k, t) for k, (p, t) in enumerate(above)] + \
            [(p, k, 1, k, t) for k, (p, t) in enumerate(below)]
    counts = count_tokens(tokenizer, [t for *_, t in items])
    keep: set[tuple[int, int]] = set()
    total = 0
    for n in sorted(range(len(items)), key=lambda n: items[n][:2]):
        if total + counts[n] <= max_tokens:
            keep.add((items[n][2], items[n][3]))
            total += counts[n]
    return ("".join(t for k, (_, t) in enumerate(above) if (0, k) in keep),
            "".join(t for k, (_, t) in enumerate(below) if (1, k) in keep))
