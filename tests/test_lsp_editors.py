"""End to end, issue 19: what editors see of sol-lsp beyond a completion.
A real ``sol-lsp`` (pytest-lsp's client) and a real ``soldaemon serve`` on
the tiny model:

- events under Copilot's names and sol/didRejectCompletion reach /metrics,
  which shows the accept rate (and ``health`` the counts);
- an invoked inline completion gets distinct alternatives, greedy first; an
  automatic one the greedy item only;
- ``sol/status`` carries latency; ``workspace/didChangeConfiguration``
  applies without a restart, and an invalid value is named, old settings
  kept;
- a client that asks for inline completions (lsp-mode, whose capabilities
  say ``null``) stops getting plain items;
- two sol-lsp starting at once in a fresh state directory start one daemon,
  show ``$/progress`` while it starts, and leave it running (detached) when
  they exit; it idles out by itself (``--idle-exit-s``);
- ``$/progress`` follows a daemon that is loading its model, to the end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Iterator

import pytest
import pytest_asyncio
from lsprotocol import types
from pytest_lsp import LanguageClient

from soldaemon.discovery import pid_exists
from tests.fixtures.daemon import FAKE_ENGINE, Daemon, spawn, write_config
from tests.fixtures.lsp_harness import capabilities, inline_params, last_state, lsp_env, open_doc, start_lsp, wait_for

PREFIX = "def add(a, b):\n    return "
QUICK = ["--no-start-daemon", "--backoff-initial-ms", "100", "--backoff-max-ms", "400", "--timeout-ms", "60000",
         "--max-tokens", "12", "--debounce-ms", "0", "--no-warm"]


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[Daemon]:
    started = spawn(tmp_path_factory.mktemp("editors-daemon"), args=[*engine_args, "--port", "0"],
                    server={"rate_limit_per_s": 10_000})
    assert isinstance(started, Daemon)
    yield started
    started.stop()


Starter = Callable[..., Awaitable[tuple[LanguageClient, list[dict[str, Any]]]]]


def init_params(*, inline: bool = True, name: str = "pytest-lsp", options: dict[str, Any] | None = None,
                progress: bool = False) -> types.InitializeParams:
    caps = capabilities(inline=inline)
    if progress:
        caps.window = types.WindowClientCapabilities(work_done_progress=True)
    return types.InitializeParams(capabilities=caps, client_info=types.ClientInfo(name=name),
                                  initialization_options=options)


@pytest_asyncio.fixture
async def start(daemon: Daemon) -> AsyncIterator[Starter]:
    clients: list[LanguageClient] = []

    async def _start(*flags: str, **init: Any) -> tuple[LanguageClient, list[dict[str, Any]]]:
        client, statuses = await start_lsp([*QUICK, *flags], lsp_env(daemon.state_dir))
        clients.append(client)
        await client.initialize_session(init_params(**init))
        await wait_for(lambda: last_state(statuses) == "ready", 30, f"sol/status ready; got {statuses}")
        return client, statuses

    yield _start
    for client in clients:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
        with contextlib.suppress(Exception):
            await client.stop()


async def metric(daemon: Daemon, name: str) -> float:
    return await asyncio.to_thread(daemon.metric, name)


async def requests(daemon: Daemon, kind: str) -> float:
    """``sol_requests_total`` of ``kind`` over every outcome."""
    _, body = await asyncio.to_thread(daemon.http_get, "/metrics")
    head = f'sol_requests_total{{kind="{kind}"'
    return sum(float(line.rpartition(" ")[2]) for line in body.decode().splitlines() if line.startswith(head))


async def wait_metric(daemon: Daemon, name: str, at_least: float, timeout: float = 15.0) -> float:
    deadline = time.monotonic() + timeout
    while (seen := await metric(daemon, name)) < at_least:
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} stayed at {seen}, wanted >= {at_least}")
        await asyncio.sleep(0.1)
    return seen


async def inline(client: LanguageClient, uri: str, line: int, col: int, *, invoked: bool = True
                 ) -> list[types.InlineCompletionItem]:
    result = await asyncio.wait_for(client.text_document_inline_completion_async(
        inline_params(uri, line, col, invoked=invoked)), 60)
    assert result is None or isinstance(result, types.InlineCompletionList)
    return list(result.items) if result else []


# --------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_events_under_every_name_reach_metrics_with_the_accept_rate(start: Starter, daemon: Daemon) -> None:
    client, _ = await start()
    uri = "file:///w/events.py"
    open_doc(client, uri, PREFIX + "\n")
    items = await inline(client, uri, 1, 11)
    assert items and items[0].command is not None
    wire = client.protocol._converter.unstructure(items[0])
    kinds = ("shown", "partial", "rejected", "accepted")
    before = {k: await metric(daemon, f'sol_completion_events_total{{kind="{k}"}}') for k in kinds}
    chars_before = await metric(daemon, "sol_accepted_chars_total")
    # What VS Code (through vscode-languageclient) and Copilot-style clients send.
    client.protocol.notify("textDocument/didShowCompletion", {"item": wire})
    client.protocol.notify("textDocument/didShowCompletion", {"item": wire})
    # acceptedLength counts from the item's range start (the line start), as copilot.vim does
    prefix_chars = items[0].command.arguments[2]
    client.protocol.notify("textDocument/didPartiallyAcceptCompletion",
                           {"item": wire, "acceptedLength": prefix_chars + 5})
    client.protocol.notify("sol/didRejectCompletion", {"item": wire})
    await client.workspace_execute_command_async(types.ExecuteCommandParams(
        command=items[0].command.command, arguments=items[0].command.arguments))
    await wait_metric(daemon, 'sol_completion_events_total{kind="shown"}', before["shown"] + 2)
    for kind in ("partial", "rejected", "accepted"):
        await wait_metric(daemon, f'sol_completion_events_total{{kind="{kind}"}}', before[kind] + 1)
    assert await metric(daemon, "sol_accepted_chars_total") == chars_before + 5
    shown = await metric(daemon, 'sol_completion_events_total{kind="shown"}')
    accepted = await metric(daemon, 'sol_completion_events_total{kind="accepted"}')
    assert await metric(daemon, "sol_accept_rate") == pytest.approx(accepted / shown)
    events = (await asyncio.to_thread(daemon.health))["events"]
    assert events["shown"] == shown and events["rejected"] >= 1
    assert events["accept_rate"] == pytest.approx(accepted / shown, abs=1e-4)


@pytest.mark.asyncio
async def test_invoked_gets_distinct_alternatives_greedy_first(start: Starter, daemon: Daemon) -> None:
    client, statuses = await start()
    uri = "file:///w/alternatives.py"
    open_doc(client, uri, PREFIX + "\n")
    automatic = await inline(client, uri, 1, 11, invoked=False)
    requests_before = await requests(daemon, "complete")
    invoked = await inline(client, uri, 1, 11)
    assert len(automatic) == 1 and 1 <= len(invoked) <= 3
    texts = [item.insert_text for item in invoked]
    assert len(set(texts)) == len(texts)                        # distinct
    assert texts[0] == automatic[0].insert_text                  # the greedy one first
    # Two daemon requests: the greedy one and one with n sampled candidates.
    assert await requests(daemon, "complete") == requests_before + 2
    ids = [str(item.command.arguments[0]) for item in invoked if item.command and item.command.arguments]
    assert ids[0].startswith("c") and all(i.startswith("a") for i in ids[1:]), ids
    # Latency in sol/status, after completions ran on the daemon.
    await wait_for(lambda: statuses[-1].get("lastMs") is not None, 5, f"latency in sol/status: {statuses[-1]}")
    assert statuses[-1]["medianMs"] > 0


@pytest.mark.asyncio
async def test_configuration_changes_apply_without_a_restart(start: Starter, daemon: Daemon) -> None:
    client, _ = await start()                         # inline client: no plain items by default
    uri = "file:///w/config.py"
    open_doc(client, uri, PREFIX + "\n")
    params = types.CompletionParams(types.TextDocumentIdentifier(uri), types.Position(1, 11),
                                    context=types.CompletionContext(types.CompletionTriggerKind.Invoked))
    plain = await asyncio.wait_for(client.text_document_completion_async(params), 60)
    assert isinstance(plain, types.CompletionList) and not plain.items
    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"soldaemon": {"completionItems": "always", "alternatives": 1}}))
    plain = await asyncio.wait_for(client.text_document_completion_async(params), 60)
    assert isinstance(plain, types.CompletionList) and len(plain.items) == 1

    client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
        settings={"soldaemon": {"debounceMs": "soon", "completionItems": "never"}}))
    await wait_for(lambda: bool(client.messages), 10, "a window/showMessage for the invalid value")
    assert "debounceMs" in client.messages[-1].message
    plain = await asyncio.wait_for(client.text_document_completion_async(params), 60)
    assert isinstance(plain, types.CompletionList) and len(plain.items) == 1   # the old settings stay


@pytest.mark.asyncio
async def test_a_client_that_asks_for_inline_gets_no_plain_items_too(start: Starter, daemon: Daemon) -> None:
    # lsp-mode: clientInfo "emacs", "inlineCompletion": null, yet it asks for inline items
    # once lsp-inline-completion-mode is on.
    client, _ = await start(inline=False, name="emacs")
    uri = "file:///w/lsp-mode.py"
    open_doc(client, uri, PREFIX + "\n")
    params = types.CompletionParams(types.TextDocumentIdentifier(uri), types.Position(1, 11),
                                    context=types.CompletionContext(types.CompletionTriggerKind.Invoked))
    plain = await asyncio.wait_for(client.text_document_completion_async(params), 60)
    assert isinstance(plain, types.CompletionList) and plain.items          # plain items at first
    assert await inline(client, uri, 1, 11)
    plain = await asyncio.wait_for(client.text_document_completion_async(params), 60)
    assert isinstance(plain, types.CompletionList) and not plain.items      # one kind only from now on


@pytest.mark.asyncio
async def test_two_windows_start_one_shared_detached_daemon(tmp_path: Path, engine_args: list[str]) -> None:
    config = write_config(tmp_path / "sol_config.yaml")
    starts = tmp_path / "starts.log"
    serve = (f"{shlex.quote(sys.executable)} -m soldaemon.cli --config {shlex.quote(str(config))} serve "
             f"{' '.join(shlex.quote(a) for a in engine_args)} --port 0 --idle-exit-s 3")
    command = f"sh -c {shlex.quote(f'echo started >> {shlex.quote(str(starts))}; exec {serve}')}"
    state = tmp_path / "state"
    env = lsp_env(state)
    clients: list[tuple[LanguageClient, list[dict[str, Any]]]] = []
    try:
        for _ in range(2):      # at once: neither waits for the other
            clients.append(await start_lsp(["--start-daemon", "--daemon-command", command, "--config", str(config),
                                            "--backoff-initial-ms", "100", "--backoff-max-ms", "300"], env))
        await asyncio.gather(*(c.initialize_session(init_params(progress=True)) for c, _ in clients))
        for c, _ in clients:     # a completion in each window: the first that needs the daemon starts it
            open_doc(c, "file:///w/two.py", "x = 1\n")
        await asyncio.gather(*(c.text_document_inline_completion_async(inline_params("file:///w/two.py", 1, 0))
                               for c, _ in clients))
        for _, statuses in clients:
            def ready(s: list[dict[str, Any]] = statuses) -> bool:
                return last_state(s) == "ready"
            await wait_for(ready, 120, f"ready; got {statuses}")
        assert starts.read_text().count("started") == 1             # one daemon for both
        # $/progress while it started: begin ... end, on the window that started it at least.
        reports = [r for c, _ in clients for r in c.progress_reports.values()]
        assert reports and any(isinstance(r[0], types.WorkDoneProgressBegin)
                               and isinstance(r[-1], types.WorkDoneProgressEnd) for r in reports), reports
        pid = int(json.loads((state / "daemon.json").read_text())["pid"])
    finally:
        for client, _ in clients:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(client.shutdown_session(), 15)
            with contextlib.suppress(Exception):
                await client.stop()
    # Both windows are gone; the daemon lives on (its own session), then idles out.
    assert pid_exists(pid)
    deadline = time.monotonic() + 30
    while pid_exists(pid) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    try:
        assert not pid_exists(pid), "the daemon did not exit after --idle-exit-s without connections"
        assert not (state / "daemon.json").exists()
    finally:
        with contextlib.suppress(OSError):
            os.kill(pid, 15)


@pytest.mark.asyncio
async def test_progress_follows_the_model_load(tmp_path: Path) -> None:
    """sol-lsp reaches the daemon while it loads its model (the scripted
    engine, 3 s): the progress bar says so, and ends when it is ready."""
    import socket

    with socket.socket() as probe:          # a port known before the daemon is ready
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = write_config(tmp_path / "sol_config.yaml")
    command = (f"{sys.executable} -m soldaemon.cli --config {config} serve --engine {FAKE_ENGINE} "
               f"--port {port} --idle-exit-s 5")
    state = tmp_path / "state"
    client, statuses = await start_lsp(
        ["--start-daemon", "--daemon-command", command, "--config", str(config), "--url", f"ws://127.0.0.1:{port}",
         "--backoff-initial-ms", "100", "--backoff-max-ms", "200"], lsp_env(state, {"SOL_FAKE_LOAD_S": "3"}))
    try:
        await client.initialize_session(init_params(progress=True))
        open_doc(client, "file:///w/progress.py", "x = 1\n")     # the first completion starts the daemon
        await client.text_document_inline_completion_async(inline_params("file:///w/progress.py", 1, 0))
        await wait_for(lambda: last_state(statuses) == "ready", 60, f"ready; got {statuses}")
        messages = [getattr(v, "message", "") or "" for r in client.progress_reports.values() for v in r]
        assert any("loading its model" in m for m in messages), client.progress_reports
        assert all(isinstance(r[-1], types.WorkDoneProgressEnd) for r in client.progress_reports.values())
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
        with contextlib.suppress(Exception):
            await client.stop()
        record = state / "daemon.json"
        with contextlib.suppress(OSError, ValueError, KeyError):
            os.kill(int(json.loads(record.read_text())["pid"]), 15)
