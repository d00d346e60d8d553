"""Where an answer ends by its text alone: :class:`TextEnding`, the cut rules
(:class:`LineScanner`), :func:`postprocess` and the repeat-below tests. Pure string functions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

from soldaemon.pipeline.ending.lines import (
    BRACE_CONTINUES, CLOSE_TO_OPEN, CLOSERS, CONTINUES, LATER_MIN_CHARS, QUOTES, Cursor, bracket_depth, cursor_at,
    first_repeats, header_word, indent_of, keyword, lines_below, on_own_line, repeats_suffix, starts_definition)

# Dropped from a completion's end when the suffix supplies them after the cursor.
_TAIL_PUNCT = frozenset(CLOSERS + QUOTES + ";,: \t")
# Ends that name how generation stopped rather than a cut.
STOPPED = ("length", "budget", "cancelled", "superseded", "error")


@dataclass(frozen=True)
class Answer:
    """One shown completion and why it ends where it does."""

    text: str   # what the editor shows
    end: str    # "model", a cut rule or how generation stopped


class TextEnding:
    """Where one request's answer ends, by the text rules. ``may_stop(t)`` True guarantees
    ``shown(u) == shown(t)`` for every extension ``u`` of ``t``; each call scans only new text."""

    def __init__(self, prefix: str, suffix: str, multiline: bool, max_lines: int,
                 floor: int | None = None, cur: Cursor | None = None) -> None:
        self.prefix = prefix
        self.suffix = suffix
        self.multiline = multiline
        self.max_lines = max_lines
        self.floor = floor
        self._cur = cur if cur is not None else cursor_at(prefix, suffix)
        self.rule: str | None = None   # the rule that stopped generation
        self.restart()

    def may_repeat_below(self) -> Callable[[str], bool]:
        return may_repeat_below(self._cur)

    def repeats_below(self, text: str) -> bool:
        """Whether :func:`postprocess` drops all of ``text``: its first line repeats a line below."""
        return first_repeats(self._cur, text.split("\n", 1)[0])

    def restart(self) -> None:
        self._scanner = LineScanner(self._cur, self.multiline, self.max_lines, self.floor)
        self._pos = 0
        self._stopped = False
        self.rule = None

    def may_stop(self, text_so_far: str) -> bool:
        if self._stopped:
            return True
        text = text_so_far
        if len(text) < self._pos:  # not an extension: start over
            self.restart()
        scanner = self._scanner
        while True:
            nl = text.find("\n", self._pos)
            if nl < 0:
                break
            line = text[self._pos:nl]
            cut = scanner.decide(line, complete=True)
            if cut is not None:
                return self._stop(cut[2])
            scanner.advance(line)
            self._pos = nl + 1
        cut = scanner.decide(text[self._pos:], complete=False)
        if cut is not None:
            return self._stop(cut[2])
        return False

    def _stop(self, rule: str) -> bool:
        self._stopped, self.rule = True, rule
        return True

    def shown(self, raw: str, finish: str, rule: str | None) -> Answer:
        text, cut = postprocess_why(raw, prefix=self.prefix, suffix=self.suffix, multiline=self.multiline,
                                    max_lines=self.max_lines, floor=self.floor, cur=self._cur)
        return Answer(text, cut or (finish if finish in STOPPED else "model"))


# A cut: drop from line ``at`` ("before") or after it ("after"), and the rule (the ``end``).
_Cut = tuple[Literal["before", "after"], int, str]

class LineScanner:
    """:func:`postprocess`'s cut rules, one line at a time: :meth:`decide` (pure), then
    :meth:`advance` when the line is kept and complete."""

    def __init__(self, cur: Cursor, multiline: bool, max_lines: int, floor: int | None = None) -> None:
        self.cur = cur
        self.multiline = multiline
        self.max_lines = max(1, max_lines)
        self.floor = floor              # None: a dedent ends; else only one below this
        self.i = 0
        self.first_blank = False
        self.base = cur.indent          # body lines are indented at least this much
        self.prev: str | None = None    # last non-blank line, rstripped
        self.run = 0                    # how many times in a row ``prev`` came
        self.run_second = 0             # index of its second occurrence
        self._header: tuple[str, int] | None | Literal[False] = False  # lazy

    def header(self) -> tuple[str, int] | None:
        """The line opening the completion's block and its indentation (lazy, cached)."""
        if self._header is not False:
            return self._header
        found: tuple[str, int] | None = None
        if self.cur.opener:
            found = (self.cur.before, self.cur.indent)
        else:
            prefix = self.cur.prefix
            end = prefix.rfind("\n")  # end of the line above the cursor line
            while end >= 0:
                start = prefix.rfind("\n", 0, end) + 1
                line = prefix[start:end]
                if line.strip() and indent_of(line) < self.base:
                    found = (line, indent_of(line))
                    break
                end = start - 1
        self._header = found
        return found

    def suffix_closes(self, closer: str, indent: int) -> bool:
        """Whether the suffix's first line at or left of ``indent`` starts with ``closer``."""
        for line in lines_below(self.cur.suffix):
            stripped = line.strip()
            if stripped and indent_of(line) <= indent:
                return stripped.startswith(closer)
        return False

    def closer_kept(self, closer: str, indent: int) -> bool:
        """Whether a dedented ``closer`` line is kept as the block's last: it closes the header's
        opener at its indentation and the suffix does not (unless right after the cursor)."""
        header = self.header()
        if header is None:
            return False
        text, h_indent = header
        if indent != h_indent or not text.rstrip().endswith(CLOSE_TO_OPEN[closer]):
            return False
        if self.cur.rest.lstrip().startswith(closer):
            return True
        return not self.suffix_closes(closer, h_indent)

    def continues(self, stripped: str, indent: int, complete: bool) -> bool | None:
        """Whether a dedented line continues the statement (``else``, ``} catch (e) {``); None
        while an incomplete line could still become one."""
        header = self.header()
        if header is None or indent != header[1]:
            return False
        text, _ = header
        if stripped[0] == "}":
            if not text.rstrip().endswith("{") or self.suffix_closes("}", indent):
                return False
            after = stripped[1:].lstrip()
            if not complete:
                return None if not after or keyword(after, BRACE_CONTINUES) or any(
                    w.startswith(after) for w in BRACE_CONTINUES) else False
            return bool(keyword(after, BRACE_CONTINUES)) and (after.endswith("{") or after.endswith(";"))
        head = header_word(text)
        if head is None:
            return False
        allowed = [w for w, after in CONTINUES.items() if head in after]
        if keyword(stripped, allowed):
            return True
        if not complete and any(w.startswith(stripped) for w in allowed):
            return None
        return False

    def repeats(self, text: str) -> bool:
        """Whether completed line ``text`` repeats the suffix's next lines or its branches."""
        return repeats_suffix(self.cur, text) or self.repeats_branch(text)

    def repeats_branch(self, text: str) -> bool:
        """Whether line ``text`` opens a branch (``elif x:``) the suffix's statement already has."""
        stripped = text.strip()
        if keyword(stripped, CONTINUES) is None:
            return False
        indent = indent_of(text)
        for line in self.cur.suffix.split("\n")[1:]:
            if not line.strip():
                continue
            ind = indent_of(line)
            if ind < indent or (ind == indent and keyword(line.strip(), CONTINUES) is None):
                return False
            if line.rstrip() == text:
                return True
        return False

    def decide(self, line: str, complete: bool) -> _Cut | None:
        """The cut line ``self.i`` causes, or None; for an incomplete line only a final one."""
        i = self.i
        if i == 0:
            if complete and first_repeats(self.cur, line):
                return ("before", 0, "suffix")
            return None
        if not self.multiline:
            return ("before", i, "line")
        shown = i + 1 - (1 if self.first_blank else 0)
        if shown > self.max_lines:
            return ("before", i, "max_lines")
        stripped = line.strip()
        if not stripped:
            return None
        ind = indent_of(line)
        if ind < self.base and (self.floor is None or ind < self.floor):
            goes_on = self.continues(stripped, ind, complete)
            if goes_on is None:
                return None
            if goes_on:
                if complete and self.repeats(line.rstrip()):
                    return ("before", i, "suffix")
                return None
            c = stripped[0]
            if c in CLOSE_TO_OPEN and self.closer_kept(c, ind):
                if not complete:
                    return None
                if repeats_suffix(self.cur, line.rstrip()):
                    return ("before", i, "suffix")
                return ("after", i, "scope")
            return ("before", i, "scope")
        if ind < self.base and starts_definition(line):
            return ("before", i, "scope")   # a new definition above the floor
        if not complete:
            return None
        text = line.rstrip()
        if self.repeats(text):
            return ("before", i, "suffix")
        if text == self.prev and self.run + 1 >= 3:
            return ("before", self.run_second, "repeat")
        return None

    def advance(self, line: str) -> None:
        """Take line ``self.i`` as complete and kept."""
        i = self.i
        if i == 0:
            self.first_blank = not line.strip()
            full = self.cur.before + line
            if self.cur.opener:
                self.base = self.cur.indent + 1
            elif not self.cur.before.strip() and full.strip():
                self.base = indent_of(full)
            else:
                self.base = self.cur.indent
            text = full.rstrip()
        else:
            text = line.rstrip()
        if text.strip():
            if text == self.prev:
                self.run += 1
                if self.run == 2:
                    self.run_second = i
            else:
                self.prev = text
                self.run = 1
        self.i = i + 1


