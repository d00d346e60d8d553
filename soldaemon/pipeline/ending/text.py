"""Where an answer ends by its text alone: the text rules as a strategy
(:class:`TextEnding`), over the line rules of
:mod:`soldaemon.pipeline.ending.lines`. Pure string functions.

* :meth:`TextEnding.may_stop` -- during decoding: True as soon as more text
  could not change what is shown;
* :meth:`TextEnding.shown` and :func:`postprocess` -- at the end: one line,
  or a block that ends where the enclosing block ends; what the suffix
  already contains removed; degenerate repetition stopped; whitespace
  trimmed;
* :func:`may_repeat_below` -- what the streamed preview may not show yet,
  and :func:`repeats_below` -- whether the whole text is dropped for that
  reason (the local engine then decodes again from the model's next choice:
  :mod:`soldaemon.runtime.decode.second`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from soldaemon.pipeline.ending.lines import (
    CLOSERS, LATER_MIN_CHARS, QUOTES, Cursor, LineScanner, bracket_depth, cursor_at, first_repeats, on_own_line)

# Characters that may be dropped from the end of a completion when the suffix
# supplies them right after the cursor (besides a whole-rest overlap).
_TAIL_PUNCT = frozenset(CLOSERS + QUOTES + ";,: \t")
# Ends that name how generation stopped rather than a cut.
STOPPED = ("length", "budget", "cancelled", "superseded", "error")


@dataclass(frozen=True)
class Answer:
    """One shown completion and why it ends where it does."""

    text: str   # what the editor shows
    end: str    # "model", a cut rule or how generation stopped (soldaemon.pipeline.ending)


class TextEnding:
    """Where one request's answer ends, by the text rules.

    ``may_stop(text_so_far)`` is called with the whole generated text after
    every step (each call extending the previous one). It returns True once
    :meth:`shown` is certain to cut everything after this point:
    single-line and a newline appeared; multi-line and a line past
    ``max_lines`` began, or a line left of the block began (a closer line
    that would be kept is waited for until it ends), or a completed line
    equals the next suffix line, or a line completed its third repetition.
    Guarantee: when ``may_stop(t)`` is True, ``shown(u) == shown(t)`` for
    every extension ``u`` of ``t``. Once True it stays True; :attr:`rule`
    then names the rule that stopped it.

    Cost per call: amortised over the new characters only (each line is
    examined when it completes, plus the current partial line).
    ``floor`` (columns): see :func:`postprocess_why`.
    """

    def __init__(self, prefix: str, suffix: str, multiline: bool, max_lines: int,
                 floor: int | None = None) -> None:
        self.prefix = prefix
        self.suffix = suffix
        self.multiline = multiline
        self.max_lines = max_lines
        self.floor = floor
        self._cur = cursor_at(prefix, suffix)
        self.rule: str | None = None   # the rule that stopped generation (None: none did)
        self._reset()

    def restart(self) -> None:
        """Check a new generation from its start (its rule cleared)."""
        self._reset()

    def _reset(self) -> None:
        self._scanner = LineScanner(self._cur, self.multiline, self.max_lines, self.floor)
        self._pos = 0
        self._stopped = False
        self.rule = None

    def may_stop(self, text_so_far: str) -> bool:
        """True when generation can stop now (see the class docstring)."""
        if self._stopped:
            return True
        text = text_so_far
        if len(text) < self._pos:  # not an extension: start over
            self._reset()
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
        """The shown answer for generated ``raw`` that ended with ``finish``
        (``rule``: the rule that stopped its generation, the :attr:`rule`
        of the ending it decoded under)."""
        text, cut = postprocess_why(raw, prefix=self.prefix, suffix=self.suffix, multiline=self.multiline,
                                    max_lines=self.max_lines)
        return Answer(text, cut or (finish if finish in STOPPED else "model"))


def repeats_below(prefix: str, suffix: str, text: str) -> bool:
    """Whether post-processing drops all of ``text`` because its first line,
    on a line of its own, is the line below the cursor (or one of the few
    after it: rule c of :func:`postprocess`)."""
    return first_repeats(cursor_at(prefix, suffix), text.split("\n", 1)[0])


def may_repeat_below(prefix: str, suffix: str) -> Callable[[str], bool]:
    """For the streamed preview: a test of generated text that is True while
    its first line, on a line of its own, is or may still become a line
    that :func:`repeats_below` drops (a prefix of the line below, or of a
    long one of the few after it) -- text a client should not see yet."""
    cur = cursor_at(prefix, suffix)
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
    """Whether ``tail`` (text the suffix repeats) can be cut from the end of a
    completion whose other text is ``head``: no closer in it may close a
    bracket opened in ``head``, no quote in it may close a string opened in
    ``head``."""
    if any(ch in CLOSERS for ch in tail) and bracket_depth(head) > 0:
        return False
    for q in QUOTES:
        if q in tail and head.count(q) % 2 == 1:
            return False
    return True


def _trim_rest_overlap(text: str, rest: str) -> str:
    """Cut the end of ``text`` where it repeats the start of ``rest`` (the
    suffix up to its newline): the longest overlap that is either made only of
    closing brackets, quotes and ``;,:`` or covers all of ``rest`` (trailing
    whitespace aside), and that :func:`_can_drop` allows."""
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
        # else: an indentation-only last line stays, to place ``rest``.
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
        # whole lines above the cursor's line: the text ends with a newline
        text = "\n".join(lines)
        return text + "\n" if text.strip() else ""
    text = _trim_rest_overlap("\n".join(lines), cur.rest)
    return text if text.strip() else ""


def _cut_lines(lines: list[str], scanner: LineScanner) -> tuple[list[str], str | None]:
    for line in lines:
        cut = scanner.decide(line, complete=True)
        if cut is not None:
            kind, at, rule = cut
            return (lines[: at + 1] if kind == "after" else lines[:at]), rule
        scanner.advance(line)
    return lines, None


def postprocess(
    text: str, *, prefix: str, suffix: str, multiline: bool, max_lines: int
) -> str:
    """What to show for generated ``text`` at the cursor between ``prefix`` and
    ``suffix``. Never only whitespace: "" means show nothing.

    Lines are cut at the first of (each looks only at the lines up to it):

    a. single-line: the first newline (so text starting with a newline gives
       "");
    b. multi-line: line ``max_lines + 1`` (a blank first line -- the text
       starts with a newline -- is not counted);
       the end of the enclosing block: a non-blank line indented less than the
       block (the block is deeper than the cursor line when that line ends
       with an opener; else it is at the cursor line's indentation, or for a
       blank cursor line at the indentation where the completion's first line
       starts). Such a line is dropped -- unless it starts with the closer
       matching the opener of the block's header line, at the header's
       indentation, and the suffix does not already close that block: then it
       is kept as the last line (brace languages). A dedented line that goes
       on with the statement the completion is inside is no end either:
       ``elif``/``else``/``except``/``finally``/``case`` at the header's
       indentation after a header they may follow, and ``} else {``,
       ``} catch (e) {``, ``} while (x);`` after a ``{`` header the suffix
       does not close -- the completion then ends where it meets the suffix
       (rule c) or at the next real dedent;
    c. a line equal (trailing whitespace aside) to the next non-blank line of
       the suffix, or to one of the two non-blank suffix lines after it when
       it has at least 8 non-blank characters: it and everything after it
       are dropped (the model went on writing what follows the hole); the
       first line too when the cursor's line is blank around the cursor (on
       a line of its own after Enter: the whole answer is then "");
    e. a line repeated 3 times in a row (blank lines between ignored): only
       its first occurrence is kept.

    Then trailing blank lines go, the last line loses its trailing whitespace,
    and (c, d) the end of the text that repeats the start of the rest of the
    cursor line is cut -- closing brackets/quotes the suffix already supplies
    (``foo(`` + ``a, b)`` before ``)`` gives ``a, b``) unless they close
    something the completion opened, or the whole rest of the line. When that
    leaves an indentation-only last line in a multi-line completion, the
    indentation stays so the suffix's closer lands on its own line.
    """
    return postprocess_why(text, prefix=prefix, suffix=suffix, multiline=multiline, max_lines=max_lines)[0]


def postprocess_why(
    text: str, *, prefix: str, suffix: str, multiline: bool, max_lines: int, floor: int | None = None
) -> tuple[str, str | None]:
    """:func:`postprocess` and the rule that cut (None: none; names at
    ``_Cut``). ``floor`` (columns) replaces rule b's block end: only a line
    indented less ends it (:class:`soldaemon.pipeline.ending.parsed.ParsedEnding`)."""
    cur = cursor_at(prefix, suffix)
    lines, rule = _cut_lines(text.split("\n"), LineScanner(cur, multiline, max_lines, floor))
    return _finish(lines, cur), rule
