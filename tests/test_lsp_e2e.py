"""End to end: a real ``sol-lsp`` process (spawned by pytest-lsp's client, or by
Neovim's built-in LSP client) talking to a real ``soldaemon serve`` on the
tiny model. Inline completion, plain completion, accept telemetry,
``$/cancelRequest`` and a newer request cancelling work *on the daemon*
(its /metrics), the daemon going down (empty answers at once, one message)
and coming back, ``--start-daemon``, and Neovim.

One daemon serves the module; the restart test runs last and restarts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.fixtures.daemon import Daemon, complete, spawn, write_config
from tests.fixtures.gate import ENV as GATE_ENV
from tests.fixtures.gate import Gate
from tests.fixtures.require import require
from tests.fixtures.lsp_harness import (
    LSP_COMMAND,
    REPO,
    initialize,
    inline_params,
    last_state,
    lsp_env,
    open_doc,
    start_lsp,
    wait_for,
    wait_for_async,
)

# The real engine on the tiny model; a request on a /held/ uri waits in the worker until cancelled.
HELD_ENGINE = "tests.fixtures.held_engine:make_engine"
PREFIX = "def add(a, b):\n    return "          # the tiny model answers this one with text
# sol-lsp's options for a request a test cancels: never ended by sol-lsp's own timeout first
LONG = {"maxTokens": 2048, "multiline": "single", "timeoutMs": 120_000}
# Short back-off for the restart test; short completions (the CPU is shared); no flaky timeouts.
# No daemon of their own: a test that wants one started says so (--start-daemon).
QUICK = ["--no-start-daemon", "--backoff-initial-ms", "100", "--backoff-max-ms", "400", "--timeout-ms", "60000", "--max-tokens", "16"]
NVIM_DRIVER = Path(__file__).parent / "fixtures" / "nvim_complete.lua"
COMPLETE_CANCELLED = 'sol_requests_total{kind="complete",outcome="cancelled"}'
COMPLETE_SUPERSEDED = 'sol_requests_total{kind="complete",outcome="superseded"}'


@dataclass
class DaemonBox:
    """The module's daemon; restartable in the same state directory (same
    token, a new port: sol-lsp must find it again through daemon.json)."""

    tmp: Path
    args: list[str]
    daemon: Daemon | None = None
    old: list[Daemon] = field(default_factory=list)

    @property
    def d(self) -> Daemon:
        assert self.daemon is not None
        return self.daemon

    @property
    def gate(self) -> Gate:
        """The held engine's gate (tests/fixtures/held_engine.py): requests on
        a ``/held/`` uri wait in the daemon's worker until cancelled."""
        return Gate(self.tmp / "gate")

    def start(self) -> Daemon:
        started = spawn(self.tmp, args=[*self.args, "--engine", HELD_ENGINE, "--port", "0"],
                        server={"rate_limit_per_s": 10_000}, env={GATE_ENV: str(self.gate.root)})
        assert isinstance(started, Daemon)
        self.daemon = started
        asyncio.run(self._warm_up(started))
        return started

    @staticmethod
    async def _warm_up(d: Daemon) -> None:
        """The first request after start-up is slow (lazy initialisation);
        pay for it here, not inside a test's timing."""
        async with await d.connect() as ws:
            await complete(ws, "warm-up", PREFIX, suffix="\n", max_tokens=8, timeout=120)

    def stop(self) -> None:
        if self.daemon is not None:
            self.daemon.stop()
            self.old.append(self.daemon)
            self.daemon = None

    async def metric(self, name: str) -> float:
        return await asyncio.to_thread(self.d.metric, name)

    def held(self) -> int:
        """How many requests the engine has held so far."""
        return len(self.gate.held())

    async def requests(self, kind: str) -> float:
        """``sol_requests_total`` of ``kind`` over every outcome."""
        _, body = await asyncio.to_thread(self.d.http_get, "/metrics")
        head = f'sol_requests_total{{kind="{kind}"'
        return sum(float(line.rpartition(" ")[2]) for line in body.decode().splitlines() if line.startswith(head))


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[DaemonBox]:
    box = DaemonBox(tmp_path_factory.mktemp("lsp-daemon"), engine_args)
    box.start()
    yield box
    box.stop()


Starter = Callable[..., Awaitable[tuple[LanguageClient, list[dict[str, Any]]]]]