def may_repeat_below(cur: Cursor) -> Callable[[str], bool]:
    """The preview's test: True while the first line may become one :meth:`TextEnding.repeats_below` drops."""
    if not on_own_line(cur) or cur.next_line is None:
        return lambda _text: False
    lines = [cur.next_line, *(ln for ln in cur.later_lines if len(ln.strip()) >= LATER_MIN_CHARS)]

    def holds(text: str) -> bool:
        first, newline, _ = text.partition("\n")
        if newline or not first.strip():
            return bool(newline) and first_repeats(cur, first)
        here = cur.before + first
        return any(ln.startswith(here.rstrip()) for ln in lines)

    return holds


def _can_drop(head: str, tail: str) -> bool:
    """Whether ``tail`` closes no bracket or string that ``head`` opened."""
    if any(ch in CLOSERS for ch in tail) and bracket_depth(head) > 0:
        return False
    for q in QUOTES:
        if q in tail and head.count(q) % 2 == 1:
            return False
    return True


def _trim_rest_overlap(text: str, rest: str) -> str:
    """``text`` minus its longest end that repeats the start of ``rest`` (the cursor line's rest)
    and is all of it or only closers, quotes and ``;,:``."""
    core = rest.rstrip()
    if not core:
        return text
    for k in range(min(len(rest), len(text)), 0, -1):
        tail = rest[:k]
        if not text.endswith(tail) or not tail.strip():
            continue
        if not (k >= len(core) or all(ch in _TAIL_PUNCT for ch in tail)):
            continue
        head = text[:-k]
        if not _can_drop(head, tail):
            continue
        lines = head.split("\n")
        last = lines[-1]
        if last.strip() or len(lines) == 1:
            last = last.rstrip()
        return "\n".join(lines[:-1] + [last])
    return text


