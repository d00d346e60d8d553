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
    "soldaemon", "soldaemon.api", "soldaemon.protocol", "soldaemon.errors", "soldaemon.discovery",
    "soldaemon.sensitive",
})
# third-party packages that load torch when imported
TORCH = frozenset({"torch", "transformers", "accelerate"})


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
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


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run, at any depth; the body of ``if
    TYPE_CHECKING:`` is left out (its ``else`` is kept)."""
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        elif isinstance(node, ast.If) and _is_type_checking(node.test):
            todo.extend(node.orelse)
        else:
            todo.extend(ast.iter_child_nodes(node))


def _imports(name: str, is_package: bool, text: str) -> list[tuple[str, str | None]]:
    """What module ``name`` imports, as (absolute module, imported name or
    None): ``import a.b`` gives ("a.b", None), ``from .x import y`` in
    package ``p`` gives ("p.x", "y")."""
    package = name if is_package else name.rpartition(".")[0]
    out: list[tuple[str, str | None]] = []
    for node in _import_nodes(ast.parse(text, name)):
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
    for root in ("soldaemon", "lsp", "scripts"):
        for path in sorted((REPO / root).rglob("*.py")):
            n = len(path.read_text(encoding="utf-8").splitlines())
            if n > MAX_LINES:
                too_long.append(f"{path.relative_to(REPO)}: {n} lines")
    assert not too_long, f"source files over {MAX_LINES} lines:\n" + "\n".join(too_long)


def test_lsp_imports_only_the_daemon_boundary() -> None:
    """sol-lsp talks to the daemon over the wire: from soldaemon it imports
    the protocol, the API types, the errors, the daemon-finding module and
    the sensitive-file rules, nothing that pulls in the server or torch."""
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
    assert theirs == {"os", "typing", "__future__", "transformers"}
    assert _edges(_imports("pkg.sub", True, "from .mod import f\n"), modules)[0] == {"pkg.sub.mod"}
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert _reach({"p": set(), "p.a": {"q"}, "q": set()}, "p.a") == {"p.a": None, "q": "p.a", "p": "p.a"}
    graph, _ = _graph()
    assert "soldaemon.fim.templates" in graph["soldaemon.fim.prompt"]   # the real tree is read
