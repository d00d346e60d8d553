"""Where an answer ends: while streaming (:meth:`Ending.may_stop`) and at the end
(:meth:`Ending.shown`). :func:`ending_for` picks the text rules (:class:`TextEnding`) or, for a
block answer with a grammar and ``completion.block_end: model``, the parse (:class:`ParsedEnding`).
:attr:`Answer.end` names why (docs/protocol.md). Nothing here imports torch.
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
        """True, and from then on, once more text cannot change :meth:`shown`; ``text_so_far``:
        the whole text after each step."""

    def shown(self, raw: str, finish: str, rule: str | None) -> Answer:
        """What is shown of ``raw``, which ended with ``finish``; ``rule``: what stopped it."""

    def restart(self) -> None:
        """Check a new generation from its start."""

    def may_repeat_below(self) -> Callable[[str], bool]:
        """The preview's hold test: True while the first line may become one :meth:`shown` drops."""

    def repeats_below(self, text: str) -> bool:
        """Whether :meth:`shown` drops all of ``text`` as repeating the line below."""


def ending_for(prefix: str, suffix: str, language: str | None, mode: Multiline, max_lines: int,
               block_end: str) -> Ending:
    """The request's :class:`Ending`: multi-line per :func:`decide_multiline`, or with a grammar
    also after an unfinished statement (a syntax error near the cursor)."""
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