def _finish(lines: list[str], cur: Cursor) -> str:
    if not lines:
        return ""
    lines = list(lines)
    while len(lines) > 1 and not lines[-1].strip():
        lines.pop()
    lines[-1] = lines[-1].rstrip()
    if cur.column0:
        text = "\n".join(lines)
        return text + "\n" if text.strip() else ""
    text = _trim_rest_overlap("\n".join(lines), cur.rest)
    return text if text.strip() else ""


def postprocess(
    text: str, *, prefix: str, suffix: str, multiline: bool, max_lines: int
) -> str:
    """What to show for ``text`` at the cursor ("": nothing). Cut at the first: newline (single-
    line), line ``max_lines + 1``, line left of the block (its header's closer kept, ``else`` goes
    on), repeat of the suffix's next lines, third repetition. Then trailing blanks go, and the end
    repeating the cursor line's rest (``a, b)`` before ``)`` gives ``a, b``)."""
    return postprocess_why(text, prefix=prefix, suffix=suffix, multiline=multiline, max_lines=max_lines)[0]


def postprocess_why(
    text: str, *, prefix: str, suffix: str, multiline: bool, max_lines: int, floor: int | None = None,
    cur: Cursor | None = None,
) -> tuple[str, str | None]:
    """:func:`postprocess` and the rule that cut (or None). ``floor`` (columns): only a line
    indented less ends the block. ``cur``: the cursor of ``prefix``/``suffix`` when known."""
    cur = cur if cur is not None else cursor_at(prefix, suffix)
    scanner = LineScanner(cur, multiline, max_lines, floor)
    lines = text.split("\n")
    for line in lines:
        cut = scanner.decide(line, complete=True)
        if cut is not None:
            kind, at, rule = cut
            return _finish(lines[: at + 1] if kind == "after" else lines[:at], cur), rule
        scanner.advance(line)
    return _finish(lines, cur), None
