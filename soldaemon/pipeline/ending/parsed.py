"""Where an answer ends by its parse: :class:`ParsedEnding`, the text rules plus tree-sitter over
a :class:`Window` around the cursor, parsed once and then incrementally per insertion. Grammars
come from ``tree-sitter-<language>`` wheels; a missing one means the text rules alone decide.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Iterator

from soldaemon.api import Multiline
from soldaemon.pipeline.ending.lines import Cursor, bracket_depth, indent_of
from soldaemon.pipeline.ending.text import STOPPED, Answer, TextEnding, postprocess_why

# LSP language id -> (grammar module, its function returning the language)
GRAMMARS: dict[str, tuple[str, str]] = {
    "python": ("tree_sitter_python", "language"),
    "javascript": ("tree_sitter_javascript", "language"),
    "javascriptreact": ("tree_sitter_javascript", "language"),
    "typescript": ("tree_sitter_typescript", "language_typescript"),
    "typescriptreact": ("tree_sitter_typescript", "language_tsx"),
    "go": ("tree_sitter_go", "language"),
    "rust": ("tree_sitter_rust", "language"),
    "c": ("tree_sitter_c", "language"),
    "cpp": ("tree_sitter_cpp", "language"),
    "java": ("tree_sitter_java", "language"),
}
# Checked by indent too: tree-sitter's Python grammar accepts a body-less ``for x:`` or a bad
# indent without an error node.
INDENTED = frozenset({"python"})

WINDOW_LINES = 120   # lines of context each side of the cursor, at most
# Lines at column 0 that go on with the statement above (not a new one).
_GOES_ON = ("else", "elif", "except", "finally", "catch", ")", "]", "}")


@lru_cache(maxsize=None)
def _parser(language: str) -> Any | None:
    """A tree-sitter parser for LSP language id ``language``, or None without its grammar."""
    spec = GRAMMARS.get(language)
    if spec is None:
        return None
    try:
        import tree_sitter
        module = importlib.import_module(spec[0])
    except ImportError:
        return None
    return tree_sitter.Parser(tree_sitter.Language(getattr(module, spec[1])()))


def _top_level(line: str) -> bool:
    """Whether ``line`` starts a new top-level statement."""
    return bool(line) and not line[0].isspace() and not line.startswith(_GOES_ON)


def _triples(text: str) -> int:
    """Triple quotes in ``text`` (an odd count: inside a multi-line string)."""
    return text.count('"""') + text.count("'''")


def _window(prefix: str, suffix: str) -> tuple[str, str]:
    """``prefix`` from the last top-level line before the cursor's and ``suffix`` up to the next,
    each at most :data:`WINDOW_LINES` lines (none inside a multi-line string is top-level)."""
    head = prefix.split("\n")[-WINDOW_LINES - 1:]
    quotes = _triples(prefix[: len(prefix) - len("\n".join(head))])
    inside: list[bool] = []
    for line in head:
        inside.append(quotes % 2 == 1)
        quotes += _triples(line)
    start = 0
    for i in range(len(head) - 2, -1, -1):
        if _top_level(head[i]) and not inside[i]:
            start = i
            break
    tail = suffix.split("\n")[: WINDOW_LINES + 1]
    end = len(tail)
    quotes += _triples(tail[0])
    for i in range(1, len(tail)):
        if _top_level(tail[i]) and quotes % 2 == 0:
            end = i
            break
        quotes += _triples(tail[i])
    return "\n".join(head[start:]), "\n".join(tail[:end])


def _errors(node: Any) -> int:
    """The count of error and missing nodes under ``node``."""
    return sum(1 for _ in _error_nodes(node))


def _point(text: bytes) -> tuple[int, int]:
    """(row, byte column) at the end of ``text``."""
    return text.count(b"\n"), len(text) - (text.rfind(b"\n") + 1)


@dataclass
class Window:
    """The code around one cursor, parsed once."""

    language: str
    before: str          # window text before the cursor
    after: str           # window text after the cursor
    parser: Any
    tree: Any            # the tree of before + after
    errors: int          # its error and missing nodes

    def fits(self, insert: str) -> bool:
        """Whether ``before + insert + after`` has no more syntax errors than ``before + after``
        (and, indented languages, keeps the block rules)."""
        if not insert:
            return True
        if self.language in INDENTED and not (bodies_fit(self.before, insert)
                                              and _indent_fits(self.before, insert, self.after)):
            return False
        head, ins = self.before.encode(), insert.encode()
        tree = self.tree.copy()
        start = _point(head)
        rows, col = _point(ins)
        tree.edit(start_byte=len(head), old_end_byte=len(head), new_end_byte=len(head) + len(ins),
                  start_point=start, old_end_point=start,
                  new_end_point=(start[0] + rows, col if rows else start[1] + col))
        new = self.parser.parse(head + ins + self.after.encode(), tree)
        return _errors(new.root_node) <= self.errors

    def longest_fit(self, text: str) -> tuple[str, bool]:
        """The longest whole-line prefix of ``text`` that :meth:`fits`, and whether it is all."""
        if self.fits(text):
            return text, True
        lines = text.rstrip("\n").split("\n")
        keep_nl = text.endswith("\n")
        for k in range(len(lines) - 1, 0, -1):
            cand = "\n".join(lines[:k]).rstrip()
            if keep_nl:
                cand += "\n"
            if cand.strip() and self.fits(cand):
                return cand, False
        return "", False


