"""The words of block structure that the cut rules read
(:mod:`soldaemon.pipeline.postprocess`): which dedented lines go on with
the statement the cursor is inside, and which lines start a definition."""

from __future__ import annotations

from typing import Iterable

# A dedented line that goes on with the statement the cursor is inside, not
# after it: keyword -> the header keywords it may follow (``elif`` after the
# body of an ``if``/``elif`` ...). Such a line is not the end of the block.
CONTINUES: dict[str, tuple[str, ...]] = {
    "elif": ("if", "elif"),
    "else": ("if", "elif", "for", "while", "try", "except", "async for", "async while"),
    "except": ("try", "except"),
    "finally": ("try", "except", "else"),
    "case": ("case",),
}
# Brace languages: ``} else {``, ``} catch (e) {``, ``} finally {``, ``} while (x);``.
BRACE_CONTINUES = ("else", "catch", "finally", "except", "while")
# A line that starts a new definition (a decorator too). Past the end of the
# cursor's block, where a floor lets the text go on (a nested function's end,
# then the outer function's code), such a line is not the hole's code going
# on but the model writing the next function: the answer ends before it.
DEFINES = ("def", "async def", "class", "function", "async function", "func", "fn", "pub fn", "impl", "export")


def starts_definition(line: str) -> bool:
    """``line`` (complete or not) starts a definition: a word of
    :data:`DEFINES` then a space and a name (``def f``, ``func (r T)``,
    ``function* g``; not ``fn(x)``, a call, nor ``function = 1``), or a
    decorator ``@name``. An incomplete line is not one until that much of
    it is there, so the answer cannot change when the line goes on."""
    lead = line.lstrip()
    if lead.startswith("@"):
        return len(lead) > 1 and (lead[1].isalpha() or lead[1] == "_")
    word = keyword(lead, DEFINES)
    if word is None or lead[len(word):len(word) + 1] not in (" ", "\t"):
        return False
    name = lead[len(word):].lstrip()
    return bool(name) and (name[0].isalpha() or name[0] in "_(*")


def keyword(stripped: str, words: tuple[str, ...] | Iterable[str]) -> str | None:
    """The word of ``words`` that ``stripped`` starts with as a whole word."""
    for w in words:
        if stripped.startswith(w) and (len(stripped) == len(w) or not (stripped[len(w)].isalnum()
                                                                        or stripped[len(w)] == "_")):
            return w
    return None


def header_word(header: str) -> str | None:
    stripped = header.strip()
    return keyword(stripped, ("async for", "async while", "if", "elif", "else", "for", "while", "try", "except",
                               "case"))
