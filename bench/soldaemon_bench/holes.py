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
    expected: str      # the text that was removed (rest of the line, or whole lines)
    kind: str = "line"  # "line": the rest of one line; "block": 2-6 whole lines
    file: str = ""      # the file's full path (not written to results: it names this machine)


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
        holes.append(Hole(str(path.name), ln, prefix, suffix, body[col:], file=str(path)))
        if len(holes) == n:
            break
    return holes


def _string_lines(tree: ast.AST) -> set[int]:
    """1-based lines covered by a docstring-like expression (a string
    statement, one line or many) or by any string literal spanning lines."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Constant, ast.JoinedStr)) and node.end_lineno is not None:
            if isinstance(node, ast.JoinedStr) or isinstance(node.value, (str, bytes)):
                if node.end_lineno > node.lineno:
                    out.update(range(node.lineno, node.end_lineno + 1))
        if isinstance(node, ast.Expr) and isinstance(node.value, (ast.Constant, ast.JoinedStr)) \
                and node.end_lineno is not None:
            value = node.value
            if isinstance(value, ast.JoinedStr) or isinstance(value.value, str):
                out.update(range(node.lineno, node.end_lineno + 1))
    return out


def _bodies(tree: ast.AST) -> list[list[ast.stmt]]:
    """Statement lists inside function bodies (nested blocks included), a
    leading docstring left out."""
    out: list[list[ast.stmt]] = []
    funcs = [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    seen: set[int] = set()
    for fn in funcs:
        for node in ast.walk(fn):
            for name in ("body", "orelse", "finalbody"):
                stmts = getattr(node, name, None)
                if not isinstance(stmts, list) or not stmts or not isinstance(stmts[0], ast.stmt):
                    continue
                if id(stmts) in seen:
                    continue
                seen.add(id(stmts))
                if node is fn and isinstance(stmts[0], ast.Expr) and isinstance(stmts[0].value, ast.Constant):
                    stmts = stmts[1:]
                if stmts:
                    out.append(stmts)
            if isinstance(node, ast.Try):
                for h in node.handlers:
                    if id(h.body) not in seen:
                        seen.add(id(h.body))
                        out.append(h.body)
    return out


def _parsed(files: list[Path]) -> list[tuple[Path, str, ast.AST]]:
    out: list[tuple[Path, str, ast.AST]] = []
    for path in files:
        text = path.read_text(encoding="utf-8")
        try:
            out.append((path, text, ast.parse(text)))
        except SyntaxError:
            continue
    return out


def _line_hole(rng: random.Random, path: Path, text: str, ln: int, min_rest: int) -> Hole | None:
    lines = text.splitlines(keepends=True)
    body = lines[ln - 1].rstrip("\r\n").rstrip()
    indent = len(body) - len(body.lstrip())
    if len(body) - indent < min_rest + 2 or body.lstrip().startswith("#"):
        return None
    col = rng.randrange(indent, len(body) - min_rest + 1)
    start = sum(len(s) for s in lines[: ln - 1])
    rest = body[col:]
    if not rest.strip() or len(rest.strip()) < 2:
        return None
    return Hole(path.name, ln, text[: start + col], text[start + len(body):], rest, "line", str(path))


def _block_hole(path: Path, text: str, first: int, last: int) -> Hole | None:
    """Lines ``first..last`` (1-based, inclusive) removed; the cursor sits
    after the first line's indentation, the suffix starts with the newline
    that ended the last line."""
    lines = text.splitlines(keepends=True)
    head = lines[first - 1]
    indent = len(head) - len(head.lstrip(" \t"))
    start = sum(len(s) for s in lines[: first - 1])
    end = sum(len(s) for s in lines[:last]) - len(lines[last - 1]) + len(lines[last - 1].rstrip("\r\n").rstrip())
    expected = text[start + indent: end]
    if not expected.strip() or "\n" not in expected:
        return None
    return Hole(path.name, first, text[: start + indent], text[end:], expected, "block", str(path))


@dataclass(frozen=True)
class _Cand:
    path: Path
    text: str
    first: int   # 1-based lines, inclusive
    last: int


def _interleave(rng: random.Random, cands: list[_Cand]) -> list[_Cand]:
    """``cands`` shuffled within each file, the files in a shuffled order,
    then taken one per file in turn: big files do not crowd out small ones."""
    by_file: dict[str, list[_Cand]] = {}
    for c in cands:
        by_file.setdefault(str(c.path), []).append(c)
    groups = list(by_file.values())
    for g in groups:
        rng.shuffle(g)
    rng.shuffle(groups)
    out: list[_Cand] = []
    for i in range(max((len(g) for g in groups), default=0)):
        out.extend(g[i] for g in groups if i < len(g))
    return out


def cut_holes(files: list[Path], n: int, seed: int = 0, *, min_rest: int = 6,
              kinds: tuple[str, ...] = ("line", "block")) -> list[Hole]:
    """``n`` holes inside function bodies (never inside a docstring or a
    multi-line string), taking ``kinds`` in turn:

    - ``line``: the cursor at a random column of a non-blank, non-comment
      line; the answer is the rest of that line (at least ``min_rest``
      characters);
    - ``block``: 2-6 whole lines made of consecutive statements of one body;
      the cursor after the first line's indentation.

    Seeded and reproducible: the same files, ``n`` and ``seed`` give the same
    holes. Unparsable files are skipped. Raises ValueError for an unknown kind.
    """
    for k in kinds:
        if k not in ("line", "block"):
            raise ValueError(f"unknown hole kind {k!r} (expected 'line' or 'block')")
    rng = random.Random(seed)
    line_cands: list[_Cand] = []
    block_cands: list[_Cand] = []
    for path, text, tree in _parsed(files):
        strings = _string_lines(tree)
        n_lines = text.count("\n") + 1
        body_lines: set[int] = set()
        for stmts in _bodies(tree):
            for st in stmts:
                assert st.end_lineno is not None
                body_lines.update(range(st.lineno, st.end_lineno + 1))
            for i, st in enumerate(stmts):
                for j in range(i, len(stmts)):
                    end = stmts[j].end_lineno
                    assert end is not None
                    span = range(st.lineno, end + 1)
                    if len(span) > 6:
                        break
                    if len(span) >= 2 and not strings.intersection(span):
                        block_cands.append(_Cand(path, text, st.lineno, end))
        all_lines = text.splitlines()
        for ln in sorted(body_lines - strings):
            if ln <= n_lines and all_lines[ln - 1].strip():
                line_cands.append(_Cand(path, text, ln, ln))
    pools = {"line": iter(_interleave(rng, line_cands)), "block": iter(_interleave(rng, block_cands))}
    holes: list[Hole] = []
    used: set[tuple[str, int]] = set()
    turn = 0
    exhausted: set[str] = set()
    while len(holes) < n and len(exhausted) < len(kinds):
        kind = kinds[turn % len(kinds)]
        turn += 1
        if kind in exhausted:
            continue
        for cand in pools[kind]:
            if kind == "line":
                hole = _line_hole(rng, cand.path, cand.text, cand.first, min_rest)
            else:
                hole = _block_hole(cand.path, cand.text, cand.first, cand.last)
            if hole is not None and (str(cand.path), cand.first) not in used:
                used.add((str(cand.path), cand.first))
                holes.append(hole)
                break
        else:
            exhausted.add(kind)
    return holes


if __name__ == "__main__":  # quick look: python -m soldaemon_bench.holes
    for h in cut_line_holes(default_corpus(), 5):
        sys.stdout.write(f"{h.path}:{h.line}: …{h.prefix[-30:]!r} ⟨{h.expected!r}⟩\n")
