"""sol-lsp as an attacker would try it, on real processes over raw pipes:
a client that names a command to run, a second ``initialize``, an HTTP
request carrying an LSP frame, ``--tcp``; and what it sends as context
(secret files, files outside the workspace, untitled buffers) to a real
daemon.

The raw client here writes bytes, not pytest-lsp messages, so the test can
send what no well-behaved client would."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from pathlib import Path
from typing import IO, Any, Iterator

import pytest

from tests.fixtures.daemon import write_config
from tests.fixtures.lsp_harness import LSP_COMMAND, REPO, lsp_env


def frame(message: dict[str, Any]) -> bytes:
    body = json.dumps(message).encode()
    return b"Content-Length: %d\r\n\r\n%s" % (len(body), body)


def initialize_msg(msg_id: int, options: dict[str, Any] | None = None,
                   folders: list[str] | None = None) -> dict[str, Any]:
    params: dict[str, Any] = {"processId": None, "capabilities": {"textDocument": {"inlineCompletion": {}}},
                              "initializationOptions": options}
    if folders is not None:
        params["workspaceFolders"] = [{"uri": f, "name": f"w{i}"} for i, f in enumerate(folders)]
    return {"jsonrpc": "2.0", "id": msg_id, "method": "initialize", "params": params}


class RawLsp:
    """A sol-lsp process on pipes; frames it writes are parsed on a thread."""

    def __init__(self, args: list[str], env: dict[str, str], stderr: Path) -> None:
        self.stderr_path = stderr
        with open(stderr, "w") as err:
            self.proc = subprocess.Popen([*LSP_COMMAND, *args], cwd=REPO, env=env, stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=err)
        self.frames: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._read, args=(self.proc.stdout,), daemon=True).start()

    def _read(self, out: IO[bytes]) -> None:
        while True:
            length = 0
            while True:
                line = out.readline()
                if not line:
                    self.frames.put(None)
                    return
                if line == b"\r\n":
                    break
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            self.frames.put(json.loads(out.read(length)))

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def reply(self, msg_id: int, timeout: float = 30.0) -> dict[str, Any] | None:
        """The response to ``msg_id``; ``None`` when the output ended first."""
        deadline = time.monotonic() + timeout
        while True:
            msg = self.frames.get(timeout=max(0.01, deadline - time.monotonic()))
            if msg is None:
                return None
            if msg.get("id") == msg_id and "method" not in msg:
                return msg

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


@pytest.fixture
def raw_lsp(tmp_path: Path) -> Iterator[Any]:
    started: list[RawLsp] = []
    config = write_config(tmp_path / "sol_config.yaml")

    def start(*args: str) -> RawLsp:
        env = lsp_env(tmp_path / "state")
        lsp = RawLsp(["--config", str(config), "--log-level", "debug", "--no-start-daemon", *args], env,
                     tmp_path / f"sol-lsp-{len(started)}.stderr")
        started.append(lsp)
        return lsp

    yield start
    for lsp in started:
        lsp.close()


def wait_for_file(path: Path, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists():
            return True
        time.sleep(0.05)
    return False


def test_initialization_options_cannot_name_a_command(raw_lsp: Any, tmp_path: Path) -> None:
    """The user's command line says what starts the daemon; a client's
    ``daemonCommand`` (a project's settings, or anyone reaching the server)
    is ignored. The user's command runs, so the client's had its chance."""
    mine, theirs = tmp_path / "user-command-ran", tmp_path / "client-command-ran"
    lsp = raw_lsp("--start-daemon", "--daemon-command", f"sh -c 'echo ok > {mine}'")
    lsp.send(frame(initialize_msg(1, {"startDaemon": True, "daemonCommand": ["sh", "-c", f"id > {theirs}"]})))
    answer = lsp.reply(1)
    assert answer is not None and "result" in answer, answer
    lsp.send(frame({"jsonrpc": "2.0", "method": "initialized", "params": {}}))
    # the daemon is started by the first completion that needs it
    uri = "file:///w/a.py"
    lsp.send(frame({"jsonrpc": "2.0", "method": "textDocument/didOpen", "params": {"textDocument": {
        "uri": uri, "languageId": "python", "version": 1, "text": "x = 1\n"}}}))
    lsp.send(frame({"jsonrpc": "2.0", "id": 2, "method": "textDocument/inlineCompletion", "params": {
        "textDocument": {"uri": uri}, "position": {"line": 1, "character": 0}, "context": {"triggerKind": 1}}}))
    assert wait_for_file(mine, 30), lsp.stderr()
    time.sleep(0.5)
    assert not theirs.exists()
    assert "daemonCommand (command line only)" in lsp.stderr()


def test_initialization_options_cannot_start_a_daemon(raw_lsp: Any, tmp_path: Path) -> None:
    lsp = raw_lsp()
    lsp.send(frame(initialize_msg(1, {"startDaemon": True, "tokenFile": str(tmp_path / "x"),
                                      "url": "ws://127.0.0.1:9"})))
    answer = lsp.reply(1)
    assert answer is not None and "result" in answer, answer
    ignored = next(line for line in lsp.stderr().splitlines() if "ignoring initializationOptions" in line)
    for key in ("startDaemon", "tokenFile", "url"):
        assert f"{key} (command line only)" in ignored


def test_second_initialize_is_refused(raw_lsp: Any) -> None:
    lsp = raw_lsp()
    lsp.send(frame(initialize_msg(1)))
    first = lsp.reply(1)
    assert first is not None and "result" in first
    lsp.send(frame(initialize_msg(2, {"maxTokens": 7})))
    second = lsp.reply(2)
    assert second is not None and second.get("error", {}).get("code") == -32600, second
    assert "already" in second["error"]["message"]


def test_an_http_request_is_not_served(raw_lsp: Any) -> None:
    """A browser-shaped ``POST`` carrying an LSP frame: pygls' reader skipped
    the request line and served the frame; the strict reader closes."""
    lsp = raw_lsp()
    body = json.dumps(initialize_msg(1)).encode()
    lsp.send(b"POST / HTTP/1.1\r\nHost: 127.0.0.1:2087\r\nContent-Type: text/plain\r\n"
             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    assert lsp.reply(1, timeout=20) is None          # the output ended: no answer
    assert lsp.proc.wait(20) is not None
    assert "refusing the client's input" in lsp.stderr()


@pytest.mark.parametrize("header", [b"X-Evil: 1\r\n", b"Content-Length: 99999999999\r\n",
                                    b"Content-Length: -1\r\n", b"Content-Length: 5\r\nContent-Length: 5\r\n",
                                    b"garbage without a colon\r\n"])
def test_malformed_frames_close_the_server(raw_lsp: Any, header: bytes) -> None:
    lsp = raw_lsp()
    lsp.send(header + b"\r\n{}")
    assert lsp.reply(1, timeout=20) is None
    assert "refusing the client's input" in lsp.stderr()


def test_tcp_listener_is_gone(tmp_path: Path) -> None:
    """``--tcp`` served anyone who could reach the port; it is refused at
    start-up now (no editor needs it: all start sol-lsp on stdio)."""
    out = subprocess.run([*LSP_COMMAND, "--tcp", "127.0.0.1:0"], cwd=REPO, env=lsp_env(tmp_path / "state"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--tcp was removed" in out.stderr


# --------------------------------------------------------------------------
# What goes out as context (a real daemon records what reached its engine)
# --------------------------------------------------------------------------


SECRET = "API_KEY=hunter2-do-not-send"


@pytest.mark.asyncio
async def test_secret_and_foreign_files_are_never_sent(start_daemon: Any, tmp_path: Path) -> None:
    from lsprotocol import types

    from tests.fixtures.daemon import FAKE_ENGINE
    from tests.fixtures.lsp_harness import capabilities, inline_params, last_state, open_doc, start_lsp, wait_for

    recorded = tmp_path / "engine-saw.jsonl"
    daemon = start_daemon(args=["--engine", FAKE_ENGINE], env={"SOL_FAKE_RECORD": str(recorded)})
    client, statuses = await start_lsp(["--no-warm", "--debounce-ms", "0", "--timeout-ms", "30000",
                                        "--no-start-daemon", "--alternatives", "1"],  # one request each
                                       lsp_env(daemon.state_dir))
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=capabilities(), workspace_folders=[types.WorkspaceFolder("file:///w/proj", "proj")]))
        await wait_for(lambda: last_state(statuses) == "ready", 30, f"ready; got {statuses}")
        secrets = {
            "file:///w/proj/.env": SECRET, "file:///w/proj/.env.production": SECRET,
            "file:///w/proj/deploy/server.pem": SECRET, "file:///w/proj/.git/config": SECRET,
            "file:///home/me/.ssh/id_ed25519": SECRET, "file:///w/proj/.aws/credentials": SECRET,
            "file:///w/other/notes.py": SECRET,          # outside the workspace folder
            "untitled:Untitled-1": SECRET,               # never saved
        }
        for uri, text in secrets.items():
            open_doc(client, uri, text + "\n")
        open_doc(client, "file:///w/proj/util.py", "def helper():\n    return 42\n")
        open_doc(client, "file:///w/proj/main.py", "x = helper()\n")
        result = await client.text_document_inline_completion_async(inline_params("file:///w/proj/main.py", 1, 0))
        assert result is not None and result.items
        # completing inside a secret file asks nothing of the daemon
        empty = await client.text_document_inline_completion_async(inline_params("file:///w/proj/.env", 1, 0))
        assert empty is not None and not empty.items
        # the folder is closed: its files are outside the workspace now
        client.workspace_did_change_workspace_folders(types.DidChangeWorkspaceFoldersParams(
            types.WorkspaceFoldersChangeEvent(added=[], removed=[types.WorkspaceFolder("file:///w/proj", "proj")])))
        gone = await client.text_document_inline_completion_async(inline_params("file:///w/proj/main.py", 1, 0))
        assert gone is not None and not gone.items
    finally:
        await client.shutdown_session()
        await client.stop()
    seen = [json.loads(line) for line in recorded.read_text().splitlines()]
    assert [r["uri"] for r in seen] == ["file:///w/proj/main.py"]
    assert [uri for uri, _ in seen[0]["context"]] == ["file:///w/proj/util.py"]
    assert SECRET not in recorded.read_text()


@pytest.mark.parametrize("uri, refused", [
    ("file:///w/proj/.env", True), ("file:///w/proj/.env.local", True), ("file:///w/proj/prod.env", True),
    ("file:///w/proj/certs/tls.KEY", True), ("file:///home/me/.ssh/config", True),
    ("file:///home/me/.ssh/id_ed25519.pub", True), ("file:///w/proj/.git/config", True),
    ("file:///home/me/.aws/credentials", True), ("file:///home/me/.netrc", True),
    ("file:///w/proj/infra/terraform.tfvars", True), ("untitled:Untitled-1", True),
    ("file:///w/proj/id_utils.py", False), ("file:///w/proj/src/environment.py", False),
    ("file:///w/proj/tokenizer.py", False), ("file:///w/proj/keys.py", False),
])
def test_secret_patterns(uri: str, refused: bool) -> None:
    from soldaemon.privacy.rules import ContextPolicy

    assert (ContextPolicy().refusal(uri) is not None) == refused


def test_policy_folders_and_globs() -> None:
    from soldaemon.privacy.rules import ContextPolicy

    inside = ContextPolicy(("/w/proj",))
    assert inside.allows("file:///w/proj/a.py") and not inside.allows("file:///w/project2/a.py")
    assert not ContextPolicy(()).allows("file:///w/proj/a.py")        # every folder closed
    assert ContextPolicy(include=(".env.example",)).allows("file:///w/.env.example")
    assert not ContextPolicy(exclude=("*.generated.py",)).allows("file:///w/x.generated.py")
    assert ContextPolicy().may_complete("untitled:Untitled-1") and not ContextPolicy().allows("untitled:Untitled-1")


def test_doctor_from_sol_lsp_never_imports_a_project_package(tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 8: "Run soldaemon doctor" with the project as the current
    directory, a ``PYTHONPATH`` with an empty entry (the current directory)
    and ``.`` on ``PATH``: neither the project's ``soldaemon``, ``lsp`` or
    ``sitecustomize`` is imported, nor its ``nvidia-smi`` run."""
    import asyncio
    import os
    from types import SimpleNamespace

    from lsp.server import SolLanguageServer
    from lsp.settings import Settings

    project, state = tmp_path / "project", tmp_path / "state"
    state.mkdir(mode=0o700)
    marker = tmp_path / "ran"
    for package in ("soldaemon", "lsp"):
        (project / package).mkdir(parents=True)
        (project / package / "__init__.py").write_text(f"open({str(marker)!r}, 'a').write('{package} ')\n")
    (project / "soldaemon" / "cli.py").write_text("def main(): return 0\n")
    (project / "sitecustomize.py").write_text(f"open({str(marker)!r}, 'a').write('sitecustomize ')\n")
    smi = project / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho nvidia-smi >> {marker}\n")
    smi.chmod(0o755)
    monkeypatch.chdir(project)
    monkeypatch.setenv("PYTHONPATH", os.pathsep)           # two empty entries: the current directory
    monkeypatch.setenv("PATH", "." + os.pathsep + os.environ["PATH"])
    monkeypatch.setenv("SOLDAEMON_STATE_DIR", str(state))
    shown: list[Path] = []
    server = SimpleNamespace(settings=Settings(), show_file=shown.append,
                             window_show_message=lambda params: pytest.fail(params.message))
    asyncio.run(SolLanguageServer._run_doctor(server))     # type: ignore[arg-type]
    assert not marker.exists(), marker.read_text()
    report = shown[0].read_text()
    assert shown[0].parent == state and "daemon" in report and "exit status" in report, report


def test_doctor_never_runs_a_projects_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Finding 8: with ``.`` (and an empty entry) on ``PATH``, reading the machine runs no
    ``nvidia-smi`` from the current directory (the doctor reads GPUs through NVML only)."""
    import os

    from soldaemon.doctor import readers

    marker = tmp_path / "ran"
    smi = tmp_path / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\necho ran > {marker}\n")
    smi.chmod(0o755)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", os.pathsep.join([".", "", os.environ.get("PATH", "")]))
    readers.read_machine(cache_root=tmp_path / "cache")
    assert not marker.exists()
