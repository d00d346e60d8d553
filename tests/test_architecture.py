"""The structure issue 20 asks for, checked from the source: the import graph
of soldaemon/ and lsp/ has no cycle, the Sol policy package imports no torch,
no source file is over 600 lines, and sol-lsp uses only the daemon's public
boundary (protocol, API types, errors, the daemon-finding module).

The graph is read with :mod:`ast`, not by importing: an import inside a
function counts (it runs the first time the function does), one under
``if TYPE_CHECKING:`` does not (it never runs). ``from pkg import name`` is an
edge to ``pkg.name`` when that is a module, else to ``pkg``.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

REPO = Path(__file__).resolve().parent.parent
ROOTS = ("soldaemon", "lsp")
MAX_LINES = 600
# what sol-lsp may import from the daemon's package
LSP_MAY_IMPORT = frozenset({
    "soldaemon", "soldaemon.api", "soldaemon.protocol", "soldaemon.errors", "soldaemon.paths", "soldaemon.discovery",
    "soldaemon.privacy", "soldaemon.privacy.rules", "soldaemon.privacy.scan", "soldaemon.shown",
})
# third-party packages that load torch when imported
TORCH = frozenset({"torch", "transformers", "accelerate"})


def _module_name(path: Path, base: Path = REPO) -> str:
    parts = list(path.relative_to(base).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _sources() -> dict[str, Path]:
    """Every module of soldaemon/ and lsp/ by its dotted name."""
    found: dict[str, Path] = {}
    for root in ROOTS:
        for path in sorted((REPO / root).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _all_sources() -> dict[str, Path]:
    """Every module of the project's Python: soldaemon/ and lsp/, the
    benchmarks' package (bench/soldaemon_bench/) and the scripts."""
    found = _sources()
    for path in sorted((REPO / "bench" / BENCH_PACKAGE).rglob("*.py")):
        found[_module_name(path, REPO / "bench")] = path
    for path in sorted((REPO / "scripts").glob("*.py")):
        found[_module_name(path)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST, type_checking: bool = False) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run, at any depth; the body of ``if
    TYPE_CHECKING:`` is left out (its ``else`` is kept) unless
    ``type_checking``."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _imports(name: str, is_package: bool, text: str, type_checking: bool = False) -> list[tuple[str, str | None]]:
    """What module ``name`` imports, as (absolute module, imported name or
    None): ``import a.b`` gives ("a.b", None), ``from .x import y`` in
    package ``p`` gives ("p.x", "y")."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in _import_nodes(ast.parse(text, name), type_checking):
        if isinstance(node, ast.Import):
            out.extend((alias.name, None) for alias in node.names)
            continue
        if node.level:
            base = package.split(".")
            base = base[: len(base) - (node.level - 1)]
            target = ".".join(base + ([node.module] if node.module else []))
        else:
            target = node.module or ""
        out.extend((target, alias.name) for alias in node.names)
    return out


def _edges(imports: list[tuple[str, str | None]], modules: set[str] | dict[str, Path]) -> tuple[set[str], set[str]]:
    """(modules of ours, top-level third-party packages) that ``imports``
    name: ``from pkg import x`` is an edge to ``pkg.x`` when that is a
    module, else to ``pkg``; ``import a.b.c`` to the longest of ``a.b.c``,
    ``a.b``, ``a`` that is one of ours."""
    ours: set[str] = set()
    theirs: set[str] = set()
    for target, alias in imports:
        if alias is not None and f"{target}.{alias}" in modules:
            ours.add(f"{target}.{alias}")
            continue
        parts = target.split(".")
        for k in range(len(parts), 0, -1):
            if ".".join(parts[:k]) in modules:
                ours.add(".".join(parts[:k]))
                break
        else:
            if parts[0] not in ROOTS:
                theirs.add(parts[0])
    return ours, theirs


def _graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(edges to our modules, third-party top-level packages) per module.
    An import of ``pkg.x`` is an edge to that module alone, not to ``pkg``
    as well, so a package's ``__init__`` that re-exports its modules makes
    no cycle with them."""
    sources = _sources()
    internal: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in sources.items():
        found = _imports(name, path.name == "__init__.py", path.read_text(encoding="utf-8"))
        ours, theirs = _edges(found, sources)
        ours.discard(name)
        internal[name], external[name] = ours, theirs
    return internal, external


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle (as a path that returns to its start) per strongly
    connected component with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[set[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component: set[str] = set()
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.add(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(component)

    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 10 * len(graph) + 100))
    try:
        for v in sorted(graph):
            if v not in index:
                visit(v)
    finally:
        sys.setrecursionlimit(limit)
    return [_one_cycle(graph, component) for component in components]


def _one_cycle(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module (breadth first)."""
    start = min(component)
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt: list[str] = []
        for v in frontier:
            for w in sorted(graph[v] & component):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    return sorted(component)


def _reach(graph: dict[str, set[str]], start: str) -> dict[str, str | None]:
    """Every module importing ``start`` runs, with the module that imported
    it (None for ``start``). Importing a module runs its parent packages'
    ``__init__`` too."""
    seen: dict[str, str | None] = {start: None}
    todo = [start]
    while todo:
        v = todo.pop()
        parents = [".".join(v.split(".")[:k]) for k in range(1, v.count(".") + 1)]
        for w in [*sorted(graph.get(v, ())), *parents]:
            if w in graph and w not in seen:
                seen[w] = v
                todo.append(w)
    return seen


def test_no_import_cycle() -> None:
    graph, _ = _graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles (each: a -> b -> ... -> a):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles)


def test_policy_imports_no_torch() -> None:
    """soldaemon/policy/ (the Sol decisions) runs without torch: no module it
    imports, directly or through other modules of the daemon, imports torch
    or a package that loads it."""
    graph, external = _graph()
    policy = sorted(name for name in graph if name == "soldaemon.policy" or name.startswith("soldaemon.policy."))
    if not policy:
        pytest.skip("soldaemon/policy/ does not exist yet (issue 20 item 2 creates it); nothing to check")
    found: list[str] = []
    for name in policy:
        via = _reach(graph, name)
        for module in sorted(via):
            hit = sorted(external[module] & TORCH)
            if hit:
                chain = [module]
                while (up := via[chain[-1]]) is not None:
                    chain.append(up)
                found.append(f"{' -> '.join(reversed(chain))} imports {', '.join(hit)}")
    assert not found, "soldaemon/policy/ reaches torch:\n" + "\n".join(sorted(set(found)))


def test_policy_imports_no_torch_when_run() -> None:
    """The same, the way Python sees it: importing every policy module in a
    fresh interpreter leaves torch out of ``sys.modules``."""
    policy = sorted(name for name in _sources() if name == "soldaemon.policy" or name.startswith("soldaemon.policy."))
    if not policy:
        pytest.skip("soldaemon/policy/ does not exist yet (issue 20 item 2 creates it); nothing to check")
    code = ("import importlib, sys\n"
            f"for name in {policy!r}:\n"
            "    importlib.import_module(name)\n"
            f"print(sorted(m for m in {sorted(TORCH)!r} if m in sys.modules))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", f"importing soldaemon.policy loaded {done.stdout.strip()}"


def test_no_source_file_over_600_lines() -> None:
    too_long: list[str] = []
    for root in ("soldaemon", "lsp", "scripts", "bench"):
        for path in sorted((REPO / root).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                too_long.append(f"{path.relative_to(REPO)}: {n} lines")
    assert not too_long, f"source files over {MAX_LINES} lines:\n" + "\n".join(too_long)


def test_lsp_imports_only_the_daemon_boundary() -> None:
    """sol-lsp talks to the daemon over the wire: from soldaemon it imports
    the protocol, the API types, the errors, the daemon-finding module, the
    sensitive-file rules and the rules of what is shown between answers
    (type-through, early lines), nothing that pulls in the server or torch."""
    graph, _ = _graph()
    bad = [f"{name} imports {target}"
           for name in sorted(graph) if name.split(".")[0] == "lsp"
           for target in sorted(graph[name])
           if target.split(".")[0] == "soldaemon" and target not in LSP_MAY_IMPORT]
    assert not bad, (f"lsp/ may import from soldaemon only {', '.join(sorted(LSP_MAY_IMPORT))}:\n"
                     + "\n".join(bad))


def test_the_graph_sees_what_it_must() -> None:
    """The reader itself, on a made-up module: relative imports, ``from pkg
    import module``, an import inside a function, one under TYPE_CHECKING;
    and the cycle finder. A broken reader cannot make the tests above pass."""
    text = (
        "from __future__ import annotations\n"
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "from . import sib\n"
        "from ..top import thing\n"
        "from pkg import helper_function\n"
        "if TYPE_CHECKING:\n"
        "    import torch\n"
        "    from pkg.hidden import X\n"
        "def late():\n"
        "    from pkg.deep.leaf import y\n"
        "    import transformers.models\n"
    )
    modules = {"pkg", "pkg.sub", "pkg.sub.mod", "pkg.sub.sib", "pkg.top", "pkg.hidden", "pkg.deep",
               "pkg.deep.leaf"}
    ours, theirs = _edges(_imports("pkg.sub.mod", False, text), modules)
    assert ours == {"pkg.sub.sib", "pkg.top", "pkg", "pkg.deep.leaf"}
    assert _edges(_imports("pkg.sub.mod", False, text, type_checking=True), modules)[0] == ours | {"pkg.hidden"}
    assert theirs == {"os", "typing", "__future__", "transformers"}
    assert _edges(_imports("pkg.sub", True, "from .mod import f\n"), modules)[0] == {"pkg.sub.mod"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _reach({"p": set(), "p.a": {"q"}, "q": set()}, "p.a") == {"p.a": None, "q": "p.a", "p": "p.a"}
    graph, _ = _graph()
    assert "soldaemon.fim.templates" in graph["soldaemon.fim.prompt"]   # the real tree is read


# --- issue 29: the floor plan -------------------------------------------------

MAX_TOP_LEVEL = 8
# the modules docs/architecture.md names as sol-lsp's whole view of the daemon
# (read from the page itself, so the page and the rule cannot drift apart)
BOUNDARY_MARK = "sol-lsp's boundary:"
# attributes with a leading underscore that are public by their owner's own
# documentation: namedtuple's API (the underscore only avoids field clashes)
PUBLIC_UNDERSCORE = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults"})
# third-party modules whose underscore names are the only way to an operation:
# torch's packed int8/int4 CPU matmuls and its fused-attention choice have no
# public name (see soldaemon/runtime/forward/kernels.py)
THIRD_PARTY_PRIVATE_OK = frozenset({"torch"})
# the benchmarks' package (bench/: a distribution of its own, not in the daemon's wheel)
BENCH_PACKAGE = "soldaemon_bench"


def _graph_with_type_checking() -> dict[str, set[str]]:
    """The import graph with the ``if TYPE_CHECKING:`` imports counted too: an
    annotation that names a type is still a dependency of the design."""
    sources = _sources()
    internal: dict[str, set[str]] = {}
    for name, path in sources.items():
        found = _imports(name, path.name == "__init__.py", path.read_text(encoding="utf-8"), type_checking=True)
        ours, _ = _edges(found, sources)
        ours.discard(name)
        internal[name] = ours
    return internal


def test_no_import_cycle_even_through_type_checking() -> None:
    cycles = _cycles(_graph_with_type_checking())
    assert not cycles, "import cycles counting TYPE_CHECKING imports (each: a -> b -> ... -> a):\n" + "\n".join(
        " -> ".join(cycle) for cycle in cycles)


def _private_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """``x._name`` where ``x`` is not ``self``, ``cls`` or ``super()``, and the
    name is not a dunder nor public by its owner's documentation."""
    third_party = {alias.asname or alias.name.split(".")[0]
                   for node in ast.walk(tree) if isinstance(node, ast.Import)
                   for alias in node.names if alias.name.split(".")[0] in THIRD_PARTY_PRIVATE_OK}
    out: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
            continue
        if node.attr.startswith("__") and node.attr.endswith("__") or node.attr in PUBLIC_UNDERSCORE:
            continue
        owner = node.value
        while isinstance(owner, ast.Attribute):
            owner = owner.value
        if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
            continue
        if isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name) and node.value.func.id == "super":
            continue
        if isinstance(owner, ast.Name) and owner.id in third_party:
            continue
        out.append((node.lineno, ast.unparse(node)))
    return out


def test_nothing_reads_another_objects_private_attributes() -> None:
    """One owner per piece of state: outside tests, an underscore attribute is
    read only through ``self``/``cls`` (issue 29), in the scripts and the
    benchmarks too (issue 55)."""
    found = [f"{path.relative_to(REPO)}:{line}: {text}"
             for path in _all_sources().values()
             for line, text in _private_reads(ast.parse(path.read_text(encoding="utf-8")))]
    assert not found, "another object's private attribute read:\n" + "\n".join(found)


def test_the_top_level_holds_only_the_packages_face() -> None:
    modules = sorted(p.name for p in (REPO / "soldaemon").glob("*.py"))
    assert len(modules) <= MAX_TOP_LEVEL, (
        f"{len(modules)} modules at the top of soldaemon/ (at most {MAX_TOP_LEVEL}; the rest belong in a "
        f"package by role): {', '.join(modules)}")


def test_runtime_is_split_by_role() -> None:
    loose = sorted(p.name for p in (REPO / "soldaemon" / "runtime").glob("*.py") if p.name != "__init__.py")
    assert not loose, "runtime/ has loose modules beside its role packages: " + ", ".join(loose)


def _doc_boundary() -> set[str]:
    text = (REPO / "docs" / "architecture.md").read_text(encoding="utf-8")
    at = text.find(BOUNDARY_MARK)
    assert at >= 0, f"docs/architecture.md has no line starting {BOUNDARY_MARK!r}"
    paragraph = text[at:].split("\n\n", 1)[0]
    import re
    return set(re.findall(r"`(soldaemon(?:\.[a-z_]+)*)`", paragraph))


def test_lsp_reaches_only_the_modules_the_doc_names() -> None:
    """Every daemon module that importing any of lsp/ runs (directly or
    through another daemon module) is one the architecture page names."""
    named = _doc_boundary()
    graph, _ = _graph()
    reached: dict[str, str] = {}
    for name in sorted(graph):
        if name.split(".")[0] != "lsp":
            continue
        for module, via in _reach(graph, name).items():
            if module.split(".")[0] == "soldaemon" and module not in named:
                reached.setdefault(module, f"{via} (from {name})")
    assert not reached, ("sol-lsp runs daemon modules the architecture page does not name "
                         f"(it names {', '.join(sorted(named))}):\n"
                         + "\n".join(f"{m} <- {v}" for m, v in sorted(reached.items())))


def test_lsp_loads_no_config_reader_when_run() -> None:
    """The same for real: importing sol-lsp's server loads no YAML reader, no
    torch and only daemon modules the page names."""
    code = ("import sys, lsp.server\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('soldaemon', 'yaml', 'torch')))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout.strip().splitlines()[-1]))
    assert loaded <= _doc_boundary(), f"sol-lsp loaded {sorted(loaded - _doc_boundary())}"


def test_measurement_stays_out_of_the_products_import_path() -> None:
    """The benchmarks (bench/soldaemon_bench/) are imported by nothing of the
    product but the CLI, and there only inside the command that runs them."""
    sources = _sources()
    bad: list[str] = []
    for name, path in sources.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top_level = {id(n) for n in tree.body}
        for node in _import_nodes(tree):
            targets = [node.module or ""] if isinstance(node, ast.ImportFrom) else [a.name for a in node.names]
            if isinstance(node, ast.ImportFrom) and node.level:
                continue   # relative imports stay inside their package
            if not any(t.split(".")[0] == BENCH_PACKAGE for t in targets):
                continue
            if name != "soldaemon.cli" or id(node) in top_level:
                bad.append(f"{name}:{node.lineno} imports {', '.join(targets)}")
    assert not bad, "the product imports measurement code:\n" + "\n".join(bad)


def test_the_products_wheel_holds_no_measurement_code() -> None:
    """The daemon's wheel packs soldaemon/ and lsp/ only: no measurement
    package inside them, and the package patterns of pyproject.toml do not
    reach the benchmarks' own distribution (bench/pyproject.toml)."""
    import fnmatch
    import tomllib

    found = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]
    assert not [p for p in found["include"] if fnmatch.fnmatch(BENCH_PACKAGE, p)], found["include"]
    assert not (REPO / "soldaemon" / "measure").exists()
    bench = tomllib.loads((REPO / "bench" / "pyproject.toml").read_text())
    assert bench["project"]["name"] == "soldaemon-bench"
    assert bench["tool"]["setuptools"]["packages"]["find"]["include"] == [f"{BENCH_PACKAGE}*"]


def test_no_module_is_only_a_re_export() -> None:
    """A module that only re-exports another's names is a shim left by a move;
    and no package's ``__init__`` passes on a private name."""
    bad: list[str] = []
    for name, path in _sources().items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        body = [n for n in tree.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))]
        imports = [n for n in body if isinstance(n, (ast.Import, ast.ImportFrom))]
        rest = [n for n in body if n not in imports and not (
            isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets))]
        if path.name != "__init__.py" and imports and not rest:
            bad.append(f"{name}: only re-exports")
        if path.name == "__init__.py":
            bad.extend(f"{name}: re-exports private {alias.name}" for n in imports if isinstance(n, ast.ImportFrom)
                       for alias in n.names if alias.name.startswith("_") and not alias.name.startswith("__"))
    assert not bad, "\n".join(bad)