@pytest_asyncio.fixture
async def start(daemon: DaemonBox) -> AsyncIterator[Starter]:
    """``await start(*flags, options=..., inline=...)``: a sol-lsp connected
    to the module's daemon, initialized; shut down at teardown."""
    clients: list[LanguageClient] = []

    async def _start(*flags: str, options: dict[str, Any] | None = None, inline: bool = True,
                     encodings: list[str] | None = None, state_dir: Path | None = None,
                     wait_ready: bool = True) -> tuple[LanguageClient, list[dict[str, Any]]]:
        client, statuses = await start_lsp([*QUICK, *flags], lsp_env(state_dir or daemon.d.state_dir))
        clients.append(client)
        result = await initialize(client, inline=inline, options=options, encodings=encodings)
        client.init_result = result  # type: ignore[attr-defined]
        if wait_ready:
            await wait_for(lambda: last_state(statuses) == "ready", 30, f"sol/status ready; got {statuses}")
        return client, statuses

    yield _start
    for client in clients:
        server = client._server
        if server is not None and server.returncode is None:      # not shut down by the test
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown_session(), 15)
        with contextlib.suppress(Exception):
            await client.stop()


async def wait_metric(daemon: DaemonBox, names: tuple[str, ...], at_least: float, timeout: float = 15.0) -> float:
    """Wait until the sum of ``names`` in /metrics reaches ``at_least``."""
    seen = 0.0

    async def probe() -> bool:
        nonlocal seen
        seen = sum([await daemon.metric(n) for n in names])
        return seen >= at_least

    await wait_for_async(probe, timeout, f"{' + '.join(names)} >= {at_least} (last {seen})", interval=0.1)
    return seen


async def wait_held(daemon: DaemonBox, count: int) -> None:
    """Wait until the daemon's engine holds the ``count``-th request on a
    ``/held/`` uri: it is running on the worker and cannot finish until it
    is cancelled, however fast the model is."""
    await wait_for(lambda: daemon.held() >= count, 30, f"the daemon's engine to hold request {count}")


# --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_inline_completion_and_accept_telemetry(start: Starter, daemon: DaemonBox) -> None:
    # The client prefers UTF-32 positions: sol-lsp takes them (no UTF-16 conversion), and the
    # emoji before the cursor (1 code point, 2 UTF-16 units) shows which one it used.
    client, _ = await start(encodings=["utf-32", "utf-16"])
    assert client.init_result.capabilities.position_encoding == "utf-32"  # type: ignore[attr-defined]
    open_doc(client, "file:///w/helper.py", "def helper(x):\n    return x * 2\n")   # context for the next
    uri = "file:///w/a.py"
    line = "    return '😀' + "
    open_doc(client, uri, f"def add(a, b):\n{line}\n")
    result = await asyncio.wait_for(
        client.text_document_inline_completion_async(inline_params(uri, 1, len(line))), 60)
    assert result is not None and result.items, "no inline completion from the daemon"
    item = result.items[0]
    assert isinstance(item.insert_text, str)
    # Replaces from the start of the line: the line's text so far + the completion.
    assert item.range == types.Range(types.Position(1, 0), types.Position(1, len(line)))
    assert item.insert_text.startswith(line) and item.insert_text[len(line):].strip()
    assert item.command is not None and item.command.command == "sol.accepted"
    request_id, index, before = item.command.arguments or ("", -1, -1)
    assert isinstance(request_id, str) and request_id.startswith("c") and index == 0
    assert before == len(line)      # characters of insertText before the cursor (acceptedLength counts them)

    # A client with inline completion gets no plain completion items (no duplicates).
    plain = await client.text_document_completion_async(types.CompletionParams(
        types.TextDocumentIdentifier(uri), types.Position(1, len(line))))
    assert isinstance(plain, types.CompletionList) and len(plain.items) == 0

    # Telemetry: shown, partially accepted, accepted reach the daemon's metrics.
    events = tuple(f'sol_completion_events_total{{kind="{k}"}}' for k in ("shown", "partial", "accepted"))
    before = [await daemon.metric(name) for name in events]
    wire_item = client.protocol._converter.unstructure(item)
    client.protocol.notify("sol/didShowCompletion", {"item": wire_item})
    client.protocol.notify("sol/didPartiallyAcceptCompletion", {"item": wire_item, "acceptedLength": len(line) + 4})
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=item.command.command, arguments=item.command.arguments))
    for name, was in zip(events, before):
        await wait_metric(daemon, (name,), was + 1)


