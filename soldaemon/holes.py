"""Fill-in-the-middle holes cut from real source files, seeded and
reproducible: the shared input of ``soldaemon bench``'s modes."""

from __future__ import annotations

import ast
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

# Real, widely read modules of Python's standard library; present wherever
# Python is.
DEFAULT_MODULES = ("argparse", "textwrap", "json/decoder", "json/encoder", "functools", "shlex",
                   "difflib", "configparser", "csv", "dataclasses", "fractions", "heapq")


@dataclass(frozen=True)
class Hole:
    path: str          # file the hole was cut from
    line: int          # 1-based line of the cursor
    prefix: str
    suffix: str
    expected: str      # the text that was removed (rest of the line)


def default_corpus() -> list[Path]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [p for m in DEFAULT_MODULES if (p := stdlib / f"{m}.py").exists()]


def _body_lines(tree: ast.AST, text: str) -> list[int]:
    """1-based line numbers of statements inside function bodies, excluding
    docstrings."""
    lines: list[int] = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
                body = body[1:]
            for stmt in body:
                if isinstance(stmt, (ast.Assign, ast.Return, ast.Expr, ast.AugAssign, ast.AnnAssign, ast.If,
                                     ast.For, ast.While, ast.Raise)) and stmt.lineno == stmt.end_lineno:
                    lines.append(stmt.lineno)
    return lines


def statement_lines(files: list[Path]) -> list[tuple[Path, str, int]]:
    """(file, its text, 1-based line) of every single-line statement inside a
    function body (docstrings excluded) in ``files``; unparsable files skipped."""
    found: list[tuple[Path, str, int]] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        found.extend((path, text, ln) for ln in _body_lines(tree, text))
    return found


def cut_line_holes(files: list[Path], n: int, seed: int = 0, *, min_rest: int = 6) -> list[Hole]:
    """``n`` one-line holes: cursor at a random column of a single-line
    statement inside a function body; the rest of that line is the answer."""
    rng = random.Random(seed)
    candidates = statement_lines(files)
    rng.shuffle(candidates)
    holes: list[Hole] = []
    for path, text, ln in candidates:
        lines = text.splitlines(keepends=True)
        line = lines[ln - 1]
        body = line.rstrip("\n")
        indent = len(body) - len(body.lstrip())
        if len(body) - indent < min_rest + 4:
            continue
        col = rng.randrange(indent + 2, len(body) - min_rest + 1)
        start = sum(len(s) for s in lines[: ln - 1])
        prefix = text[: start + col]
        suffix = text[start + len(body):]
        holes.append(Hole(str(path.name), ln, prefix, suffix, body[col:]))
        if len(holes) == n:
            break
    return holes


if __name__ == "__main__":  # quick look: python -m soldaemon.holes
    for h in cut_line_holes(default_corpus(), 5):
        sys.stdout.write(f"{h.path}:{h.line}: …{h.prefix[-30:]!r} ⟨{h.expected!r}⟩\n")
