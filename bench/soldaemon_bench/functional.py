"""Holes whose answer can be executed: pass@1 beside exact match.

Exact match says a completion is the text that was there; it does not say
whether a different completion would also be right. A *functional* hole is
cut from a pure-Python module that its own project's tests cover: a module of
the standard library with CPython's tests (``test.test_<module>``, installed
with Python), or a module of a tested project from PyPI whose source
distribution ships its tests (:data:`PROJECTS`: fetched once with
``pip download`` into the cache, never imported by the daemon). The hole is
filled, the filled module shadows the original, and the module's tests run.
The completion passes when they all pass.

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
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable

from soldaemon import paths
from soldaemon_bench.holes import Hole, cut_holes

# Single-file modules of the standard library with a fast test module, none
# of them imported when the interpreter starts (a module already imported
# could not be shadowed). Each test module runs in well under 3 s here.
MODULES = ("textwrap", "shlex", "difflib", "fractions", "statistics", "colorsys", "calendar", "graphlib",
           "base64", "quopri", "pprint", "glob", "getopt", "netrc", "configparser", "dataclasses", "gettext",
           "optparse", "plistlib", "cmd", "sched", "filecmp", "mimetypes", "string", "csv", "argparse",
           "heapq", "bisect")


@dataclass(frozen=True)
class Project:
    """A module of a tested project from PyPI: its source distribution holds
    the package and its tests; ``tests`` is the unittest module that covers
    ``file``."""
    dist: str          # the distribution's name on PyPI
    version: str       # pinned: the holes are cached per module source
    top: str           # the folder name inside the sdist (dist-version)
    package: str       # the importable package, copied beside the tests
    file: str          # the module's path inside the sdist
    tests: str         # the unittest module that judges it (a dotted name inside the sdist)
    sha256: str        # the sdist's, checked by pip (--require-hashes) and again before unpacking


MORE_ITERTOOLS_SHA256 = "f638ddf8a1a0d134181275fb5d58b086ead7c6a72429ad725c67503f13ba30bd"   # the 10.8.0 sdist
# Tested projects nobody here wrote, whose tests run with the standard library
# alone (unittest) in a few seconds. Keyed by the name a hole's ``module`` holds.
PROJECTS = {
    "more_itertools.more": Project("more-itertools", "10.8.0", "more_itertools-10.8.0", "more_itertools",
                                   "more_itertools/more.py", "tests.test_more", MORE_ITERTOOLS_SHA256),
    "more_itertools.recipes": Project("more-itertools", "10.8.0", "more_itertools-10.8.0", "more_itertools",
                                      "more_itertools/recipes.py", "tests.test_recipes", MORE_ITERTOOLS_SHA256),
}
# The default: the project's modules first (they would otherwise come after
# the standard library's holes fill the count), then the standard library.
ALL_MODULES = tuple(PROJECTS) + MODULES
PER_PROJECT_MODULE = 12   # a project module is long (more.py: ~5,000 lines)
TIMEOUT_S = 60.0          # one test-module run; a hang counts as a failure
FORMAT = 1                # of the cached hole list
SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Return, ast.Expr, ast.Raise)


@dataclass(frozen=True)
class FunctionalHole:
    module: str        # the standard-library module it was cut from
    hole: Hole

    @property
    def test_module(self) -> str:
        project = PROJECTS.get(self.module)
        return project.tests if project else f"test.test_{self.module}"


def project_root(project: Project, *, fetch: bool = True) -> Path | None:
    """The unpacked source distribution of ``project`` in the cache, fetched
    with ``pip download`` (no build, nothing installed or imported) the first
    time; None when it cannot be had."""
    root = paths.cache_dir() / "functional" / project.top
    if (root / project.file).is_file():
        return root
    if not fetch:
        return None
    root.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sol-sdist-", dir=root.parent) as tmp:
        pinned = Path(tmp, "pinned.txt")
        pinned.write_text(f"{project.dist}=={project.version} --hash=sha256:{project.sha256}\n")
        done = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                               "--require-hashes", "-q", "-d", tmp, "-r", str(pinned)],
                              capture_output=True, text=True, timeout=300, check=False)
        archives = sorted(Path(tmp).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            return None
        if hashlib.sha256(archives[0].read_bytes()).hexdigest() != project.sha256:
            raise FileNotFoundError(f"functional: {archives[0].name} is not the pinned {project.dist}=={project.version} "
                                    f"(sha256 {project.sha256}); refused")
        with tarfile.open(archives[0]) as tar:
            tar.extractall(tmp, filter="data")
        unpacked = Path(tmp, project.top)
        if not (unpacked / project.file).is_file():
            return None
        try:
            os.replace(unpacked, root)
        except OSError:       # another process unpacked it first
            if not (root / project.file).is_file():
                raise
    return root


def module_path(module: str) -> Path:
    project = PROJECTS.get(module)
    if project is not None:
        root = project_root(project)
        if root is None:
            raise FileNotFoundError(f"functional: the source of {project.dist}=={project.version} "
                                    f"could not be fetched")
        return root / project.file
    return Path(sysconfig.get_paths()["stdlib"]) / f"{module}.py"


def available_modules(modules: Iterable[str] = ALL_MODULES) -> list[str]:
    """The modules of ``modules`` whose source and test module exist here
    (a project's source is fetched once when it is missing)."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for m in modules:
        project = PROJECTS.get(m)
        if project is not None:
            root = project_root(project)
            if root is not None and (root / (project.tests.replace(".", "/") + ".py")).is_file():
                out.append(m)
        elif (stdlib / f"{m}.py").exists() and (stdlib / "test" / f"test_{m}.py").exists():
            out.append(m)
    return out


def run_tests(module: str, source: str, *, timeout_s: float = TIMEOUT_S) -> bool:
    """Whether the tests of ``module`` (CPython's, or its project's) pass with
    ``source`` in its place."""
    project = PROJECTS.get(module)
    with tempfile.TemporaryDirectory(prefix="sol-functional-") as tmp:
        if project is not None:
            root = module_path(module).parents[len(Path(project.file).parts) - 1]
            shutil.copytree(root / project.package, Path(tmp, project.package))
            tests_top = project.tests.split(".")[0]
            shutil.copytree(root / tests_top, Path(tmp, tests_top))
            Path(tmp, project.file).write_text(source, encoding="utf-8")
            test_module = project.tests
        else:
            Path(tmp, f"{module}.py").write_text(source, encoding="utf-8")
            test_module = f"test.test_{module}"
        # the tests die with this process (Linux: PR_SET_PDEATHSIG): a
        # completion that loops forever must not outlive a stopped bench and
        # take a core from every later measurement (seen: 40 minutes)
        # (after the module is imported: ctypes imports a dozen standard
        # modules, and the one under test must come from the copy)
        code = (f"import sys; sys.path.insert(0, {tmp!r}); import {module}, unittest; "
                f"assert {module}.__file__.startswith({tmp!r}), {module}.__file__\n"
                f"try:\n    import ctypes; ctypes.CDLL(None).prctl(1, 9)\nexcept Exception:\n    pass\n"
                f"import os\nif os.getppid() != {os.getpid()}: sys.exit(3)\n"
                f"unittest.main(module={test_module!r}, argv=['functional', '-q'])")
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


def find_holes(n: int, seed: int = 0, *, modules: Iterable[str] = ALL_MODULES, per_module: int = 4,
               kinds: tuple[str, ...] = ("line", "block"),
               say: Callable[[str], None] = lambda _m: None) -> list[FunctionalHole]:
    """Up to ``n`` functional holes of ``kinds`` in turn, at most
    ``per_module`` from one standard-library module (``PER_PROJECT_MODULE``
    from a project's), each checked to matter (see the module docstring).
    Seeded and reproducible."""
    found: list[FunctionalHole] = []
    for module in available_modules(modules):
        if len(found) >= n:
            break
        path = module_path(module)
        if not run_tests(module, path.read_text(encoding="utf-8")):
            say(f"functional: {module}'s own tests fail here; skipped")
            continue
        kept = 0
        limit = PER_PROJECT_MODULE if module in PROJECTS else per_module
        for hole in cut_holes([path], limit * 6, seed=seed, kinds=kinds):
            knocked = _knocked_out(hole)
            if knocked is None or run_tests(module, knocked):
                continue      # the tests never notice this place: it cannot tell right from wrong
            found.append(FunctionalHole(module, hole))
            kept += 1
            if kept >= limit or len(found) >= n:
                break
        say(f"functional: {module}: {kept} holes")
    return found


def holes_cache_path(kinds: tuple[str, ...] = ("line", "block")) -> Path:
    """Where :func:`cached_holes` keeps the holes of these kinds for this
    Python (one file per Python version and kinds: ``bench --quality`` and
    the scripts share it)."""
    return paths.cache_dir() / f"functional-holes-py{sys.version_info[0]}{sys.version_info[1]}-{'+'.join(kinds)}.json"


def cached_holes(n: int, seed: int, cache: Path, *, modules: Iterable[str] = ALL_MODULES,
                 kinds: tuple[str, ...] = ("line", "block"),
                 say: Callable[[str], None] = lambda _m: None) -> list[FunctionalHole]:
    """:func:`find_holes`, cached in ``cache`` (a JSON file) for this Python,
    these module sources and these kinds."""
    mods = available_modules(modules)
    stamp = _stamp(mods) + "-" + "+".join(kinds)
    try:
        data = json.loads(cache.read_text(encoding="utf-8"))
        if data.get("format") == FORMAT and data.get("stamp") == stamp and data.get("seed") == seed \
                and len(data["holes"]) >= n:
            return [FunctionalHole(h["module"], Hole(**h["hole"])) for h in data["holes"][:n]]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    holes = find_holes(n, seed, modules=mods, kinds=kinds, say=say)
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps({"format": FORMAT, "stamp": stamp, "seed": seed, "python": sys.version,
                                 "holes": [{"module": h.module, "hole": asdict(h.hole)} for h in holes]}),
                     encoding="utf-8")
    return holes