@pytest.mark.asyncio
async def test_plain_completion_for_clients_without_inline(start: Starter, daemon: DaemonBox) -> None:
    client, _ = await start(inline=False)
    uri = "file:///w/plain.py"
    open_doc(client, uri, PREFIX + "\n")
    result = await asyncio.wait_for(client.text_document_completion_async(types.CompletionParams(
        types.TextDocumentIdentifier(uri), types.Position(1, 11),
        context=types.CompletionContext(trigger_kind=types.CompletionTriggerKind.Invoked))), 60)
    assert isinstance(result, types.CompletionList) and result.is_incomplete and result.items
    item = result.items[0]
    assert isinstance(item.text_edit, types.TextEdit) and item.text_edit.new_text.strip()
    # No word before the cursor ("return " ends in a space): the edit starts at the cursor.
    assert item.text_edit.range == types.Range(types.Position(1, 11), types.Position(1, 11))
    assert item.label and item.command is not None and item.command.command == "sol.accepted"

    # An edit with no completion after it: once typing pauses, the spot is warmed on the daemon.
    warms = await daemon.requests("warm")
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(1, 11), types.Position(1, 11)), text="a")]))

    async def warmed() -> bool:
        return await daemon.requests("warm") >= warms + 1
    await wait_for_async(warmed, 20, "a background warm on the daemon", interval=0.1)


@pytest.mark.asyncio
async def test_cancel_request_cancels_the_work_on_the_daemon(start: Starter, daemon: DaemonBox) -> None:
    client, _ = await start(options=LONG)
    uri = "file:///w/held/cancel.py"
    open_doc(client, uri, PREFIX + "\n")
    before = await daemon.metric(COMPLETE_CANCELLED)
    held = daemon.held()
    pending = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 1, 11), msg_id="cancel-me"))
    await wait_held(daemon, held + 1)                   # running on the daemon, and cannot finish by itself
    t0 = time.perf_counter()
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="cancel-me"))
    with pytest.raises(Exception) as caught:
        await asyncio.wait_for(pending, 10)
    assert "cancel" in str(caught.value).lower(), caught.value   # RequestCancelled (-32800)
    await wait_metric(daemon, (COMPLETE_CANCELLED,), before + 1)
    print(f"\n[figure] $/cancelRequest → cancelled on the daemon (metrics seen): "
          f"{(time.perf_counter() - t0) * 1000:.0f} ms")


@pytest.mark.asyncio
async def test_newer_request_cancels_the_older_on_the_daemon(start: Starter, daemon: DaemonBox) -> None:
    """The older request is held in the daemon's worker (it cannot finish
    with items by itself, however quick the model): only the newer request
    for the same document can end it."""
    client, _ = await start(options=LONG)
    uri = "file:///w/held/newer.py"
    open_doc(client, uri, PREFIX + "\n")
    before = sum([await daemon.metric(n) for n in (COMPLETE_CANCELLED, COMPLETE_SUPERSEDED)])
    held = daemon.held()
    older = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 1, 11), msg_id="older"))
    await wait_held(daemon, held + 1)
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=2),
        [types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(1, 11), types.Position(1, 11)), text="a")]))
    newer = asyncio.ensure_future(client.protocol.send_request_async(
        types.TEXT_DOCUMENT_INLINE_COMPLETION, inline_params(uri, 1, 12), msg_id="newer"))
    answer = await asyncio.wait_for(older, 10)
    assert answer is not None and not answer.items      # the older one ends empty, promptly
    await wait_metric(daemon, (COMPLETE_CANCELLED, COMPLETE_SUPERSEDED), before + 1)
    client.protocol.notify(types.CANCEL_REQUEST, types.CancelParams(id="newer"))
    with contextlib.suppress(Exception):
        await asyncio.wait_for(newer, 10)


@pytest.mark.asyncio
async def test_start_daemon_when_none_is_running(start: Starter, tmp_path: Path) -> None:
    """--start-daemon: nothing listens and no token exists yet; sol-lsp starts
    the daemon (the scripted engine: quick) and connects once it is ready."""
    config = write_config(tmp_path / "sol_config.yaml")
    command = (f"{sys.executable} -m soldaemon.cli --config {config} serve "
               f"--engine tests.fixtures.fake_engine:make_engine --port 0")
    state = tmp_path / "state"
    client: LanguageClient | None = None
    try:
        client, statuses = await start("--start-daemon", "--daemon-command", command, "--config", str(config),
                                       state_dir=state, wait_ready=False)
        uri = "file:///w/started.py"
        open_doc(client, uri, "x = 1\n")
        # the open document starts it (not the window); the first completion waits for it
        await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 1, 0)), 60)
        await wait_for(lambda: last_state(statuses) == "ready", 60, f"the started daemon; got {statuses}")
        assert any("starting soldaemon" in s.get("message", "") for s in statuses), statuses
        record = json.loads((state / "daemon.json").read_text())
        assert record["url"].startswith("ws://127.0.0.1:")
        result = await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 1, 0)), 30)
        assert result is not None
        assert client.messages == []         # no pop-up for a start that worked
    finally:
        # The daemon outlives sol-lsp by design (detached): stop sol-lsp first (or it
        # would start the daemon again), then the daemon it started.
        if client is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown_session(), 15)
        record_path = state / "daemon.json"
        for _ in range(150):                      # a daemon still starting writes it when ready
            if record_path.exists():
                break
            await asyncio.sleep(0.1)
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(json.loads(record_path.read_text())["pid"]), signal.SIGTERM)
            for _ in range(100):
                if not record_path.exists():
                    break
                await asyncio.sleep(0.1)


