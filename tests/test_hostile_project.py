"""A cloned repository attacks the editor's completion set-up (issue 26), on
real processes: sol-lsp over stdio, the daemon it starts, a listener the
repository names.

1. The project ships ``sol_config.yaml`` (a remote backend on a listener of
   the test, an API key file, ``allow_remote``, a model path)
   and a ``soldaemon/`` package whose ``__init__`` writes a marker. sol-lsp
   runs in the project directory with no ``soldaemon`` script next to its
   interpreter or on PATH, so it starts ``python -m soldaemon.cli``. It must
   complete normally while the listener hears nothing and the marker never
   appears.
2. What sol-lsp sends to a daemon: a ``vscode-remote`` ``.env``, a project
   file that links to a secret outside the workspace, a file holding a
   private key, and an exclude glob changed while running.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.fixtures.lsp_harness import REPO, capabilities, inline_params, last_state, lsp_env, open_doc, wait_for

PRIVATE_KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
               "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
               "QyNTUxOQAAACDm3wq1ZqVw5ki0nT9bYl0Yx2Yt7hZ0r8B3vYwq9f1pQwAAAJg7rK1cO6yt\n"
               "-----END OPENSSH PRIVATE KEY-----\n")
SECRET = "hunter2-do-not-send"
# subprocesses import this checkout first, then whatever the test run had on its path
PYTHONPATH = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)


class Listener:
    """A TCP listener on loopback that records every connection and byte."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.heard: list[bytes] = []
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.settimeout(2)
            data = b"<connected>"
            with contextlib.suppress(OSError):
                data += conn.recv(65536)
            self.heard.append(data)
            conn.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def listener() -> Iterator[Listener]:
    lst = Listener()
    yield lst
    lst.close()


def bare_interpreter(root: Path, *, with_script: bool) -> Path:
    """This venv's Python, seen from a directory with no ``soldaemon`` script
    (a GUI-started editor, ``pip --user``: sol-lsp's fallback command runs),
    or with one (``with_script``) as pip installs it."""
    venv = Path(sys.prefix)
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text((venv / "pyvenv.cfg").read_text())
    (root / "lib").symlink_to(venv / "lib")
    python = root / "bin" / "python"
    python.symlink_to(sys.executable)
    script = root / "bin" / "sol-lsp"          # as pip writes a console script
    script.write_text(f"#!{python}\nimport sys\nfrom lsp.server import main\nsys.exit(main())\n")
    script.chmod(0o755)
    if with_script:
        daemon = root / "bin" / "soldaemon"
        daemon.write_text(f"#!{python}\nimport sys\nfrom soldaemon.cli import main\nsys.exit(main())\n")
        daemon.chmod(0o755)
    return python


def hostile_project(root: Path, listener: Listener, key_file: Path, marker: Path, model: str) -> Path:
    proj = root / "proj"
    (proj / "soldaemon").mkdir(parents=True)
    (proj / "sol_config.yaml").write_text(yaml.safe_dump({
        # port 0: a daemon that reads this file can bind, become ready and probe the "backend"
        "server": {"host": "127.0.0.1", "port": 0, "allow_remote": True},
        "backend": {"kind": "remote", "url": f"http://127.0.0.1:{listener.port}/v1",
                    "api_key_file": str(key_file)},
        "model": {"path": model},          # their choice of model (the tiny one: it exists, so it loads)
    }))
    (proj / "soldaemon" / "__init__.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n")
    (proj / "main.py").write_text("def add(a, b):\n    return a + b\n")
    return proj


def stop_started_daemon(state: Path) -> None:
    record = state / "daemon.json"
    with contextlib.suppress(OSError, ValueError, KeyError):
        os.kill(int(json.loads(record.read_text())["pid"]), signal.SIGTERM)


@pytest.mark.asyncio
@pytest.mark.parametrize("launcher", ["python -m", "script"])
async def test_a_cloned_project_neither_configures_nor_runs_code(tmp_path: Path, listener: Listener,
                                                                 engine_args: list[str], launcher: str) -> None:
    """``python -m``: no ``soldaemon`` script anywhere, the fallback runs;
    ``script``: the console script beside the interpreter starts the daemon."""
    from lsprotocol import types
    from pytest_lsp.client import make_test_lsp_client

    marker, key_file = tmp_path / "their-code-ran", tmp_path / "my-api-key"
    key_file.write_text(SECRET + "\n")
    proj = hostile_project(tmp_path, listener, key_file, marker, engine_args[1])
    python = bare_interpreter(tmp_path / "venv", with_script=launcher == "script")
    mine = tmp_path / "config" / "soldaemon" / "sol_config.yaml"     # the user's own config
    mine.parent.mkdir(parents=True)
    mine.write_text(yaml.safe_dump({"server": {"host": "127.0.0.1", "port": 0}, "device": {"threads": 1},
                                    "model": {"path": engine_args[1]}}))
    state, log_file = tmp_path / "state", tmp_path / "sol-lsp.log"
    env = lsp_env(state, {"XDG_CONFIG_HOME": str(tmp_path / "config"), "SOLDAEMON_CACHE_DIR": str(tmp_path / "cache"),
                          "PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(tmp_path / "home"),
                          "PYTHONPATH": PYTHONPATH})
    env.pop("SOLDAEMON_CONFIG", None)
    client = make_test_lsp_client()
    statuses: list[dict[str, Any]] = []
    client.feature("sol/status")(lambda params: statuses.append(
        params._asdict() if hasattr(params, "_asdict") else dict(params)))
    await client.start_io(str(python), str(python.parent / "sol-lsp"), "--log-level", "debug",
                          "--log-file", str(log_file), "--debounce-ms", "0", "--no-warm", "--alternatives", "1",
                          "--timeout-ms", "60000", env=env, cwd=str(proj))
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=capabilities(), workspace_folders=[types.WorkspaceFolder(proj.as_uri(), "proj")]))
        uri = (proj / "main.py").as_uri()
        open_doc(client, uri, (proj / "main.py").read_text())
        # the first completion starts the daemon (not the window): empty at once, ready soon after
        await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 1, 11)), 90)
        await wait_for(lambda: last_state(statuses) == "ready" or marker.exists() or bool(listener.heard), 240,
                       f"the daemon sol-lsp starts; got {statuses[-3:]}")
        assert not marker.exists(), "the project's soldaemon/__init__.py ran"
        assert listener.heard == [], f"the project's listener was reached: {listener.heard[:2]}"
        result = await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 1, 11)), 90)
        assert result is not None
        log = log_file.read_text()
        assert "finish=" in log, log[-3000:]        # the daemon answered the completion
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
        with contextlib.suppress(Exception):
            await client.stop()
        stop_started_daemon(state)
    assert not marker.exists(), "the project's soldaemon/__init__.py ran"
    assert listener.heard == [], f"the project's listener was reached: {listener.heard[:2]}"
    record = json.loads((state / "daemon.json").read_text()) if (state / "daemon.json").exists() else None
    daemon_log = (state / "daemon.log").read_text(errors="replace")
    assert str(listener.port) not in daemon_log and SECRET not in daemon_log
    assert record is None or f":{listener.port}" not in record["url"]


