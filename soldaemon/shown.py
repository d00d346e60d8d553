"""What an editor is shown between the daemon's answers, decided by rules
that the daemon and sol-lsp both follow (pure: no I/O, no torch, no config
reader).

* **Type-through**: the user typed the beginning of the answer on screen;
  the rest of it is the answer, with no model call (:func:`typed_since`,
  :func:`rests_after`). The daemon answers a request so from the answers it
  remembers (:func:`type_through`, :func:`remember`); sol-lsp answers without a round trip
  from the last answer it received.
* **Early lines**: the first whole lines of a streamed multi-line answer
  that sol-lsp may show before the rest arrives (:func:`early_text`). The
  test is coarser than the daemon's own ending
  (:mod:`soldaemon.pipeline.ending`: that one sees the whole answer and may
  parse it): it only ever waits where the ending might still cut.
"""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

from soldaemon.api import CompletionRequest


def typed_since(prefix: str, suffix: str, now_prefix: str, now_suffix: str) -> str | None:
    """The text typed at the cursor since an answer was shown between
    ``prefix`` and ``suffix``, now that the cursor is between
    ``now_prefix`` and ``now_suffix``; None when the text after the cursor
    changed or the text before it does not extend the old one ("" when
    nothing was typed)."""
    if now_suffix != suffix or not now_prefix.startswith(prefix):
        return None
    return now_prefix[len(prefix):]


def rests_after(typed: str, texts: Sequence[str]) -> list[tuple[int, str]]:
    """(index, rest) of each of ``texts`` that starts with ``typed`` and
    holds more than white space after it: what is left of it to show."""
    return [(i, text[len(typed):]) for i, text in enumerate(texts)
            if text.startswith(typed) and text[len(typed):].strip()]


# -- the daemon's memory of what it showed -----------------------------------

MAX_SHOWN = 64  # documents remembered for type-through


def prompt_inputs(req: CompletionRequest) -> tuple[Any, ...]:
    """What besides the prefix and suffix shapes a completion's prompt."""
    return (req.context, req.multiline, req.language)


# uri → (prefix, suffix, texts, the other prompt inputs) of the last
# completion shown there (texts: the shown one, then a streamed one it
# replaced). The inputs (context, multiline, language) are part of the key: a
# request from another client with other context for the same uri must not be
# answered with text made from this one's context.
Shown = MutableMapping[str, tuple[str, str, tuple[str, ...], tuple[Any, ...]]]


def type_through(shown: Shown, req: CompletionRequest) -> tuple[str, ...]:
    """The rests of the last completion for ``req``'s document when the
    user typed its beginning (same suffix and other prompt inputs, greedy,
    one candidate): of the shown text first, then of the streamed one it
    replaced where that was typed too; () when none."""
    last = shown.get(req.uri)
    if last is None or req.n != 1 or req.temperature > 0:
        return ()
    prefix, suffix, texts, inputs = last
    typed = typed_since(prefix, suffix, req.prefix, req.suffix) if inputs == prompt_inputs(req) else None
    if not typed:
        return ()
    return tuple(rest for _, rest in rests_after(typed, texts))


def remember(shown: Shown, req: CompletionRequest, text: str, streamed: str | None = None) -> None:
    """Record ``text`` as the completion shown for ``req``, and the
    ``streamed`` one it replaced (the newest of at most :data:`MAX_SHOWN`
    documents; an empty ``text``: nothing is shown there now)."""
    shown.pop(req.uri, None)
    if text:
        shown[req.uri] = (req.prefix, req.suffix, (text,) if streamed is None else (text, streamed),
                          prompt_inputs(req))
        while len(shown) > MAX_SHOWN:
            shown.pop(next(iter(shown)))


# -- early lines (sol-lsp) ----------------------------------------------------

# Endings of a line that goes on below: a block opener, an open call, a continuation.
_GOES_ON = (":", "{", "(", "[", ",", "\\", "=", "+", "-", "*", "/", " and", " or", "->", "=>")


def _depth(text: str) -> int:
    """Brackets left open in ``text`` (strings and comments not tracked:
    a rough count that only ever delays an early answer)."""
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
    return depth


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def early_text(streamed: str, line_prefix: str, next_line: str | None) -> str | None:
    """The whole lines of a streamed multi-line answer that may be shown
    before the rest arrives, or None (wait): the lines before the last
    newline, up to the first later line indented less than the cursor (the
    block ends there), when they have code, do not end on a line that goes
    on below (a block opener, an open bracket, a trailing operator), and
    the first does not repeat ``next_line`` (the document's next non-blank
    line) -- the answers the daemon's own end rules would still cut."""
    head, newline, _ = streamed.rpartition("\n")
    if not newline:
        return None
    floor = _indent(line_prefix) if not line_prefix.strip() else None
    lines = head.split("\n")
    kept = lines[:1]
    for line in lines[1:]:
        if floor is not None and line.strip() and _indent(line) < floor:
            break
        kept.append(line)
    text = "\n".join(kept).rstrip()
    if not text.strip():
        return None
    if next_line is not None and (line_prefix + kept[0]).strip() == next_line.strip():
        return None
    last = next((ln.split("#", 1)[0].rstrip() for ln in reversed(kept) if ln.split("#", 1)[0].strip()), "")
    if not last or last.endswith(_GOES_ON) or _depth(line_prefix + text) > _depth(line_prefix):
        return None
    return text
