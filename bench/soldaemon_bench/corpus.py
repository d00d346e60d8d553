"""Where ``--corpus`` takes its source files from: paths, or ``npm:SPEC``,
an npm package's hand-written JavaScript.

``npm:commander@12.1.0`` is fetched once with ``npm pack`` (the registry;
a local folder or tarball works offline) into
``cache_dir()/bench-corpus`` and unpacked there (tarfile's ``data``
filter: no links out, no absolute paths). Its ``.js``/``.mjs``/``.cjs``
files are the corpus, minus tests, builds, dependencies and minified
files. No shell: ``npm`` gets the spec as one argument.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from soldaemon.errors import BadRequest
from soldaemon.paths import cache_dir
from soldaemon_bench.holes import LANGUAGES, default_corpus

NPM = "npm:"
JS_SUFFIXES = tuple(s for s, language in LANGUAGES.items() if language == "javascript")
SKIPPED_DIRS = frozenset({"node_modules", "test", "tests", "__tests__", "dist", "build", "coverage", "typings"})
MINIFIED_LINE = 500   # a line this long: generated, not hand-written


def resolve_corpus(items: list[str] | None) -> list[Path]:
    """The files ``--corpus`` names (default: the standard library's modules)."""
    if not items:
        return default_corpus()
    files: list[Path] = []
    for item in items:
        if item.startswith(NPM):
            files.extend(npm_package_files(item[len(NPM):]))
            continue
        path = Path(item)
        if not path.is_file():
            raise BadRequest(f"--corpus: {item} is not a file (an npm package is npm:NAME@VERSION)")
        if path.suffix not in LANGUAGES:
            raise BadRequest(f"--corpus: {item} is neither Python nor JavaScript ({', '.join(LANGUAGES)})")
        files.append(path)
    return files


def npm_package_files(spec: str, root: Path | None = None) -> list[Path]:
    """The hand-written JavaScript of npm package ``spec`` (see the module
    doc), fetched into ``root`` (default ``cache_dir()/bench-corpus``) once."""
    if not spec or spec.startswith("-"):
        raise BadRequest(f"--corpus npm:{spec}: name a package, e.g. npm:commander@12.1.0")
    if Path(spec).exists():                 # a local folder or tarball: npm runs elsewhere
        spec = str(Path(spec).resolve())
    folder = (root or cache_dir() / "bench-corpus") / re.sub(r"[^A-Za-z0-9@-]+", "_", spec).strip("_")
    if not (folder / ".complete").exists():
        _fetch(spec, folder)
    package = folder / "package"
    files = sorted(p for p in package.rglob("*")
                   if p.suffix in JS_SUFFIXES and p.is_file()
                   and not SKIPPED_DIRS.intersection(p.relative_to(package).parts)
                   and not p.name.endswith(".min.js") and not _minified(p))
    if not files:
        raise BadRequest(f"--corpus npm:{spec}: the package has no hand-written JavaScript")
    return files


def _fetch(spec: str, folder: Path) -> None:
    npm = shutil.which("npm")
    if npm is None:
        raise BadRequest(f"--corpus npm:{spec}: npm is not on PATH (Node.js ships it)")
    with tempfile.TemporaryDirectory() as tmp:
        try:
            r = subprocess.run([npm, "pack", spec, "--pack-destination", tmp, "--silent"], capture_output=True,
                               text=True, timeout=300, cwd=tmp)
        except subprocess.TimeoutExpired:
            raise BadRequest(f"--corpus npm:{spec}: npm pack took over 300 s") from None
        tarballs = list(Path(tmp).glob("*.tgz"))
        if r.returncode != 0 or len(tarballs) != 1:
            raise BadRequest(f"--corpus npm:{spec}: npm pack failed: {(r.stderr or r.stdout).strip()[-400:]}")
        if not hasattr(tarfile, "data_filter"):
            raise BadRequest("--corpus npm:…: unpacking safely needs Python 3.10.12, 3.11.4 or later")
        if folder.exists():
            shutil.rmtree(folder)
        try:
            with tarfile.open(tarballs[0]) as tar:
                tar.extractall(folder, filter="data")
        except tarfile.TarError as exc:
            raise BadRequest(f"--corpus npm:{spec}: the package does not unpack safely: {exc}") from None
    (folder / ".complete").write_text(spec + "\n")


def _minified(path: Path) -> bool:
    with path.open(encoding="utf-8", errors="replace") as f:
        return any(len(line) > MINIFIED_LINE for _, line in zip(range(50), f))