@pytest.mark.asyncio
async def test_remote_links_and_keys_are_not_sent(start_daemon: Any, tmp_path: Path) -> None:
    from lsprotocol import types

    from tests.fixtures.daemon import FAKE_ENGINE
    from tests.fixtures.lsp_harness import start_lsp

    outside = tmp_path / "home" / ".aws"
    outside.mkdir(parents=True)
    (outside / "credentials").write_text(f"[default]\naws_secret_access_key = {SECRET}\n")
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "cloud.ini").symlink_to(outside / "credentials")     # an innocent name, a secret file
    files = {
        "cloud.ini": (outside / "credentials").read_text(),
        "notes.py": "def deploy():\n    pass\n\nKEY = '''\n" + PRIVATE_KEY + "'''\n",
        "util.py": "def helper():\n    return 42\n",
        "gen_table.py": "TABLE = [1, 2, 3]\n",
        "main.py": "x = helper()\n",
    }
    for name, text in files.items():
        if name != "cloud.ini":
            (proj / name).write_text(text)
    remote = "vscode-remote://ssh-remote%2Bbox/w/proj"
    recorded = tmp_path / "engine-saw.jsonl"
    daemon = start_daemon(args=["--engine", FAKE_ENGINE], env={"SOL_FAKE_RECORD": str(recorded),
                                                               "PYTHONPATH": PYTHONPATH})
    client, statuses = await start_lsp(["--no-warm", "--debounce-ms", "0", "--timeout-ms", "30000",
                                        "--no-start-daemon", "--alternatives", "1"],
                                       lsp_env(daemon.state_dir, {"PYTHONPATH": PYTHONPATH}))
    main = (proj / "main.py").as_uri()
    try:
        await client.initialize_session(types.InitializeParams(capabilities=capabilities(), workspace_folders=[
            types.WorkspaceFolder(proj.as_uri(), "proj"), types.WorkspaceFolder(remote, "remote")]))
        await wait_for(lambda: last_state(statuses) == "ready", 30, f"ready; got {statuses}")
        open_doc(client, f"{remote}/.env", f"API_KEY={SECRET}\n")
        open_doc(client, f"{remote}/app.py", "import os\n")
        for name, text in files.items():
            open_doc(client, (proj / name).as_uri(), text)
        first = await client.text_document_inline_completion_async(inline_params(main, 1, 0))
        assert first is not None and first.items
        # the editor is told what was withheld (sol/status.withheld)
        await wait_for(lambda: any("Private Key" in (s.get("withheld") or "") for s in statuses), 10,
                       f"a status naming the withheld key; got {statuses[-3:]}")
        for refused in (f"{remote}/.env", (proj / "cloud.ini").as_uri()):
            empty = await client.text_document_inline_completion_async(inline_params(refused, 1, 0))
            assert empty is not None and not empty.items, refused
        # an exclude set while running applies to the next completion
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"soldaemon": {"contextExclude": ["gen_*.py"]}}))
        second = await client.text_document_inline_completion_async(inline_params(main, 1, 0))
        assert second is not None
    finally:
        await client.shutdown_session()
        await client.stop()
    text = recorded.read_text()
    seen = [json.loads(line) for line in text.splitlines()]
    assert [r["uri"] for r in seen] == [main, main]
    first_context = {uri.rsplit("/", 1)[-1] for uri, _ in seen[0]["context"]}
    assert first_context == {"notes.py", "util.py", "gen_table.py", "app.py"}, first_context
    assert "gen_table.py" not in {uri.rsplit("/", 1)[-1] for uri, _ in seen[1]["context"]}
    notes = next(t for uri, t in seen[0]["context"] if uri.endswith("notes.py"))
    assert "def deploy" in notes and "<redacted>" in notes      # the file helps; its key does not leave
    assert SECRET not in text and "PRIVATE KEY" not in text and "b3BlbnNzaC1rZXkt" not in text
