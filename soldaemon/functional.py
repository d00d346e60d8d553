"""Holes whose answer can be executed: pass@1 beside exact match.

Exact match says a completion is the text that was there; it does not say
whether a different completion would also be right. A *functional* hole is
cut from a pure-Python module of the standard library that CPython's own test
suite covers (``test.test_<module>``, installed with Python): the hole is
filled, the filled module shadows the standard one, and the module's tests
run. The completion passes when they all pass.

A hole only counts when it matters: the original must pass, and the same
place with its statement replaced by ``pass`` must fail (otherwise the tests
never run that line, and any completion would "pass"). Finding such holes runs
the test modules a few hundred times, so the result is cached per Python
version (``cache_dir()/functional-holes-<version>.json``).

Running a completion means running model output: each run is a separate
``python -I`` process in a fresh temporary directory, with a timeout and an
environment that holds only ``PATH`` and ``HOME``. It is a benchmark, never
part of serving a completion.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from .holes import Hole, cut_holes

# Single-file modules of the standard library with a fast test module, none
# of them imported when the interpreter starts (a module already imported
# could not be shadowed). Each test module runs in well under 3 s here.
MODULES = ("textwrap", "shlex", "difflib", "fractions", "statistics", "colorsys", "calendar", "graphlib",
           "base64", "quopri", "pprint", "glob", "getopt", "netrc", "configparser", "dataclasses", "gettext",
           "optparse", "plistlib", "cmd", "sched", "filecmp", "mimetypes", "string", "csv", "argparse",
           "heapq", "bisect")
TIMEOUT_S = 60.0          # one test-module run; a hang counts as a failure
FORMAT = 1                # of the cached hole list
SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr, ast.Raise)


@dataclass(frozen=True)
class FunctionalHole:
    module: str        # the standard-library module it was cut from
    hole: Hole

    @property
    def test_module(self) -> str:
        return f"test.test_{self.module}"


def module_path(module: str) -> Path:
    return Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"


def available_modules(modules: Iterable[str] = MODULES) -> list[str]:
    """The modules of ``modules`` whose source and test module exist here."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    return [m for m in modules if (stdlib / f"{m}.py").exists() and (stdlib / "test" / f"test_{m}.py").exists()]


def run_tests(module: str, source: str, *, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether CPython's tests of ``module`` pass with ``source`` in its place."""
    with tempfile.TemporaryDirectory(prefix="sol-functional-") as tmp:
        Path(tmp, f"{module}.py").write_text(source, encoding="utf-8")
        code = (f"import sys; sys.path.insert(0, {tmp!r}); import {module}, unittest; "
                f"assert {module}.__file__.startswith({tmp!r}), {module}.__file__; "
                f"unittest.main(module='test.test_{module}', argv=['functional', '-q'])")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": tmp}
        try:
            done = subprocess.run([sys.executable, "-I", "-c", code], cwd=tmp, env=env, capture_output=True,
                                  timeout=timeout_s, check=False)
        except subprocess.TimeoutExpired:
            return False
        return done.returncode == 0


def filled(hole: Hole, completion: str) -> str:
    return hole.prefix + completion + hole.suffix


def passes(fh: FunctionalHole, completion: str, *, timeout_s: float = TIMEOUT_S) -> bool:
    """pass@1 of one completion: it parses and the module's tests pass."""
    source = filled(fh.hole, completion)
    try:
        ast.parse(source)
    except SyntaxError:
        return False
    return run_tests(fh.module, source, timeout_s=timeout_s)


def _knocked_out(hole: Hole) -> str | None:
    """The module with the hole's statements replaced by ``pass`` at their
    indentation, or None when that does not parse (e.g. a line hole on the
    header of a compound statement: only simple statements are knocked out)."""
    lines = hole.prefix.splitlines(keepends=True)
    head = lines[-1] if lines and not hole.prefix.endswith("\n") else ""
    start = hole.prefix[: len(hole.prefix) - len(head)]
    indent = head[: len(head) - len(head.lstrip(" \t"))]
    source = start + indent + "pass" + hole.suffix
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    if hole.kind == "line":
        original = ast.parse(hole.prefix + hole.expected + hole.suffix)
        if not any(isinstance(n, SIMPLE) and n.lineno == n.end_lineno == hole.line for n in ast.walk(original)):
            return None
    del tree
    return source


def _stamp(modules: list[str]) -> str:
    h = hashlib.sha256(sys.version.encode())
    for m in modules:
        h.update(m.encode())
        h.update(module_path(m).read_bytes())
    return h.hexdigest()[:16]


def find_holes(n: int, seed: int = 0, *, modules: Iterable[str] = MODULES, per_module: int = 4,
               say: Callable[[str], None] = lambda _m: None) -> list[FunctionalHole]:
    """Up to ``n`` functional holes, line and block kinds in turn, at most
    ``per_module`` from one module, each checked to matter (see the module
    docstring). Seeded and reproducible."""
    found: list[FunctionalHole] = []
    for module in available_modules(modules):
        if len(found) >= n:
            break
        path = module_path(module)
        if not run_tests(module, path.read_text(encoding="utf-8")):
            say(f"functional: {module}'s own tests fail here; skipped")
            continue
        kept = 0
        for hole in cut_holes([path], per_module * 6, seed=seed):
            knocked = _knocked_out(hole)
            if knocked is None or run_tests(module, knocked):
                continue      # the tests never notice this place: it cannot tell right from wrong
            found.append(FunctionalHole(module, hole))
            kept += 1
            if kept >= per_module or len(found) >= n:
                break
        say(f"functional: {module}: {kept} holes")
    return found


def cached_holes(n: int, seed: int, cache: Path, *, modules: Iterable[str] = MODULES,
                 say: Callable[[str], None] = lambda _m: None) -> list[FunctionalHole]:
    """:func:`find_holes`, cached in ``cache`` (a JSON file) for this Python
    and these module sources."""
    mods = available_modules(modules)
    stamp = _stamp(mods)
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT and data.get("stamp") == stamp and data.get("seed") == seed \
                and len(data["holes"]) >= n:
            return [FunctionalHole(h["module"], Hole(**h["hole"])) for h in data["holes"][:n]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    holes = find_holes(n, seed, modules=mods, say=say)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"format": FORMAT, "stamp": stamp, "seed": seed, "python": sys.version,
                                 "holes": [{"module": h.module, "hole": asdict(h.hole)} for h in holes]}),
                     encoding="utf-8")
    return holes
