"""The repository's text says what is true now, and its links lead somewhere.

- No numbered work period ("session" followed by a number, spelled out
  ordinals in Markdown, result names like ``block-128-s25.json``) appears in
  Markdown, in the comments and docstrings of .py/.ts files, in .sh/.yaml
  files, in test names or in any tracked file's name: dates and commits
  name a measurement, CHANGELOG.md and git hold the history.
- Every relative link in README.md and docs/**/*.md points to a tracked or
  present file and, with ``#anchor``, to a heading of that file (GitHub's
  anchors: lower case, punctuation dropped, spaces as hyphens, ``-1``,
  ``-2`` for repeated headings).

The source is read as text (:mod:`tokenize` for Python comments and
docstrings), never imported; the file list is ``git ls-files``.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import subprocess
import tokenize
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# spelled in two pieces so that this file does not match itself
WORD = "sess" + "ions?"
NUMBERED = re.compile(r"(?<![A-Za-z])" + WORD + r"[ _-]?\d+", re.IGNORECASE)
ORDINALS = "first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth"
SPELLED = re.compile(r"\b(?:" + ORDINALS + r") " + WORD + r"\b", re.IGNORECASE)
# a result file named by its work period: block-128-s25.json, summary-s26.md, trace-s14b.png
NAMED = re.compile(r"(?:^|[-_.])s\d+[a-z]?(?=[-_.])")
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
AREAS = ("markdown", "scripts", "tests", "soldaemon", "lsp", "other")


def tracked() -> list[str]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p and (REPO / p).is_file()]


def _area(path: str) -> str:
    if path.endswith(".md"):
        return "markdown"
    top = path.split("/", 1)[0]
    return top if top in AREAS else "other"


def python_text(source: str) -> list[tuple[int, str]]:
    """The comments and docstrings of a Python file, with their line numbers,
    and every test name (a ``def test_...``)."""
    found: list[tuple[int, str]] = []
    try:
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type == tokenize.COMMENT:
                found.append((tok.start[0], tok.string))
    except (tokenize.TokenError, SyntaxError):
        pass
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return [(n + 1, line) for n, line in enumerate(source.splitlines())]
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) \
                    and isinstance(first.value.value, str):
                for k, line in enumerate(first.value.value.splitlines()):
                    found.append((first.value.lineno + k, line))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
            found.append((node.lineno, node.name))
    return found


TS_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)


def ts_text(source: str) -> list[tuple[int, str]]:
    """The comments of a TypeScript/JavaScript file, with their first line's number."""
    return [(source.count("\n", 0, m.start()) + 1, m.group()) for m in TS_COMMENT.finditer(source)]


def mentions(path: str, text: str) -> list[str]:
    """Every mention of a numbered work period in the part of ``text`` that is prose."""
    if path.endswith(".py"):
        parts = python_text(text)
    elif path.endswith((".ts", ".js")):
        parts = ts_text(text)
    elif path.endswith((".md", ".sh", ".yaml", ".yml")):
        parts = list(enumerate(text.splitlines(), 1))
    else:
        parts = []
    found = []
    for line, part in parts:
        for pattern in (NUMBERED, SPELLED) if path.endswith(".md") else (NUMBERED,):
            for m in pattern.finditer(part):
                found.append(f"{path}:{line}: {m.group()!r}")
    if NAMED.search(Path(path).name):
        found.append(f"{path}: the file's name")
    return found


@functools.lru_cache(maxsize=1)
def all_mentions() -> dict[str, list[str]]:
    by_area: dict[str, list[str]] = {a: [] for a in AREAS}
    for path in tracked():
        if path == "tests/test_docs.py":
            continue
        text = ""
        if path.endswith((".py", ".ts", ".js", ".md", ".sh", ".yaml", ".yml")):
            text = (REPO / path).read_text(encoding="utf-8", errors="replace")
        by_area[_area(path)].extend(mentions(path, text))
    return by_area


def test_the_finder_sees_every_form() -> None:
    n = "1" + "2"
    assert mentions("a.md", "as in Sess" + "ion " + n + " and sess" + "ions 25-28")
    assert mentions("a.md", "the fourth sess" + "ion's run")
    assert mentions("x.py", "x = 1  # measured in sess" + "ion-" + n + "\n")
    assert mentions("x.py", '"""Docstring, sess' + 'ion ' + n + '."""\n')
    assert mentions("x.py", "def test_sess" + "ion_" + n + "():\n    pass\n")
    assert mentions("a.ts", "let a = 1; // sess" + "ion " + n + "\n")
    assert mentions("docs/results/block-128-s" + n + ".json", "")
    assert mentions("docs/results/summary-s" + n + "b.md", "")
    assert not mentions("x.py", "s = 'sess" + "ion " + n + "'  # a KV session\n")
    assert not mentions("x.py", "# the first session takes the cache\n")
    assert not mentions("docs/results/2026-12-05-block-128-1.5b.json", "")


@pytest.mark.parametrize("area", AREAS)
def test_no_numbered_work_period(area: str) -> None:
    found = all_mentions()[area]
    assert not found, (f"{len(found)} mention(s) of a numbered work period; name the date and the commit "
                       "(CHANGELOG.md holds the history):\n" + "\n".join(found))


def slug(heading: str) -> str:
    """GitHub's anchor of a heading's text."""
    text = re.sub(r"`([^`]*)`", r"\1", heading)
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    found = set()
    fenced = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        m = None if fenced else HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        k = seen.get(base, 0)
        seen[base] = k + 1
        found.add(base if k == 0 else f"{base}-{k}")
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """The link targets of a Markdown file outside code (fenced blocks and `spans`)."""
    out = []
    fenced = False
    for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
            continue
        if fenced:
            continue
        for m in LINK.finditer(re.sub(r"`[^`]*`", "", line)):
            out.append((n, m.group(1).strip("<>")))
    return out


def broken_links(md: Path) -> list[str]:
    bad = []
    for n, target in links(md):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):
            continue                                   # http:, https:, mailto:
        file_part, _, anchor = target.partition("#")
        dest = (md.parent / file_part).resolve() if file_part else md
        where = f"{md.relative_to(REPO)}:{n}: {target}"
        if not dest.exists():
            bad.append(f"{where} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{where} (no such heading)")
    return bad


def markdown_pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def test_slugs_as_github_writes_them() -> None:
    assert slug("Exit codes") == "exit-codes"
    assert slug("`bench --quality`: what it measures") == "bench---quality-what-it-measures"
    assert slug("The 0.5B's own windows (768/256)") == "the-05bs-own-windows-768256"


def test_relative_links_lead_to_a_file_and_heading() -> None:
    bad = [b for md in markdown_pages() for b in broken_links(md)]
    assert not bad, f"{len(bad)} broken relative link(s):\n" + "\n".join(bad)


def test_every_result_file_is_in_the_index_and_linked_from_the_docs() -> None:
    """docs/results/ holds only what the docs cite: each file has a row in its index
    (date, commit, machine, command) and a link from README.md, CHANGELOG.md or a page."""
    folder = REPO / "docs" / "results"
    index = (folder / "README.md").read_text(encoding="utf-8")
    pages = "\n".join((REPO / p).read_text(encoding="utf-8") for p in tracked()
                      if p.endswith(".md") and not p.startswith("docs/results/"))
    files = [p.name for p in folder.iterdir() if p.name != "README.md"]
    assert files
    missing = [f for f in files if f"]({f})" not in index]
    uncited = [f for f in files if f"results/{f}" not in pages]
    assert not missing, f"not in docs/results/README.md: {missing}"
    assert not uncited, f"cited by no page (delete them; git keeps them): {uncited}"
