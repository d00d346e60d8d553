"""What the text rules know before any text: the cursor (:class:`Cursor`,
:func:`decide_multiline`), block keywords, indentation and brackets. A cut rule looks only at a
line and those before it, which makes early stopping exact. Lines split on ``"\\n"`` (``"\\r"`` is
trailing whitespace); indentation is in columns, a tab counting 4.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Iterable, Iterator

from soldaemon.api import Multiline

CLOSE_TO_OPEN = {")": "(", "]": "[", "}": "{"}
_OPENERS = "([{"
CLOSERS = ")]}"
QUOTES = "\"'`"
# All the cursor line's rest may hold for a multi-line completion.
_REST_ALLOWED = frozenset(CLOSERS + QUOTES + ";, \t\r")
_COMMENT_STARTS = ("#", "//", "--", "/*", "*", "<!--", ";", "%", "'''", '"""')
_OPENER_WORDS = ("do", "then", "else", "begin")


# Dedented keyword continuing the statement -> the header keywords it may follow.
CONTINUES: dict[str, tuple[str, ...]] = {
    "elif": ("if", "elif"),
    "else": ("if", "elif", "for", "while", "try", "except", "async for", "async while"),
    "except": ("try", "except"),
    "finally": ("try", "except", "else"),
    "case": ("case",),
}
# Brace languages: ``} else {``, ``} catch (e) {``, ``} finally {``, ``} while (x);``.
BRACE_CONTINUES = ("else", "catch", "finally", "except", "while")
# Past the cursor's block, the answer ends before a line starting a definition.
DEFINES = ("def", "async def", "class", "function", "async function", "func", "fn", "pub fn", "impl", "export")


def starts_definition(line: str) -> bool:
    """Whether ``line`` (complete or not) starts a definition: a :data:`DEFINES` word, a space
    and a name (not ``fn(x)``), or ``@name``."""
    lead = line.lstrip()
    if lead.startswith("@"):
        return len(lead) > 1 and (lead[1].isalpha() or lead[1] == "_")
    word = keyword(lead, DEFINES)
    if word is None or lead[len(word):len(word) + 1] not in (" ", "\t"):
        return False
    name = lead[len(word):].lstrip()
    return bool(name) and (name[0].isalpha() or name[0] in "_(*")


def keyword(stripped: str, words: tuple[str, ...] | Iterable[str]) -> str | None:
    """The word of ``words`` that ``stripped`` starts with as a whole word."""
    for w in words:
        if stripped.startswith(w) and (len(stripped) == len(w) or not (stripped[len(w)].isalnum()
                                                                        or stripped[len(w)] == "_")):
            return w
    return None


def header_word(header: str) -> str | None:
    stripped = header.strip()
    return keyword(stripped, ("async for", "async while", "if", "elif", "else", "for", "while", "try", "except",
                               "case"))


def indent_of(line: str) -> int:
    """Indentation width of ``line`` in columns (a tab counts as 4)."""
    n = len(line) - len(line.lstrip(" \t"))
    return len(line[:n].expandtabs(4))


def bracket_depth(text: str) -> int:
    """Bracket depth at the end of ``text``, strings not recognised."""
    depth = 0
    for ch in text:
        if ch in _OPENERS:
            depth += 1
        elif ch in CLOSERS and depth > 0:
            depth -= 1
    return depth


def _opens_block(before: str) -> bool:
    """Whether ``before`` ends with a block opener: a bracket, ``=>``, `` ->``, ``:`` outside
    brackets, or ``do``/``then``/``else``/``begin``."""
    s = before.rstrip()
    if not s:
        return False
    if s[-1] in _OPENERS or s.endswith("=>"):
        return True
    if s.endswith("->") and len(s) >= 3 and s[-3] in " \t":
        return True
    if s.endswith(":") and not s.endswith("::") and bracket_depth(s) == 0:
        return True
    for word in _OPENER_WORDS:
        if s.endswith(word):
            head = s[: -len(word)]
            if not head or not (head[-1].isalnum() or head[-1] == "_"):
                return True
    return False


