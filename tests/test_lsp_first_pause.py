"""The first hour on a laptop (issue 58): a real ``sol-lsp`` over stdio with
no daemon running.

- The daemon starts when the first enabled document opens; the first
  inline request waits for it (within its cancellation) and gets an item,
  with "starting…" and the stage the daemon prints in ``sol/status``; the
  daemon prints its first-start work (here: the kernel timing of the tiny
  model); a disabled language starts nothing.
- A plain completion (eglot and lsp-mode ask synchronously and give up
  after 10 s) waits only a few seconds for a starting daemon, then gets an
  empty incomplete list, and items once the daemon is ready.
- A daemon sol-lsp starts listens on a free port when the configured one is
  held, and its record says where (sol-lsp finds it there).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import signal
import socket
import sys
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from lsp.server import PLAIN_START_WAIT_S

from tests.fixtures.daemon import FAKE_ENGINE, write_config
from tests.fixtures.lsp_harness import initialize, inline_params, lsp_env, open_doc, start_lsp, wait_for

TEXT = "def add(a, b):\n    return \n"
QUICK = ["--start-daemon", "--debounce-ms", "0", "--backoff-initial-ms", "100", "--backoff-max-ms", "400",
         "--timeout-ms", "60000", "--max-tokens", "16", "--alternatives", "1", "--warm-delay-ms", "60000"]


def serve_command(config: Path, *args: str) -> str:
    return shlex.join([sys.executable, "-m", "soldaemon.cli", "--config", str(config), "serve", *args])


async def stop_all(client: LanguageClient | None, state: Path) -> None:
    """sol-lsp first (or it would start the daemon again), then the
    detached daemon it started (found through its record)."""
    if client is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
    record = state / "daemon.json"
    if not (state / "daemon.out").exists():
        return                                      # none was started
    for _ in range(300):                            # a daemon still starting writes it when ready
        if record.exists():
            break
        await asyncio.sleep(0.1)
    with contextlib.suppress(OSError, ValueError, KeyError):
        os.kill(int(json.loads(record.read_text())["pid"]), signal.SIGTERM)
        for _ in range(100):
            if not record.exists():
                break
            await asyncio.sleep(0.1)


@pytest.mark.asyncio
async def test_the_first_inline_request_after_open_waits_for_the_daemon(engine_args: list[str],
                                                                         tmp_path: Path) -> None:
    config = write_config(tmp_path / "sol_config.yaml")
    state = tmp_path / "state"
    # a cache of its own: the kernel timing (first-start work) runs, and shows
    env = lsp_env(state, {"SOLDAEMON_CACHE_DIR": str(tmp_path / "cache")})
    client: LanguageClient | None = None
    try:
        # the tiny model's first-start work lasts less than sol-lsp's 0.5 s poll on a fast
        # machine, so a stage of known length goes first (printed the way the daemon prints
        # its stages), then the real daemon starts in the same process
        client, statuses = await start_lsp([*QUICK, "--daemon-command",
                                            slow_start(config, 2, *engine_args, "--port", "0")], env)
        await initialize(client, options={"languages": {"markdown": False}})
        md = "file:///w/notes.md"
        open_doc(client, md, TEXT, language="markdown")
        result = await client.text_document_inline_completion_async(inline_params(md, 1, 11))
        assert result is None or not result.items
        await asyncio.sleep(1.0)                                    # several connection attempts
        assert not (state / "daemon.out").exists(), "a daemon was started for a disabled language"

        py = "file:///w/code.py"
        open_doc(client, py, TEXT)
        result = await asyncio.wait_for(
            client.text_document_inline_completion_async(inline_params(py, 1, 11)), 240)
        assert result is not None and result.items, f"the first request came back empty; statuses {statuses}"
        messages = [s.get("message", "") for s in statuses]
        assert any("starting" in m for m in messages), messages
        assert any("a stage that lasts 2 s" in m for m in messages), messages     # the stage shown
        out = (state / "daemon.out").read_text()
        assert "soldaemon: measuring the linear kernels" in out, out            # the real first-start work
        assert statuses[-1]["state"] == "ready"
    finally:
        await stop_all(client, state)


def slow_start(config: Path, seconds: int, *args: str) -> str:
    """A daemon command whose start lasts at least ``seconds`` (a stage printed as the daemon prints its own)."""
    return shlex.join(["sh", "-c", f"echo 'soldaemon: a stage that lasts {seconds} s'; sleep {seconds}; exec \"$@\"",
                       "sh", sys.executable, "-m", "soldaemon.cli", "--config", str(config), "serve", *args])


@pytest.mark.asyncio
async def test_a_plain_completion_does_not_wait_out_a_synchronous_clients_timeout(tmp_path: Path) -> None:
    config = write_config(tmp_path / "sol_config.yaml")
    state = tmp_path / "state"
    client: LanguageClient | None = None
    try:
        client, statuses = await start_lsp(
            [*QUICK, "--daemon-command", slow_start(config, 8, "--engine", FAKE_ENGINE, "--port", "0")],
            lsp_env(state))
        await initialize(client, inline=False)                  # a client with plain completion only (eglot)
        uri = "file:///w/code.py"
        open_doc(client, uri, TEXT)
        params = types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                        position=types.Position(line=1, character=11))
        t0 = asyncio.get_running_loop().time()
        first = await asyncio.wait_for(client.text_document_completion_async(params), 30)
        waited = asyncio.get_running_loop().time() - t0
        assert isinstance(first, types.CompletionList) and first.is_incomplete and not first.items, first
        assert PLAIN_START_WAIT_S - 0.5 <= waited < 9, f"answered after {waited:.1f} s"    # not after the start
        assert any("a stage that lasts 8 s" in s.get("message", "") for s in statuses), statuses
        items: list[types.CompletionItem] = []
        for _ in range(60):                                     # the user goes on typing: asked again
            again = await asyncio.wait_for(client.text_document_completion_async(params), 30)
            assert isinstance(again, types.CompletionList)
            if again.items:
                items = again.items
                break
            await asyncio.sleep(0.5)
        assert items, f"no items once the daemon was ready; statuses {statuses}"
    finally:
        await stop_all(client, state)


@pytest.mark.asyncio
async def test_a_started_daemon_takes_a_free_port_when_the_configured_one_is_held(tmp_path: Path) -> None:
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    held = holder.getsockname()[1]
    config = write_config(tmp_path / "sol_config.yaml", server={"port": held})
    state = tmp_path / "state"
    client: LanguageClient | None = None
    try:
        client, statuses = await start_lsp(
            [*QUICK, "--daemon-command", serve_command(config, "--engine", FAKE_ENGINE)], lsp_env(state))
        await initialize(client)
        uri = "file:///w/code.py"
        open_doc(client, uri, TEXT)
        result = await asyncio.wait_for(
            client.text_document_inline_completion_async(inline_params(uri, 1, 11)), 60)
        assert result is not None and result.items, f"no completion; statuses {statuses}"
        url = json.loads((state / "daemon.json").read_text())["url"]
        assert url.startswith("ws://127.0.0.1:") and not url.rstrip("/").endswith(f":{held}"), url
        await wait_for(lambda: statuses[-1]["url"] == url, 5, "the status to name the daemon's real address")
    finally:
        await stop_all(client, state)
        holder.close()