def test_the_private_reads_check_sees_what_it_must() -> None:
    text = ("import torch\n"
            "class A:\n"
            "    def f(self, other):\n"
            "        self._a; cls._b; super()._c; other.__dict__; torch._int_mm; row._asdict()\n"
            "        return other._lock, self.engine._parked\n")
    assert [t for _, t in _private_reads(ast.parse(text))] == ["other._lock", "self.engine._parked"]


# --- issue 55: rooms ------------------------------------------------------------

OUR_TOPS = frozenset({*ROOTS, BENCH_PACKAGE, "scripts"})


def _private_imports(name: str, path: Path) -> list[str]:
    """``from x import _y`` where ``x`` is another of our modules (any depth,
    ``if TYPE_CHECKING:`` included)."""
    found = _imports(name, path.name == "__init__.py", path.read_text(encoding="utf-8"), type_checking=True)
    return [f"{path.relative_to(REPO)}: from {target} import {alias}" for target, alias in found
            if alias is not None and alias.startswith("_") and not alias.startswith("__")
            and target.split(".")[0] in OUR_TOPS and target != name]


def test_no_module_imports_another_modules_private_name() -> None:
    """A leading underscore says "this module's own": a name another module
    needs is part of its owner's interface and is named so. Over soldaemon/,
    lsp/, the benchmarks and the scripts; tests may reach in."""
    found = [hit for name, path in _all_sources().items() for hit in _private_imports(name, path)]
    assert not found, "private names imported from another module:\n" + "\n".join(found)


