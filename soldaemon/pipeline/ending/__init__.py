"""Where an answer ends: while the text streams (:meth:`Ending.may_stop`)
and at the end (:meth:`Ending.shown`, what is shown and why it ends there).

:func:`ending_for` picks a strategy per request: the text rules
(:class:`TextEnding`), or for a block answer with a tree-sitter grammar and
``completion.block_end: model`` the parse (:class:`ParsedEnding`: the model's
end stands, cut only where the text is provably wrong). :attr:`Answer.end`
names why an answer ended (docs/protocol.md). The decode loop gets only
``may_stop`` as a plain callable; nothing here imports torch.
"""

from __future__ import annotations

from typing import Callable, Protocol

from soldaemon.api import Multiline
from soldaemon.pipeline.ending.lines import cursor_at, decide_multiline
from soldaemon.pipeline.ending.parsed import ParsedEnding, error_at_cursor, may_be_unfinished, window_at
from soldaemon.pipeline.ending.text import Answer, TextEnding, postprocess

__all__ = ["Answer", "Ending", "ParsedEnding", "TextEnding", "decide_multiline", "ending_for", "postprocess"]

class Ending(Protocol):
    """Where one request's answer ends (one per generation)."""

    multiline: bool
    max_lines: int      # 1 when single-line
    rule: str | None    # the rule that stopped generation (None: none did)

    def may_stop(self, text_so_far: str) -> bool:
        """True once more text could not change what :meth:`shown` shows
        (then it stays True); called with the whole text after every step."""

    def shown(self, raw: str, finish: str, rule: str | None) -> Answer:
        """What is shown of ``raw``, which ended with ``finish`` after ``rule``
        stopped it (None: none did)."""

    def restart(self) -> None:
        """Check a new generation from its start."""

    def may_repeat_below(self) -> Callable[[str], bool]:
        """The preview's test: True while a first line on a line of its own
        may still become the line below the cursor (which :meth:`shown` drops)."""

    def repeats_below(self, text: str) -> bool:
        """Whether :meth:`shown` drops all of ``text`` for repeating the line below."""


def ending_for(prefix: str, suffix: str, language: str | None, mode: Multiline, max_lines: int,
               block_end: str) -> Ending:
    """The request's :class:`Ending`: multi-line per :func:`decide_multiline`,
    or with a grammar also after an unfinished statement (a syntax error
    near the cursor)."""
    multiline = decide_multiline(prefix, suffix, mode)
    cur = cursor_at(prefix, suffix)
    window = None
    if block_end == "model" and (multiline or may_be_unfinished(prefix, suffix, mode)):
        window = window_at(prefix, suffix, language or "")
        multiline = multiline or (window is not None and error_at_cursor(window))
    if window is None or not multiline:
        return TextEnding(prefix, suffix, multiline, max_lines if multiline else 1, cur=cur)
    line = prefix[prefix.rfind("\n") + 1:]
    here = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip()) if line.strip() else len(line.expandtabs(4))
    # the floor: the cursor's indentation or, less, the suffix's next line's
    floor = min(here, cur.next_indent) if cur.next_line is not None else 0
    return ParsedEnding(prefix, suffix, max_lines, window, floor, cur)