def _last_code_line(text: str) -> str | None:
    """The last line of ``text`` with code on it, its comment cut off."""
    for line in reversed(text.split("\n")):
        code = line.split("#", 1)[0].rstrip()
        if code.strip():
            return code
    return None


def _indent_fits(before: str, insert: str, after: str) -> bool:
    """Python's block rules where the insertion meets the code after: a ``...:`` last line needs
    a deeper next line, any other a next line no deeper (outside brackets)."""
    first, _, more = after.partition("\n")
    if first.strip() and not (before + insert).endswith("\n"):
        return True       # the cursor line's rest continues the last line: the parse judges
    nxt = first if first.strip() else next(
        (ln for ln in more.split("\n") if ln.strip() and not ln.lstrip().startswith("#")), None)

    def ok(text: str) -> bool:
        last = _last_code_line(text)
        if last is None or _scan(text)[0] > 0:       # inside brackets
            return True
        opens = last.endswith(":") and not last.endswith("::")
        if nxt is None:
            return not opens
        deeper = indent_of(nxt) > indent_of(last)
        return deeper if opens else not deeper

    return ok(before + insert)


def bodies_fit(before: str, insert: str) -> bool:
    """Python's block rule inside the insertion: a ``...:`` line is followed by a deeper code
    line or none. True inside a bracket or string (the parse judges)."""
    lines = insert.split("\n")
    if len(lines) < 2 or _scan_before(before) != (0, False):
        return True
    cursor_line = before[before.rfind("\n") + 1:]
    head = cursor_line
    start = ""          # the statement's first physical line
    for j, line in enumerate(lines[:-1]):
        text = (cursor_line if j == 0 else "") + line
        if j == 0 or _scan(head) == (0, False):
            start = text
        head += line + "\n"
        code = text.split("#", 1)[0].rstrip()
        if not code.endswith(":") or code.endswith("::"):
            continue
        nxt = next((ln for ln in lines[j + 1:] if ln.strip() and not ln.lstrip().startswith("#")), None)
        if nxt is None:
            return True
        # the body is deeper than the statement's first line, not its last
        if _scan(head) == (0, False) and indent_of(nxt) <= indent_of(start):
            return False
    return True


@lru_cache(maxsize=8)
def _scan_before(before: str) -> tuple[int, bool]:
    """:func:`_scan` of the lines before the cursor's (cached per window)."""
    return _scan(before[:before.rfind("\n") + 1])


def _scan(text: str) -> tuple[int, bool]:
    """(brackets open at the end of ``text``, whether it ends in a triple-quoted string), by a
    rough Python lexer."""
    depth = 0
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == "#":
            end = text.find("\n", i)
            i = n if end < 0 else end
            continue
        if ch in "'\"":
            j = _string_end(text, i)
            if j >= n and text[i:i + 3] in ('"""', "\'\'\'") and not text.endswith(text[i:i + 3], i + 3):
                return depth, True
            i = j
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}" and depth:
            depth -= 1
        i += 1
    return depth, False


def _string_end(text: str, i: int) -> int:
    """The index after the string opened at ``i`` (unclosed: its line's end; triple: text end)."""
    quote = text[i:i + 3] if text[i:i + 3] in ('"""', "'''") else text[i]
    j, n = i + len(quote), len(text)
    while j < n:
        if text[j] == "\\":
            j += 2
            continue
        if text.startswith(quote, j):
            return j + len(quote)
        if len(quote) == 1 and text[j] == "\n":
            return j
        j += 1
    return n


def window_at(prefix: str, suffix: str, language: str) -> Window | None:
    """The parsed window at the cursor, or None when ``language`` has no grammar."""
    parser = _parser(language)
    if parser is None:
        return None
    before, after = _window(prefix, suffix)
    tree = parser.parse((before + after).encode())
    return Window(language, before, after, parser, tree, _errors(tree.root_node))


