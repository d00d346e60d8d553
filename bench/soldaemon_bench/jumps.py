"""Jumps in the keystroke trace (``soldaemon bench --trace --jumps``): after
typing a line, the user moves the cursor to a line in *another function* of
the same file and types there -- once straight away (``jump``), once after
a pause (``jump+pause``) in which an editor plugin warms the new spot (sol-lsp
sends ``warm`` when the cursor stays put). The first keystroke at the new
place is where a completion engine meets its cold path; the trace reports
those keystrokes on their own (see :mod:`soldaemon_bench.trace`).

Pure: which lines to jump to. Building keystrokes and running them is
:mod:`soldaemon_bench.trace`'s.
"""

from __future__ import annotations

import ast
import random
from typing import Sequence

JUMP = "jump"                  # the first keystroke after a jump, typed at once
JUMP_PAUSE = "jump+pause"      # the same after a pause (the spot was warmed)
JUMP_KINDS = (JUMP, JUMP_PAUSE)
JUMP_KEYS = 8                  # keystrokes typed at each jump's place


def function_of(text: str) -> dict[int, int]:
    """1-based line → the first line of the innermost function around it
    (lines outside every function are absent)."""
    spans: list[tuple[int, int]] = []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.end_lineno is not None:
            spans.append((node.lineno, node.end_lineno))
    owner: dict[int, int] = {}
    for start, end in sorted(spans):            # inner functions start later: they win
        for ln in range(start, end + 1):
            owner[ln] = start
    return owner


def jump_targets(text: str, line: int, candidates: Sequence[int], rng: random.Random,
                 n: int = 2) -> list[int]:
    """``n`` lines of ``candidates`` to jump to from ``line``, in that order:
    each in a function other than the one the cursor is in before it (the
    previous target's, at first ``line``'s); fewer when the file has too
    few functions."""
    owner = function_of(text)
    out: list[int] = []
    here = owner.get(line)
    for _ in range(n):
        others = [c for c in candidates if owner.get(c) is not None and owner.get(c) != here and c not in out]
        if not others:
            break
        target = rng.choice(others)
        out.append(target)
        here = owner[target]
    return out
