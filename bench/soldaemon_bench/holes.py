"""Fill-in-the-middle holes cut from real source files, seeded and
reproducible: the shared input of ``soldaemon bench``'s modes. Python files
are read with :mod:`ast`, JavaScript ones with tree-sitter's grammar
(``--quality`` cuts both; the other modes cut Python)."""

from __future__ import annotations

import ast
import random
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    language: str = "python"   # the LSP language id an editor would send

# file suffix -> LSP language id of the files cut_holes reads
LANGUAGES = {".py": "python", ".js": "javascript", ".mjs": "javascript", ".cjs": "javascript"}
# how a comment line starts, per language (no hole is cut on one)
COMMENT_STARTS = {"python": ("#",), "javascript": ("//", "/*", "*")}


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


Spans = tuple[list[list[tuple[int, int]]], set[int]]   # (statement lists as (first, last) lines, string lines)


def _python_spans(text: str) -> Spans | None:
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    bodies = [[(st.lineno, st.end_lineno or st.lineno) for st in stmts] for stmts in _bodies(tree)]
    return bodies, _string_lines(tree)


# tree-sitter node types of JavaScript functions: the statement blocks inside one are bodies
_JS_FUNCTIONS = frozenset({"function_declaration", "function_expression", "function", "arrow_function",
                           "method_definition", "generator_function_declaration", "generator_function"})
_JS_SPANNING = frozenset({"template_string", "string", "comment", "regex"})


def _javascript_spans(text: str) -> Spans | None:
    """Statement lists of the blocks inside functions, each statement alone
    on its lines (it starts at its line's first character and ends its
    last line, a trailing comment aside), and the lines a multi-line
    string, template or comment covers. None: the grammar is missing or the
    file does not parse."""
    try:
        import tree_sitter
        import tree_sitter_javascript
    except ImportError:
        return None
    source = text.encode("utf-8")
    tree = tree_sitter.Parser(tree_sitter.Language(tree_sitter_javascript.language())).parse(source)
    if tree.root_node.has_error:
        return None
    lines = source.split(b"\n")
    bodies: list[list[tuple[int, int]]] = []
    strings: set[int] = set()

    def alone(node: Any) -> bool:
        (r0, c0), (r1, c1) = node.start_point, node.end_point
        after = lines[r1][c1:].strip()
        return not lines[r0][:c0].strip() and (not after or after.startswith(b"//"))

    stack: list[tuple[Any, bool]] = [(tree.root_node, False)]
    while stack:
        node, in_function = stack.pop()
        (r0, _), (r1, _) = node.start_point, node.end_point
        if node.type in _JS_SPANNING and r1 > r0:
            strings.update(range(r0 + 1, r1 + 2))
        if node.type == "statement_block" and in_function:
            stmts = [c for c in node.named_children if c.type != "comment"]
            if stmts and all(alone(c) for c in stmts):
                bodies.append([(c.start_point[0] + 1, c.end_point[0] + 1) for c in stmts])
        inside = in_function or node.type in _JS_FUNCTIONS
        stack.extend((c, inside) for c in node.children)
    return bodies, strings


def _parsed(files: list[Path]) -> list[tuple[Path, str, str, Spans]]:
    """(path, text, language, spans) of each file whose language is known
    and which parses."""
    out: list[tuple[Path, str, str, Spans]] = []
    for path in files:
        language = LANGUAGES.get(path.suffix)
        if language is None:
            continue
        text = path.read_text(encoding="utf-8")
        spans = _python_spans(text) if language == "python" else _javascript_spans(text)
        if spans is not None:
            out.append((path, text, language, spans))
    return out


def _line_hole(rng: random.Random, path: Path, text: str, ln: int, min_rest: int,
               language: str = "python") -> Hole | None:
    lines = text.splitlines(keepends=True)
    body = lines[ln - 1].rstrip("\r\n").rstrip()
    indent = len(body) - len(body.lstrip())
    if len(body) - indent < min_rest + 2 or body.lstrip().startswith(COMMENT_STARTS[language]):
        return None
    col = rng.randrange(indent, len(body) - min_rest + 1)
    start = sum(len(s) for s in lines[: ln - 1])
    rest = body[col:]
    if not rest.strip() or len(rest.strip()) < 2:
        return None
    return Hole(path.name, ln, text[: start + col], text[start + len(body):], rest, "line", str(path), language)


def _block_hole(path: Path, text: str, first: int, last: int, language: str = "python") -> Hole | None:
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
    return Hole(path.name, first, text[: start + indent], text[end:], expected, "block", str(path), language)


@dataclass(frozen=True)
class _Cand:
    path: Path
    text: str
    first: int   # 1-based lines, inclusive
    last: int
    language: str = "python"


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

    Python (``.py``) and JavaScript (``.js``, ``.mjs``, ``.cjs``) files;
    others and unparsable ones are skipped. Seeded and reproducible: the
    same files, ``n`` and ``seed`` give the same holes. Raises ValueError
    for an unknown kind.
    """
    for k in kinds:
        if k not in ("line", "block"):
            raise ValueError(f"unknown hole kind {k!r} (expected 'line' or 'block')")
    rng = random.Random(seed)
    line_cands: list[_Cand] = []
    block_cands: list[_Cand] = []
    for path, text, language, (bodies, strings) in _parsed(files):
        n_lines = text.count("\n") + 1
        body_lines: set[int] = set()
        for stmts in bodies:
            for first, last in stmts:
                body_lines.update(range(first, last + 1))
            for i, (first, _) in enumerate(stmts):
                for j in range(i, len(stmts)):
                    span = range(first, stmts[j][1] + 1)
                    if len(span) > 6:
                        break
                    if len(span) >= 2 and not strings.intersection(span):
                        block_cands.append(_Cand(path, text, first, span[-1], language))
        all_lines = text.splitlines()
        for ln in sorted(body_lines - strings):
            if ln <= n_lines and all_lines[ln - 1].strip():
                line_cands.append(_Cand(path, text, ln, ln, language))
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
                hole = _line_hole(rng, cand.path, cand.text, cand.first, min_rest, cand.language)
            else:
                hole = _block_hole(cand.path, cand.text, cand.first, cand.last, cand.language)
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
