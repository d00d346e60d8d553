"""The first hour on a laptop (issue 58): a real ``sol-lsp`` over stdio with
no daemon running.

- The daemon starts when the first enabled document opens; the first
  inline request waits for it (within its cancellation) and gets an item,
  with "starting…" and the stage the daemon prints in ``sol/status``; the
  daemon prints its first-start work (here: the kernel timing of the tiny
  model); a disabled language starts nothing.
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
from pytest_lsp import LanguageClient

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
        stage = "soldaemon: a stage that lasts 2 s"
        command = shlex.join(["sh", "-c", f"echo '{stage}'; sleep 2; exec \"$@\"", "sh", sys.executable, "-m",
                              "soldaemon.cli", "--config", str(config), "serve", *engine_args, "--port", "0"])
        client, statuses = await start_lsp([*QUICK, "--daemon-command", command], env)
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

