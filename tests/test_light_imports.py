"""What the light entry points import. sol-lsp and ``soldaemon status`` /
``doctor`` start in a fraction of a second because they never load torch,
transformers, the websocket server, prometheus or psutil; and sol-lsp reaches
into soldaemon only through its public, light modules. Each check runs in a
fresh interpreter, so what another test imported does not count."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.test_architecture import LSP_MAY_IMPORT     # what lsp/*.py may import from soldaemon

REPO = Path(__file__).resolve().parent.parent
HEAVY = ("torch", "transformers", "websockets.asyncio.server", "websockets.server", "prometheus_client", "psutil")


def soldaemon_imports(path: Path) -> set[str]:
    """Every ``soldaemon...`` module ``path`` imports, at any depth of the file."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
            if node.module == "soldaemon":      # `from soldaemon import x` may name a module
                names += [f"soldaemon.{alias.name}" for alias in node.names if alias.name != "__version__"]
        else:
            continue
        found |= {n for n in names if n == "soldaemon" or n.startswith("soldaemon.")}
    return found


def loaded_after(code: str, env: dict[str, str] | None = None) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; which of :data:`HEAVY` it loaded."""
    probe = code + f"\nimport json, sys\nprint(json.dumps({{m: m in sys.modules for m in {HEAVY!r}}}))\n"
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, env={**os.environ, **(env or {})},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result: dict[str, bool] = json.loads(out.stdout.strip().splitlines()[-1])
    return result


def test_lsp_imports_only_the_public_light_modules() -> None:
    files = sorted((REPO / "lsp").glob("*.py"))
    assert files
    bad = {f.name: sorted(soldaemon_imports(f) - LSP_MAY_IMPORT) for f in files}
    assert {name: mods for name, mods in bad.items() if mods} == {}


def test_lsp_server_loads_nothing_heavy() -> None:
    loaded = loaded_after("import lsp.server")
    assert [m for m, yes in loaded.items() if yes] == []


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_status_and_doctor_start_without_torch(tmp_path: Path) -> None:
    """Both commands run to their end (no daemon answers) without torch."""
    state = tmp_path / "state"
    state.mkdir(mode=0o700)
    port = closed_port()
    code = f"""
from pathlib import Path
from soldaemon.server.auth import load_or_create_token
from soldaemon.cli import main
load_or_create_token(Path({str(state / 'token')!r}))
assert main(["status", "--url", "ws://127.0.0.1:{port}", "--timeout", "2"]) != 0   # nobody answers
main(["doctor", "--port", "{port}"])
"""
    loaded = loaded_after(code, {"SOLDAEMON_STATE_DIR": str(state), "SOLDAEMON_CACHE_DIR": str(tmp_path / "cache")})
    assert not loaded["torch"] and not loaded["transformers"]


def test_the_products_import_path_loads_no_measurement_code() -> None:
    """``serve``, ``status``, ``stop``, ``complete`` and ``doctor`` parse their
    arguments, and the server and sol-lsp import, without loading
    soldaemon_bench (only ``bench`` does, when it is parsed)."""
    code = """
import sys
from soldaemon.cli import build_parser
for argv in (["serve", "--port", "0"], ["status"], ["stop"], ["complete", "a.py:1:1"], ["doctor", "--json"]):
    build_parser().parse_args(argv)
import soldaemon.server.command, soldaemon.server.daemon, soldaemon.client.commands, lsp.server
print(sorted(m for m in sys.modules if m.startswith("soldaemon_bench")))
build_parser().parse_args(["bench", "--holes", "1"])
print(sorted(m for m in sys.modules if m.startswith("soldaemon_bench")))
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{REPO / 'bench'}"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    product, bench = out.stdout.strip().splitlines()[-2:]
    assert product == "[]"
    assert "soldaemon_bench.bench" in bench      # the probe sees the package when it is loaded


def test_bench_without_its_package_says_what_to_install(tmp_path: Path) -> None:
    """The benchmarks are their own distribution (bench/): where it is not
    installed, ``soldaemon bench`` exits 2 with the command that installs it."""
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\n"
        "class NoBench:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] == 'soldaemon_bench':\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoBench())\n")
    out = subprocess.run([sys.executable, "-m", "soldaemon.cli", "bench", "--holes", "1"], cwd=REPO,
                         env={**os.environ, "PYTHONPATH": f"{tmp_path}{os.pathsep}{REPO}"},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "pip install -e ./bench" in out.stderr and "Traceback" not in out.stderr


def test_status_client_loads_no_websocket_server() -> None:
    loaded = loaded_after("import soldaemon.client.commands, soldaemon.discovery")
    assert [m for m, yes in loaded.items() if yes] == []
