"""Decisions made while a completion is generated, over the cut rules of
:mod:`soldaemon.pipeline.postprocess`:

* :class:`StopChecker` -- when generation can stop: as soon as more text
  could not change what post-processing shows;
* :func:`may_repeat_below` -- what the streamed preview may not show yet (a
  first line that may become the line below the cursor);
* :func:`repeats_below` -- whether post-processing drops the whole text for
  that reason (the local engine then decodes again from the model's next
  choice: :mod:`soldaemon.runtime.decode.second`).
"""

from __future__ import annotations

from typing import Callable

from soldaemon.pipeline.postprocess import LATER_MIN_CHARS, LineScanner, cursor_at, first_repeats, on_own_line


def repeats_below(prefix: str, suffix: str, text: str) -> bool:
    """Whether post-processing drops all of ``text`` because its first line,
    on a line of its own, is the line below the cursor (or one of the few
    after it: rule c of :func:`soldaemon.pipeline.postprocess.postprocess`)."""
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


class StopChecker:
    """Decides during decoding whether generation can stop.

    ``check(text_so_far)`` is called with the whole generated text after every
    step (each call extending the previous one). It returns True once
    :func:`postprocess` is certain to cut everything after this point:
    single-line and a newline appeared; multi-line and a line past
    ``max_lines`` began, or a line left of the block began (a closer line that
    would be kept is waited for until it ends), or a completed line equals the
    next suffix line, or a line completed its third repetition. Guarantee:
    when ``check(t)`` is True, ``postprocess(u) == postprocess(t)`` for every
    extension ``u`` of ``t``. Once True it stays True.

    Cost per call: amortised over the new characters only (each line is
    examined when it completes, plus the current partial line).
    """

    def __init__(self, prefix: str, suffix: str, multiline: bool, max_lines: int,
                 floor: int | None = None) -> None:
        self._cur = cursor_at(prefix, suffix)
        self._multiline = multiline
        self._max_lines = max_lines
        self.floor = floor   # see postprocess_why
        self.rule: str | None = None   # the rule that stopped generation (None: none did)
        self._reset()

    def restart(self) -> None:
        """Check a new generation from its start (its rule cleared)."""
        self._reset()

    def _reset(self) -> None:
        self._scanner = LineScanner(self._cur, self._multiline, self._max_lines, self.floor)
        self._pos = 0
        self._stopped = False
        self.rule = None

    def check(self, text_so_far: str) -> bool:
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
                self._stopped, self.rule = True, cut[2]
                return True
            scanner.advance(line)
            self._pos = nl + 1
        cut = scanner.decide(text[self._pos:], complete=False)
        if cut is not None:
            self._stopped, self.rule = True, cut[2]
            return True
        return False