def test_neovim_builtin_client_gets_a_completion(daemon: DaemonBox, tmp_path: Path) -> None:
    """Debian's Neovim, headless: its built-in LSP client starts sol-lsp, which
    asks the real daemon; the completion comes back through Neovim."""
    nvim = shutil.which("nvim")
    require(nvim, "Neovim", "apt-get install -y neovim")
    assert nvim is not None
    source = tmp_path / "edit.py"
    source.write_text(PREFIX + "\n")
    out = tmp_path / "nvim-result.json"
    env = lsp_env(daemon.d.state_dir, {
        "SOL_NVIM_CMD": json.dumps([*LSP_COMMAND, "--no-start-daemon", "--log-level", "info",
                                    "--log-file", str(tmp_path / "sol-lsp.log")]),
        "SOL_NVIM_OUT": str(out), "SOL_NVIM_LINE": "2", "SOL_NVIM_COL": "10",
        "HOME": str(tmp_path), "XDG_CONFIG_HOME": str(tmp_path / "config"),
        "XDG_DATA_HOME": str(tmp_path / "data"), "XDG_CACHE_HOME": str(tmp_path / "cache"),
    })
    # Neovim's own state (its LSP log) goes to XDG_STATE_HOME; sol-lsp reads SOLDAEMON_STATE_DIR.
    env["XDG_STATE_HOME"] = str(tmp_path / "nvim-state")
    proc = subprocess.run([nvim, "--headless", "-n", "-i", "NONE", "-u", str(NVIM_DRIVER), str(source)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    log = (tmp_path / "sol-lsp.log").read_text() if (tmp_path / "sol-lsp.log").exists() else ""
    assert out.exists(), f"nvim wrote no result (rc {proc.returncode}): {proc.stderr[-2000:]}\n{log[-3000:]}"
    report = json.loads(out.read_text())
    assert not report.get("error"), f"{report}\n{log[-3000:]}"
    assert "ready" in report["statuses"]
    items = report["result"]["items"]
    assert items, f"empty completion list from the daemon via Neovim: {report}\n{log[-3000:]}"
    new_text = items[0]["textEdit"]["newText"]
    # The normal-mode cursor at byte 10 sits on the trailing space, so the
    # position is right after "return": the item replaces that word and
    # continues it with the daemon's text.
    assert new_text.startswith("retur") and len(new_text) > len("return"), items[0]
    assert items[0]["command"]["command"] == "sol.accepted"


@pytest.mark.asyncio
async def test_daemon_restart_while_the_editor_is_connected(start: Starter, daemon: DaemonBox) -> None:
    """Runs last: restarts the module's daemon."""
    client, statuses = await start("--failure-message-after-s", "1")
    uri = "file:///w/restart.py"
    open_doc(client, uri, PREFIX + "\n")
    ready_at = len(statuses)
    await asyncio.to_thread(daemon.stop)               # SIGTERM: drain, close 1001
    await wait_for(lambda: last_state(statuses) in ("connecting", "error") and len(statuses) > ready_at, 20,
                   f"sol/status to leave ready; got {statuses}")

    # The daemon is down: answers are empty at once, never a wait for sol-lsp's request
    # timeout (--timeout-ms 60000). The bound is a sixth of that timeout, not a speed
    # figure: a busy machine may take a second to schedule two processes.
    for attempt in range(3):
        t0 = time.perf_counter()
        result = await asyncio.wait_for(
            client.text_document_inline_completion_async(inline_params(uri, 1, 11)), 30)
        elapsed_ms = (time.perf_counter() - t0) * 1000
        assert result is not None and len(result.items) == 0
        assert elapsed_ms < 10_000, f"request {attempt} took {elapsed_ms:.0f} ms with the daemon down"
    # A persistent failure: exactly one message, however many retries.
    await wait_for(lambda: len(client.messages) >= 1, 20, "one window/showMessage")
    await asyncio.sleep(1.0)
    assert len(client.messages) == 1, client.messages
    assert "unavailable" in client.messages[0].message
    assert "error" in [s["state"] for s in statuses[ready_at:]]

    await asyncio.to_thread(daemon.start)               # same state dir and token, a new port
    await wait_for(lambda: last_state(statuses) == "ready", 60, f"reconnection; got {statuses[-3:]}")
    result = await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 1, 11)), 60)
    assert result is not None and result.items, "no completion after the daemon came back"
    assert len(client.messages) == 1
