"""What an editor is shown between the daemon's answers, by rules the daemon and sol-lsp both
follow (pure: no I/O, torch or config): type-through (the rest of an answer whose start was
typed, with no model call) and early lines (the first whole lines of a streamed answer)."""

from __future__ import annotations

from typing import Any, MutableMapping, Sequence

from soldaemon.api import CompletionRequest


def typed_since(prefix: str, suffix: str, now_prefix: str, now_suffix: str) -> str | None:
    """Text typed at the cursor since an answer was shown between ``prefix`` and ``suffix``
    ("": none); None when the document changed otherwise."""
    if now_suffix != suffix or not now_prefix.startswith(prefix):
        return None
    return now_prefix[len(prefix):]


def rests_after(typed: str, texts: Sequence[str]) -> list[tuple[int, str]]:
    """(index, rest) of each of ``texts`` that starts with ``typed``, where rest is not blank."""
    return [(i, text[len(typed):]) for i, text in enumerate(texts)
            if text.startswith(typed) and text[len(typed):].strip()]


# The daemon's memory of what it showed.

MAX_SHOWN = 64  # documents remembered for type-through


def prompt_inputs(req: CompletionRequest) -> tuple[Any, ...]:
    """What besides the prefix and suffix shapes a completion's prompt."""
    return (req.context, req.multiline, req.language)


# uri → (prefix, suffix, texts, prompt_inputs) of the last completion shown there
# (texts: the shown one, then a streamed one it replaced); other inputs never match.
Shown = MutableMapping[str, tuple[str, str, tuple[str, ...], tuple[Any, ...]]]


def type_through(shown: Shown, req: CompletionRequest) -> tuple[str, ...]:
    """The rests of the last completion shown in ``req``'s document whose start was typed
    (greedy requests with the same inputs only); () when none."""
    last = shown.get(req.uri)
    if last is None or req.n != 1 or req.temperature > 0:
        return ()
    prefix, suffix, texts, inputs = last
    typed = typed_since(prefix, suffix, req.prefix, req.suffix) if inputs == prompt_inputs(req) else None
    if not typed:
        return ()
    return tuple(rest for _, rest in rests_after(typed, texts))


def remember(shown: Shown, req: CompletionRequest, text: str, streamed: str | None = None) -> None:
    """Record ``text`` (and the ``streamed`` one it replaced) as shown for ``req``; "" forgets.
    Keeps at most :data:`MAX_SHOWN` documents."""
    shown.pop(req.uri, None)
    if text:
        shown[req.uri] = (req.prefix, req.suffix, (text,) if streamed is None else (text, streamed),
                          prompt_inputs(req))
        while len(shown) > MAX_SHOWN:
            shown.pop(next(iter(shown)))


# Early lines (sol-lsp).

# Endings of a line that goes on below: a block opener, an open call, a continuation.
_GOES_ON = (":", "{", "(", "[", ",", "\\", "=", "+", "-", "*", "/", " and", " or", "->", "=>")


def _depth(text: str) -> int:
    """Brackets left open in ``text``, roughly (strings not tracked)."""
    depth = 0
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
    return depth


def _indent(line: str) -> int:
    return len(line.expandtabs(4)) - len(line.expandtabs(4).lstrip())


def early_text(streamed: str, line_prefix: str, next_line: str | None) -> str | None:
    """The whole lines of a streamed answer that may show before the rest, or None: up to the
    block's end, with code, not ending on a line that goes on below, the first not repeating
    ``next_line``."""
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
