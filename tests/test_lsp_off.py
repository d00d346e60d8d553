"""Off means off, and the daemon is started when an enabled document opens:
a real ``sol-lsp`` (pytest-lsp client) and a real ``soldaemon serve`` (the
scripted engine, which records every request that reaches it)."""

from __future__ import annotations

import asyncio
import json
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types

from tests.fixtures.daemon import FAKE_ENGINE, Daemon
from tests.fixtures.lsp_harness import initialize, inline_params, lsp_env, open_doc, start_lsp, wait_for

TEXT = "def add(a, b):\n    return \n"


def reached(record: Path) -> list[str]:
    """URIs of every warm and complete that reached the engine, in order."""
    if not record.exists():
        return []
    return [json.loads(line)["uri"] for line in record.read_text().splitlines() if line.strip()]


def edit(client: Any, uri: str, version: int, text: str = "x") -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        [types.TextDocumentContentChangePartial(
            range=types.Range(types.Position(1, 11), types.Position(1, 11)), text=text)]))


@pytest.mark.asyncio
async def test_no_warm_or_complete_reaches_the_daemon_for_a_disabled_language(
        start_daemon: Any, tmp_path: Path) -> None:
    record = tmp_path / "reached.jsonl"
    daemon: Daemon = start_daemon(args=["--engine", FAKE_ENGINE], env={"SOL_FAKE_RECORD": str(record)})
    client, _ = await start_lsp(["--no-start-daemon", "--debounce-ms", "0", "--warm-delay-ms", "50",
                                 "--alternatives", "1"], lsp_env(daemon.state_dir))
    try:
        await initialize(client, options={"languages": {"*": True, "markdown": False}})
        await wait_for(lambda: "state: ready" in daemon.stderr(), 30, "the daemon")
        off, on = "file:///w/notes.md", "file:///w/code.py"
        open_doc(client, off, TEXT, language="markdown")
        open_doc(client, on, TEXT, language="python")
        await asyncio.sleep(0.5)                                  # connected by now
        edit(client, off, 2)
        await asyncio.sleep(0.4)                                  # well past the warm delay
        result = await client.text_document_inline_completion_async(inline_params(off, 1, 12))
        assert result is None or not result.items
        # the control: the same steps in an enabled language do reach it (so the test can fail)
        edit(client, on, 2)
        await wait_for(lambda: on in reached(record), 20, "the warm of the enabled document")
        result = await client.text_document_inline_completion_async(inline_params(on, 1, 12))
        assert result is not None and result.items
        # completions switched off altogether, at run time (workspace/didChangeConfiguration)
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={"soldaemon": {"enable": False}}))
        count = len(reached(record))
        edit(client, on, 3, "y")
        await asyncio.sleep(0.4)
        result = await client.text_document_inline_completion_async(inline_params(on, 1, 13))
        assert result is None or not result.items
        await asyncio.sleep(0.2)
        assert len(reached(record)) == count, reached(record)[count:]
        assert off not in reached(record), reached(record)
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_the_daemon_is_started_by_the_first_enabled_document_not_the_window(tmp_path: Path) -> None:
    """The "daemon" here is a script that leaves a marker: what matters is
    when sol-lsp runs the command (the first enabled document opening, so
    that the first pause gets a suggestion), and that a disabled language
    never does."""
    marker = tmp_path / "started"
    state = tmp_path / "state"
    command = shlex.join([sys.executable, "-c", f"open({str(marker)!r}, 'w').close()"])
    client, _ = await start_lsp(["--start-daemon", "--daemon-command", command,
                                 "--debounce-ms", "0", "--warm-delay-ms", "50", "--backoff-initial-ms", "50",
                                 "--backoff-max-ms", "200"], lsp_env(state))
    try:
        await initialize(client, options={"languages": {"markdown": False}})
        md = "file:///w/notes.md"
        open_doc(client, md, TEXT, language="markdown")
        edit(client, md, 2)
        await client.text_document_inline_completion_async(inline_params(md, 1, 12))
        await asyncio.sleep(1.5)                                  # several connection attempts
        assert not marker.exists(), "a daemon was started for a window with nothing to complete"
        py = "file:///w/code.py"
        open_doc(client, py, TEXT, language="python")
        await wait_for(marker.exists, 10, "the daemon command after the enabled document opened")
        # that "daemon" exits at once: a request waiting for it ends (empty) instead of hanging
        result = await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(py, 1, 11)), 20)
        assert result is None or not result.items
    finally:
        await client.shutdown_session()


@pytest.mark.asyncio
async def test_sol_status_only_to_a_client_that_declares_it(start_daemon: Any) -> None:
    daemon: Daemon = start_daemon(args=["--engine", FAKE_ENGINE])
    quiet, quiet_statuses = await start_lsp(["--no-start-daemon"], lsp_env(daemon.state_dir))
    told, told_statuses = await start_lsp(["--no-start-daemon"], lsp_env(daemon.state_dir))
    try:
        await initialize(quiet, status=False)                   # e.g. lsp-mode: warns on unknown methods
        await initialize(told, status=True)
        await wait_for(lambda: any(s["state"] == "ready" for s in told_statuses), 30, "ready on the declaring client")
        await asyncio.sleep(0.3)
        assert quiet_statuses == []
    finally:
        await quiet.shutdown_session()
        await told.shutdown_session()


@pytest.mark.asyncio
async def test_a_failure_asks_with_actions_and_opens_the_daemon_log(tmp_path: Path) -> None:
    """No daemon, none to start: after failureMessageAfterS one
    window/showMessageRequest with the actions; "Open daemon log" answers
    with window/showDocument of daemon.log in the state directory."""
    state = tmp_path / "state"
    client, _ = await start_lsp(["--no-start-daemon", "--failure-message-after-s", "0",
                                 "--url", "ws://127.0.0.1:9", "--backoff-max-ms", "200"], lsp_env(state))
    client.answer_with = "Open daemon log"  # type: ignore[attr-defined]
    try:
        caps = types.ClientCapabilities(window=types.WindowClientCapabilities(
            show_document=types.ShowDocumentClientCapabilities(support=True)))
        await client.initialize_session(types.InitializeParams(capabilities=caps))
        await wait_for(lambda: bool(client.shown_documents), 20, "window/showDocument after the action")
        asked = [m for m in client.messages if isinstance(m, types.ShowMessageRequestParams)]
        assert len(asked) == 1 and [a.title for a in asked[0].actions or []] == \
            ["Open daemon log", "Run soldaemon doctor"]
        assert "unavailable" in asked[0].message
        assert client.shown_documents[0].uri == (state / "daemon.log").as_uri()
    finally:
        await client.shutdown_session()
