"""Where an answer ends, and who decides it: the model's own end token or a
cut rule. The one place that decides it, seen twice per answer: while the
text streams (:meth:`Ending.may_stop`: may generation stop now?) and at the
end (:meth:`Ending.shown`: what is shown, and why it ends there).

:func:`ending_for` picks one of two strategies per request:

* the text rules (:class:`~soldaemon.pipeline.ending.text.TextEnding`): one
  line, or a block that ends where the cursor's block ends; what repeats
  the suffix cut; a third repetition cut;
* the parse (:class:`~soldaemon.pipeline.ending.parsed.ParsedEnding`), for a
  block answer in a language with a tree-sitter grammar and
  ``completion.block_end: model`` (the default): the model's own end
  stands, cut only where the text is provably wrong whatever follows (a
  line that repeats the suffix or leaves the scope the suffix goes on in, a
  new definition past the cursor's block, in Python a block opener without
  its body), and the answer must parse with the suffix. Measured in
  docs/quality.md ("Where a block ends, and who ends it").

Every answer carries why it ended (:attr:`Answer.end`): ``model`` (its end
token), a cut rule (``line``, ``max_lines``, ``scope``, ``suffix``,
``repeat``, ``parse``, ``opener``), or how generation stopped (``length``,
``budget``, ``cancelled``, ``superseded``). The decode loop never sees this
package: it is handed ``may_stop`` as a plain callable. Nothing here
imports torch.
"""

from __future__ import annotations

from typing import Protocol

from soldaemon.api import Multiline
from soldaemon.pipeline.ending.lines import cursor_at, decide_multiline
from soldaemon.pipeline.ending.parsed import ParsedEnding, error_at_cursor, may_be_unfinished, window_at
from soldaemon.pipeline.ending.text import Answer, TextEnding, may_repeat_below, postprocess, repeats_below

__all__ = ["Answer", "Ending", "ParsedEnding", "TextEnding", "decide_multiline", "ending_for", "may_repeat_below",
           "postprocess", "repeats_below"]

class Ending(Protocol):
    """Where one request's answer ends (one per generation; see the module
    doc)."""

    multiline: bool
    max_lines: int      # 1 when single-line
    rule: str | None    # the rule that stopped generation (None: none did)

    def may_stop(self, text_so_far: str) -> bool:
        """Called with the whole generated text after every step: True once
        more text could not change what :meth:`shown` shows (then it stays
        True)."""

    def shown(self, raw: str, finish: str, rule: str | None) -> Answer:
        """What is shown of ``raw``, which ended with ``finish`` (the model
        part's finish reason) after ``rule`` stopped it (None: none did)."""

    def restart(self) -> None:
        """Check a new generation from its start."""


def ending_for(prefix: str, suffix: str, language: str | None, mode: Multiline, max_lines: int,
               block_end: str) -> Ending:
    """The request's :class:`Ending`. Multi-line or not: the text rules
    (:func:`decide_multiline`), and with a grammar also at the end of an
    unfinished statement (confirmed by a syntax error near the cursor). The
    window is parsed only when the answer may be multi-line (a single
    line's end is its newline)."""
    multiline = decide_multiline(prefix, suffix, mode)
    window = None
    if block_end == "model" and (multiline or may_be_unfinished(prefix, suffix, mode)):
        window = window_at(prefix, suffix, language or "")
        multiline = multiline or (window is not None and error_at_cursor(window))
    if window is None or not multiline:
        return TextEnding(prefix, suffix, multiline, max_lines if multiline else 1)
    line = prefix[prefix.rfind("\n") + 1:]
    here = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip()) if line.strip() else len(line.expandtabs(4))
    cur = cursor_at(prefix, suffix)    # the floor: the cursor's indentation or, less, the suffix's next line's
    floor = min(here, cur.next_indent) if cur.next_line is not None else 0
    return ParsedEnding(prefix, suffix, max_lines, window, floor)