def test_the_rules_see_the_scripts_and_the_benchmarks() -> None:
    """The scripts and the benchmarks are read by the rules above (a rule
    that skipped them would pass on anything)."""
    names = set(_all_sources())
    assert "scripts.request_walk" in names and f"{BENCH_PACKAGE}.bench" in names
    assert f"{BENCH_PACKAGE}.quality.command" in names
    text = "from soldaemon.fim.windows import _split_lines, WindowMemo\nfrom .sib import _x\nfrom os import _exit\n"
    found = _imports("soldaemon.fim.prompt", False, text, type_checking=True)
    assert {(t, a) for t, a in found if a and a.startswith("_") and t.split(".")[0] in OUR_TOPS} == {
        ("soldaemon.fim.windows", "_split_lines"), ("soldaemon.fim.sib", "_x")}


# --- issue 55: one way through ------------------------------------------------

# the runtime's mechanism: it takes decisions in as plain callables and data
MECHANISM = ("soldaemon.runtime.forward", "soldaemon.runtime.kv", "soldaemon.runtime.decode",
             "soldaemon.runtime.memory")


def test_the_runtime_mechanism_imports_no_pipeline() -> None:
    """The forward, the KV cache, the decode loop and the memory tiers import
    nothing from soldaemon.pipeline (annotations included): where an answer
    ends reaches the decode loop as a plain callable. The engine
    (runtime/engine/), which composes them with the pipeline, may."""
    graph = _graph_with_type_checking()
    bad = [f"{name} imports {target}"
           for name in sorted(graph) if name.startswith(MECHANISM)
           for target in sorted(graph[name])
           if target == "soldaemon.pipeline" or target.startswith("soldaemon.pipeline.")]
    assert not bad, "the runtime's mechanism imports the pipeline:\n" + "\n".join(bad)