def _cursor_line(prefix: str) -> str:
    return prefix[prefix.rfind("\n") + 1:]


def _column0(before: str, rest: str) -> bool:
    """Whether the cursor is at column 0 before text (the completion inserts lines above)."""
    return before == "" and bool(rest.strip())


def _rest_of_line(suffix: str) -> str:
    nl = suffix.find("\n")
    return suffix if nl < 0 else suffix[:nl]


def decide_multiline(prefix: str, suffix: str, mode: Multiline) -> bool:
    """Whether to generate a multi-line completion. ``"auto"``: at column 0 before text, or when
    the line's rest holds only closers, quotes and ``;,`` and the text before the cursor is blank
    or (not a comment) ends with a block opener."""
    if mode == "single":
        return False
    if mode == "multi":
        return True
    rest = _rest_of_line(suffix)
    before = _cursor_line(prefix)
    if _column0(before, rest):
        return True
    if any(ch not in _REST_ALLOWED for ch in rest):
        return False
    stripped = before.strip()
    if not stripped:
        return True
    if stripped.startswith(_COMMENT_STARTS):
        return False
    return _opens_block(before)


@dataclass(frozen=True)
class Cursor:
    """The document around the cursor, as the cut rules need it."""

    prefix: str
    suffix: str
    before: str              # cursor line, text before the cursor
    rest: str                # cursor line, text after the cursor
    indent: int              # indentation of the cursor line
    opener: bool             # ``before`` ends with a block opener
    next_line: str | None    # first non-blank suffix line after the cursor line, rstripped
    later_lines: tuple[str, ...] = ()  # the next few non-blank suffix lines after it
    column0: bool = False    # at column 0 before text: ``rest`` counts as the next line
    next_indent: int = 0     # indentation of ``next_line`` (0 when there is none)


def lines_below(suffix: str) -> Iterator[str]:
    """The lines of ``suffix`` after the cursor's, one at a time (a long suffix is never split whole)."""
    end = suffix.find("\n")
    while end >= 0:
        start, end = end + 1, suffix.find("\n", end + 1)
        yield suffix[start:] if end < 0 else suffix[start:end]


def cursor_at(prefix: str, suffix: str) -> Cursor:
    before = _cursor_line(prefix)
    rest = _rest_of_line(suffix)
    found = [line.rstrip() for line in itertools.islice(filter(str.strip, lines_below(suffix)), 1 + _LATER_LINES)]
    indent = indent_of(before) if before.strip() else len(before.expandtabs(4))
    column0 = _column0(before, rest)
    if column0:
        found.insert(0, rest.rstrip())
    return Cursor(
        prefix=prefix,
        suffix=suffix,
        before=before,
        rest=rest,
        indent=indent,
        opener=_opens_block(before),
        next_line=found[0] if found else None,
        later_lines=tuple(found[1:1 + _LATER_LINES]),
        column0=column0,
        next_indent=indent_of(found[0]) if found else 0,
    )


# A line of LATER_MIN_CHARS or more also repeats one of the _LATER_LINES after the next
# (short ones such as ``else:`` recur legitimately).
_LATER_LINES = 2
LATER_MIN_CHARS = 8


def repeats_suffix(cur: Cursor, text: str) -> bool:
    """Whether completed line ``text`` is the suffix's next line, or a long one of the few after."""
    if cur.next_line is not None and text == cur.next_line:
        return True
    return len(text.strip()) >= LATER_MIN_CHARS and text in cur.later_lines


def on_own_line(cur: Cursor) -> bool:
    """Whether the cursor's line is blank (as after Enter)."""
    return not cur.before.strip() and not cur.rest.strip() and not cur.column0


def first_repeats(cur: Cursor, line: str) -> bool:
    """Whether a completion's first ``line``, on a line of its own, repeats the suffix."""
    return on_own_line(cur) and bool(line.strip()) and repeats_suffix(cur, (cur.before + line).rstrip())
