"""Where an answer ends, and who decides it: the model's own end token or a
cut rule. The one place that decides it, seen twice per answer: while the
text streams (:meth:`Ending.may_stop`: may generation stop now?) and at the
end (:meth:`Ending.shown`: what is shown, and why it ends there).

:func:`ending_for` picks one of two strategies per request, both behind
:class:`Ending`:

* the text rules (:class:`~soldaemon.pipeline.ending.text.TextEnding`, over
  :mod:`.lines`): one line, or a block that ends where the cursor's block
  ends; what repeats the suffix cut; a third repetition cut;
* the parse (:class:`~soldaemon.pipeline.ending.parsed.ParsedEnding`), for a
  multi-line answer in a language with a tree-sitter grammar and
  ``completion.block_end: model`` (the default). The text rules cut a model
  that knows where to stop (a nested function's ``return True`` followed by
  the outer function's code, a hole that goes on after a function's end), so
  here:

  - **multi-line or not**: the text rules (an empty line, a block opener,
    column 0 before existing text), and also a cursor at the end of an
    unfinished statement (inside a bracket, after a comma or an operator,
    and a syntax error near the cursor);
  - **during decoding**: generation stops where the text is provably wrong
    whatever follows -- a line that repeats the suffix (or opens a branch,
    ``elif``/``else``/``except``..., that the suffix's statement already
    has), a line indented less than both the cursor's block and the
    suffix's next line, a line past ``max_lines``, a line's third
    repetition; not at the end of the cursor's block, but at a line past it
    that starts a new definition (``def``/``class``/a decorator,
    ``function``, ``func``, ``fn``...): there the model is writing the next
    function, and waiting for its end token cost half the decoded tokens of
    the 0.5B's scope-cut answers (docs/quality.md); and, in Python, once a
    line inside the block opens a block and the next line with code is not
    deeper (an opener without its body);
  - **at the end**: when the model ended with its own end token, its text
    stands, cut only by those rules; when it did not (a rule above stopped
    it, or ``max_tokens`` or the budget did), the text rules cut it at the
    end of the cursor's block. Then the answer must parse with the suffix:
    cut back to the longest line-prefix that adds no syntax error to prefix
    + suffix.

Every answer carries why it ended (:attr:`Answer.end`): ``model`` (its end
token), a cut rule (``line``, ``max_lines``, ``scope``, ``suffix``,
``repeat``, ``parse``, ``opener``), or how generation stopped (``length``,
``budget``, ``cancelled``, ``superseded``).

The decode loop never sees this package: it is handed ``may_stop`` as a
plain callable. Nothing here imports torch.
"""

from __future__ import annotations

from typing import Protocol

from soldaemon.api import Multiline
from soldaemon.pipeline.ending.lines import decide_multiline, next_indent
from soldaemon.pipeline.ending.parsed import ParsedEnding, error_at_cursor, may_be_unfinished, window_at
from soldaemon.pipeline.ending.text import Answer, TextEnding, may_repeat_below, postprocess, repeats_below

__all__ = ["Answer", "Ending", "TextEnding", "ParsedEnding", "ending_for", "decide_multiline",
           "may_repeat_below", "postprocess", "repeats_below"]


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
    nxt = next_indent(prefix, suffix)
    return ParsedEnding(prefix, suffix, max_lines, window, min(here, nxt) if nxt is not None else 0)
