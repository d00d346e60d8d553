"""Where a completion ends, and who decides it: the model's own end token or
a cut rule.

The text rules of :mod:`soldaemon.pipeline.postprocess` end a multi-line completion
where its enclosing block ends. That helps a model that runs on and cuts a
model that knows where to stop: a nested function's ``return True`` followed
by the outer function's code, a hole that goes on after a function's end.
Here, for a language with a tree-sitter grammar (:mod:`.syntax`) and with
``completion.block_end: model`` (the default):

* **multi-line or not** (:func:`decide_multiline`): the text rules (an
  empty line, a block opener, column 0 before existing text), and also a
  cursor at the end of an unfinished statement (inside a bracket, after a
  comma or an operator, and a syntax error near the cursor);
* **during decoding** (:func:`stop_checker`): generation stops where the
  text is provably wrong whatever follows -- a line that repeats the
  suffix (or opens a branch, ``elif``/``else``/``except``..., that the
  suffix's statement already has), a line indented less than both the cursor's block and the
  suffix's next line (the hole's code cannot leave the scope the suffix
  goes on in), a line past ``max_lines``, a line's third repetition; not at
  the end of the cursor's block, but at a line past it that starts a new
  definition (``def``/``class``/a decorator, ``function``, ``func``,
  ``fn``...): there the model is writing the next function, not the hole's
  code, and waiting for its end token cost half the decoded tokens of the
  0.5B's scope-cut answers (docs/quality.md, session 23); and, in
  Python, once a line inside the block opens a block and the next line
  with code is not deeper (an opener without its body: the answer is cut
  before it whatever follows);
* **at the end** (:func:`finish`): when the model ended with its own end
  token, its text stands, cut only by those rules; when it did not (a rule
  above stopped it, or ``max_tokens`` or the budget did), the text rules
  cut it at the end of the cursor's block as before. Then the answer must parse with
  the suffix: cut back to the longest line-prefix that adds no syntax error
  to prefix + suffix (an unclosed bracket or string, a block opener without
  a body, a dedent the suffix does not fit).

Every answer carries why it ended (:class:`Answer.end`): ``model`` (its end
token), a cut rule (``line``, ``max_lines``, ``scope``, ``suffix``,
``repeat``, ``parse``, ``opener``), or how generation stopped (``length``,
``budget``, ``cancelled``, ``superseded``). Languages without a grammar, and
``block_end: rules``, keep the text rules alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator

from soldaemon.api import Multiline
from soldaemon.pipeline.postprocess import indent_width, next_indent, postprocess_why
from soldaemon.pipeline.stopcheck import StopChecker
from soldaemon.pipeline.postprocess import decide_multiline as decide_by_text
from soldaemon.pipeline.syntax import INDENTED, Window, bodies_fit, window_at

# Ends that name how generation stopped rather than a cut.
_STOPPED = ("length", "budget", "cancelled", "superseded", "error")


@dataclass(frozen=True)
class Answer:
    """One shown completion and why it ends where it does."""

    text: str   # what the editor shows
    end: str    # "model", a cut rule or how generation stopped (module doc)


@dataclass(frozen=True)
class EndPlan:
    """What the end decisions need for one request, built once per request."""

    prefix: str
    suffix: str
    multiline: bool
    max_lines: int
    window: Window | None   # the parsed window (None: no grammar, or block_end: rules)
    floor: int | None       # see postprocess_why; None: the text rules end the block

    @property
    def parsed(self) -> bool:
        return self.window is not None


# A line that ends with one of these inside an open bracket goes on below.
_GOES_ON = (",", "+", "-", "*", "/", "%", "&", "|", "\\", " and", " or", "&&", "||", "??")


def _may_be_unfinished(prefix: str, suffix: str, mode: Multiline) -> bool:
    """Nothing but closers after the cursor on its line, and the line before
    it ends, inside a bracket it opened, with a comma or a binary operator
    (``total = (a +|``, ``call(x,|``): the parse decides whether the
    statement is unfinished. A line that could end here (``x = a.b|``,
    ``elif n|``) stays single-line: its rest is one line."""
    line = prefix[prefix.rfind("\n") + 1:]
    rest = suffix.split("\n", 1)[0]
    if mode != "auto" or rest.strip(" \t\r)]}\"'`;,") or not line.rstrip().endswith(_GOES_ON):
        return False
    depth = 0
    for ch in line:
        depth += ch in "([{"
        depth -= ch in ")]}" and depth > 0
    return depth > 0


def _error_at_cursor(window: Window) -> bool:
    """A syntax error node between the start of the cursor's line and the
    end of the next line with code (where a parser notices that the
    statement was left unfinished)."""
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
    """The error and missing nodes under ``node`` (a tree-sitter node)."""
    if node.is_error or node.is_missing:
        yield node
    if node.has_error:
        for c in node.children:
            yield from _error_nodes(c)


def plan(prefix: str, suffix: str, language: str | None, mode: Multiline, max_lines: int,
         block_end: str) -> EndPlan:
    """The request's :class:`EndPlan`. Multi-line or not: the text rules
    (:func:`soldaemon.pipeline.postprocess.decide_multiline`), and with a grammar
    also at the end of an unfinished statement (:func:`_may_be_unfinished`,
    confirmed by a syntax error near the cursor). The window is parsed only
    when the answer may be multi-line (a single line's end is its
    newline)."""
    multiline = decide_by_text(prefix, suffix, mode)
    window = None
    if block_end == "model" and (multiline or _may_be_unfinished(prefix, suffix, mode)):
        window = window_at(prefix, suffix, language or "")
        multiline = multiline or (window is not None and _error_at_cursor(window))
    lines = max_lines if multiline else 1
    floor: int | None = None
    if window is not None and multiline:
        line = prefix[prefix.rfind("\n") + 1:]
        here = len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip()) if line.strip() else len(line.expandtabs(4))
        nxt = next_indent(prefix, suffix)
        floor = min(here, nxt) if nxt is not None else 0
    return EndPlan(prefix, suffix, multiline, lines, window if multiline else None, floor)


def stop_checker(p: EndPlan) -> StopChecker:
    """The early stop for this plan (module doc: "during decoding")."""
    if p.window is not None and p.window.language in INDENTED:
        return _BodylessStop(p.prefix, p.suffix, p.multiline, p.max_lines, floor=p.floor, before=p.window.before)
    return StopChecker(p.prefix, p.suffix, p.multiline, p.max_lines, floor=p.floor)


class _BodylessStop(StopChecker):
    """Also stops (rule ``opener``) once a line inside the cursor's block
    opens a block (``...:``) and the next line with code is not deeper: the
    answer is cut before that opener whatever follows (:meth:`Window.fits`
    rejects every longer line-prefix), and, the text not having left the
    block before it, both of :func:`finish`'s cuts keep the same lines up to
    it -- so the shown answer is the one a longer generation would give."""

    def __init__(self, *args: Any, before: str, **kwargs: Any) -> None:
        self._before = before
        super().__init__(*args, **kwargs)

    def check(self, text_so_far: str) -> bool:
        if super().check(text_so_far):
            return True
        head = text_so_far[:text_so_far.rfind("\n") + 1]
        if not self._multiline or "\n" not in head or not _in_block(head, self._scanner.base):
            return False
        if bodies_fit(self._before, text_so_far):
            return False
        self._stopped, self.rule = True, "opener"
        return True


def finish(p: EndPlan, raw: str, finish_reason: str, checker: StopChecker) -> Answer:
    """The shown answer for generated ``raw`` that ended with
    ``finish_reason`` (checker: the one that ran during decoding)."""
    # The model decided the end only when it ended with its own end token. A
    # model stopped by a rule (it went on into the suffix's code, out of the
    # suffix's scope, past max_lines) ran on: what it wrote before that is no
    # more trusted than a run to max_tokens (measured: docs/quality.md).
    by_model = finish_reason == "stop" and checker.rule is None
    if p.window is None or not by_model:
        text, rule = postprocess_why(raw, prefix=p.prefix, suffix=p.suffix, multiline=p.multiline,
                                     max_lines=p.max_lines)
    else:
        text, rule = postprocess_why(raw, prefix=p.prefix, suffix=p.suffix, multiline=p.multiline,
                                     max_lines=p.max_lines, floor=p.floor)
    end = rule or (finish_reason if finish_reason in _STOPPED else "model")
    if p.window is not None and text:
        shown, whole = p.window.longest_fit(text)
        if not whole:
            end = "opener" if _opens(text, shown, p.prefix[p.prefix.rfind("\n") + 1:]) else "parse"
            text = shown
    return Answer(text, end)


def _in_block(text: str, base: int) -> bool:
    """Every line of ``text`` with code after its first is indented at least
    ``base`` (the text has not left the cursor's block)."""
    return all(indent_width(ln) >= base for ln in text.split("\n")[1:] if ln.strip())


def _opens(text: str, shown: str, cursor_line: str = "") -> bool:
    """The cut dropped a line that opens a block (``:`` ``{`` ``(``...)
    without its body: its last line, or its first line with code when that
    ends with ``:`` and the next line with code is not deeper
    (``cursor_line``: what precedes the answer on its first line)."""
    dropped = text[len(shown):].rstrip()
    if not shown:
        dropped = cursor_line + dropped
    lines = [ln.split("#", 1)[0].rstrip() for ln in dropped.split("\n")]
    if lines[-1].endswith((":", "{", "(", "[")) and not lines[-1].endswith("::"):
        return True
    code = [ln for ln in lines if ln.strip()]
    return (len(code) > 1 and code[0].endswith(":") and not code[0].endswith("::")
            and indent_width(code[1]) <= indent_width(code[0]))
