"""sol-lsp's background warm hits: a real ``sol-lsp`` (pytest-lsp client)
and a real ``soldaemon serve`` on the tiny model. After an edit and a pause,
and after the cursor moved to another function and stayed, the daemon is
warmed with the request the next completion there sends, so that
completion computes none of its prompt, or only what was typed since. The
figures come from the daemon's request log (prompt and cached tokens)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import pytest
from lsprotocol import types

from tests.fixtures.daemon import Daemon
from tests.fixtures.lsp_harness import initialize, inline_params, lsp_env, open_doc, start_lsp, wait_for

TEXT = ("import os\n\n\ndef join_all(parts):\n    result = []\n    for part in parts:\n"
        "        result.append(part)\n    return result\n\n\ndef count(items):\n    total = 0\n"
        "    for item in items:\n        total += 1\n    return total\n")
LINE = re.compile(r"req conn=\d+ id=(\S+) kind=(\w+) outcome=(\w+) .* prompt_tokens=(\d+) cached=(\d+)")


def requests(daemon: Daemon, kind: str) -> list[tuple[str, int, int]]:
    """(id, prompt tokens, cached tokens) of every finished ``kind`` request, in order."""
    return [(m[1], int(m[4]), int(m[5])) for m in LINE.finditer(daemon.stderr()) if m[2] == kind]


@pytest.mark.asyncio
async def test_the_completion_after_a_warm_reuses_it(start_daemon: Any, engine_args: list[str]) -> None:
    daemon: Daemon = start_daemon(args=[*engine_args, "--port", "0"], server={"rate_limit_per_s": 10_000})
    # One daemon request per completion (no alternatives): the test counts them.
    client, _ = await start_lsp(["--no-start-daemon", "--alternatives", "1", "--timeout-ms", "60000",
                                 "--max-tokens", "8", "--debounce-ms", "0", "--warm-delay-ms", "100"],
                                lsp_env(daemon.state_dir))
    try:
        await initialize(client)
        uri = "file:///w/warm.py"
        open_doc(client, uri, TEXT)
        await wait_for(lambda: "state: ready" in daemon.stderr(), 30, "the daemon")

        # 1. An edit, then a pause: the spot is warmed; the completion asked there reuses all of it.
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=2),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(6, 27), types.Position(6, 27)), text="\n        n = ")]))
        await wait_for(lambda: len(requests(daemon, "warm")) >= 1, 30, "the warm after the edit", 0.05)
        await asyncio.wait_for(client.text_document_inline_completion_async(inline_params(uri, 7, 12)), 60)
        await wait_for(lambda: len(requests(daemon, "complete")) >= 1, 30, "the completion", 0.05)
        (_, w_prompt, _), = requests(daemon, "warm")
        (_, prompt, cached), = requests(daemon, "complete")
        print(f"\nafter an edit and a pause: warm {w_prompt} tokens; complete {prompt} tokens, {cached} cached")
        assert prompt == w_prompt and cached == prompt

        # 2. The cursor moves to another function and stays: warmed there; one character typed
        #    there, the completion computes only it.
        moved = await client.text_document_inline_completion_async(inline_params(uri, 13, 8, invoked=False))
        assert moved is None or not moved.items                   # a move alone asks nothing
        assert len(requests(daemon, "complete")) == 1
        await wait_for(lambda: len(requests(daemon, "warm")) >= 2, 30, "the warm after the move", 0.05)
        client.text_document_did_change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri=uri, version=3),
            [types.TextDocumentContentChangePartial(
                range=types.Range(types.Position(13, 8), types.Position(13, 8)), text="n")]))
        await asyncio.wait_for(client.text_document_inline_completion_async(
            inline_params(uri, 13, 9, invoked=False)), 60)
        await wait_for(lambda: len(requests(daemon, "complete")) >= 2, 30, "the completion after the move", 0.05)
        _, (_, m_prompt, m_cached) = requests(daemon, "complete")
        print(f"after a move and a pause, one character typed: {m_prompt - m_cached} of {m_prompt} tokens computed")
        assert m_prompt - m_cached <= 3
    finally:
        await client.shutdown_session()