def opens_without_body(prefix: str, text: str, suffix: str) -> bool:
    """Whether ``text`` at the cursor ends on a block opener whose body the suffix lacks."""
    last = _last_code_line(prefix[prefix.rfind("\n") + 1:] + text)
    if last is None:
        return False
    if not (last.endswith("{") or (last.endswith(":") and not last.endswith("::"))):
        return False
    first, _, more = suffix.partition("\n")
    if first.strip():
        return False      # the line's rest continues it
    nxt = next((ln for ln in more.split("\n") if ln.strip()), None)
    return nxt is None or indent_of(nxt) <= indent_of(last)


class ParsedEnding(TextEnding):
    """The text rules with the parse, multi-line. While decoding: the text rules above ``floor``
    (columns); in an indented language, stop (``opener``) at a block opener with no deeper line."""

    def __init__(self, prefix: str, suffix: str, max_lines: int, window: Window, floor: int,
                 cur: Cursor | None = None) -> None:
        super().__init__(prefix, suffix, True, max_lines, floor, cur)
        self.window = window

    def may_stop(self, text_so_far: str) -> bool:
        if super().may_stop(text_so_far):
            return True
        if self.window.language not in INDENTED:
            return False
        head = text_so_far[:text_so_far.rfind("\n") + 1]
        if "\n" not in head or not _in_block(head, self._scanner.base):
            return False
        if bodies_fit(self.window.before, text_so_far):
            return False
        return self._stop("opener")

    def shown(self, raw: str, finish: str, rule: str | None) -> Answer:
        """The text rules' cut (the floor only when the model ended it), then the longest line
        prefix that parses with the suffix (end ``opener`` or ``parse``)."""
        # a run a rule stopped is trusted no more than one that hit max_tokens
        by_model = finish == "stop" and rule is None
        text, cut = postprocess_why(raw, prefix=self.prefix, suffix=self.suffix, multiline=True,
                                    max_lines=self.max_lines, floor=self.floor if by_model else None, cur=self._cur)
        end = cut or (finish if finish in STOPPED else "model")
        if text:
            shown, whole = self.window.longest_fit(text)
            if not whole:
                end = "opener" if _opens(text, shown, self.prefix[self.prefix.rfind("\n") + 1:]) else "parse"
                text = shown
        return Answer(text, end)


# A line that ends with one of these inside an open bracket goes on below.
_UNFINISHED = (",", "+", "-", "*", "/", "%", "&", "|", "\\", " and", " or", "&&", "||", "??")


def may_be_unfinished(prefix: str, suffix: str, mode: Multiline) -> bool:
    """Whether the cursor line ends in a bracket it opened with a comma or operator
    (``call(x,|``), only closers following: the parse then decides."""
    line = prefix[prefix.rfind("\n") + 1:]
    rest = suffix.split("\n", 1)[0]
    if mode != "auto" or rest.strip(" \t\r)]}\"'`;,") or not line.rstrip().endswith(_UNFINISHED):
        return False
    return bracket_depth(line) > 0


def error_at_cursor(window: Window) -> bool:
    """Whether a syntax error lies from the cursor line's start to the next code line's end."""
    node = window.tree.root_node
    if not node.has_error:
        return False
    head = window.before.encode()
    lo = head.rfind(b"\n") + 1
    after = window.after.encode()
    nxt = next((m for m in _line_ends(after) if after[:m].strip()), len(after))
    hi = len(head) + nxt
    return any(n.start_byte <= hi and n.end_byte >= lo for n in _error_nodes(node))


def _line_ends(text: bytes) -> list[int]:
    return [i for i, b in enumerate(text) if b == 0x0A][1:] + [len(text)]


def _error_nodes(node: Any) -> Iterator[Any]:
    """The error and missing nodes under tree-sitter ``node``."""
    if node.is_error or node.is_missing:
        yield node
    if node.has_error:
        for c in node.children:
            yield from _error_nodes(c)


def _in_block(text: str, base: int) -> bool:
    """Whether every line of ``text`` after its first is indented at least ``base``."""
    return all(indent_of(ln) >= base for ln in text.split("\n")[1:] if ln.strip())


def _opens(text: str, shown: str, cursor_line: str = "") -> bool:
    """Whether the cut dropped a block opener without its body (the dropped text's last line, or
    its first code line when the next is not deeper)."""
    dropped = text[len(shown):].rstrip()
    if not shown:
        dropped = cursor_line + dropped
    lines = [ln.split("#", 1)[0].rstrip() for ln in dropped.split("\n")]
    if lines[-1].endswith((":", "{", "(", "[")) and not lines[-1].endswith("::"):
        return True
    code = [ln for ln in lines if ln.strip()]
    return (len(code) > 1 and code[0].endswith(":") and not code[0].endswith("::")
            and indent_of(code[1]) <= indent_of(code[0]))
