"""The same typing session through VS Code's path and Neovim's path gets the
same completions (issue 19's trace).

VS Code reaches sol-lsp through vscode-languageclient: an inline-completion
client that sends the extension's initializationOptions
(vscode-extension/src/settings.ts ``serverOptions`` with the package's
defaults) and asks with the Automatic trigger while typing. Neovim 0.7's
built-in client asks for plain completion items with no options. Each path
gets its own fresh daemon on the same tiny model (so neither answers from the
other's memory); both open the same other file (the context ring) and type
the same lines key by key, waiting for each answer. The completion text at
every keystroke must be the same: one client brain, one set of context
rules. Run with ``-s`` to see the trace.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Iterator

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from tests.fixtures.daemon import Daemon, spawn
from tests.fixtures.lsp_harness import capabilities, last_state, lsp_env, open_doc, start_lsp, wait_for

OTHER = ("file:///w/geometry.py", "def area(width, height):\n    return width * height\n\n\n"
         "def perimeter(width, height):\n    return 2 * (width + height)\n")
DOC = "file:///w/shapes.py"
HEAD = "from geometry import area, perimeter\n\n\ndef describe(w, h):\n"
TYPED = ["    a = area(w, h)", "    p = perimeter(w, h)", "    return "]
FLAGS = ["--no-start-daemon", "--timeout-ms", "60000", "--max-tokens", "12", "--debounce-ms", "0", "--no-warm",
         "--alternatives", "1"]
# What the VS Code extension sends by default (package.json defaults through serverOptions).
VSCODE_OPTIONS = {"startTimeoutS": 180, "debounceMs": 75, "maxLines": 8, "slowMs": 500, "budgetMs": None}


@pytest.fixture
def daemons(tmp_path_factory: pytest.TempPathFactory, engine_args: list[str]) -> Iterator[tuple[Daemon, Daemon]]:
    # One kernel plan for both: each fresh daemon times the kernels itself, and
    # two timings under different load may choose different plans, whose
    # numerics differ on random weights -- that would test the machine.
    started = [spawn(tmp_path_factory.mktemp(f"path-{i}"), args=[*engine_args, "--port", "0"],
                     server={"rate_limit_per_s": 10_000}, extra_config={"model": {"precision": "float32"}})
               for i in range(2)]
    assert all(isinstance(d, Daemon) for d in started)
    yield started[0], started[1]  # type: ignore[return-value]
    for d in started:
        assert isinstance(d, Daemon)
        d.stop()


def _change(client: LanguageClient, version: int, line: int, col: int, text: str) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri=DOC, version=version),
        [types.TextDocumentContentChangePartial(range=types.Range(types.Position(line, col), types.Position(line, col)),
                                                text=text)]))


async def _ask(client: LanguageClient, inline: bool, line: int, col: int, line_text: str) -> str:
    """The completion text at the cursor, as this editor would insert it."""
    pos = types.Position(line, col)
    if inline:
        result = await asyncio.wait_for(client.text_document_inline_completion_async(types.InlineCompletionParams(
            context=types.InlineCompletionContext(trigger_kind=types.InlineCompletionTriggerKind.Automatic),
            text_document=types.TextDocumentIdentifier(DOC), position=pos)), 60)
        items = list(result.items) if isinstance(result, types.InlineCompletionList) else list(result or [])
        if not items:
            return ""
        text = items[0].insert_text
        assert isinstance(text, str)
        # the item replaces from the start of the line: what follows the typed text is the completion
        return text[len(line_text):] if items[0].range is not None else text
    plain = await asyncio.wait_for(client.text_document_completion_async(types.CompletionParams(
        types.TextDocumentIdentifier(DOC), pos,
        context=types.CompletionContext(types.CompletionTriggerKind.Invoked))), 60)
    items = plain.items if isinstance(plain, types.CompletionList) else list(plain or [])
    if not items:
        return ""
    edit = items[0].text_edit
    assert isinstance(edit, types.TextEdit)
    word = edit.range.end.character - edit.range.start.character
    return edit.new_text[word:]


async def _session(daemon: Daemon, *, inline: bool) -> list[tuple[str, str]]:
    client, statuses = await start_lsp(FLAGS, lsp_env(daemon.state_dir))
    try:
        await client.initialize_session(types.InitializeParams(
            capabilities=capabilities(inline=inline),
            client_info=types.ClientInfo(name="Visual Studio Code" if inline else "Neovim"),
            initialization_options=VSCODE_OPTIONS if inline else None))
        await wait_for(lambda: last_state(statuses) == "ready", 30, f"sol/status ready; got {statuses}")
        open_doc(client, OTHER[0], OTHER[1])
        open_doc(client, DOC, HEAD + "\n")
        trace: list[tuple[str, str]] = []
        version, line = 1, HEAD.count("\n")
        for i, typed in enumerate(TYPED):
            if i:
                version += 1
                _change(client, version, line, len(TYPED[i - 1]), "\n")
                line += 1
            for col, ch in enumerate(typed):
                version += 1
                _change(client, version, line, col, ch)
                trace.append((typed[: col + 1], await _ask(client, inline, line, col + 1, typed[: col + 1])))
        return trace
    finally:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(client.shutdown_session(), 15)
        with contextlib.suppress(Exception):
            await client.stop()


@pytest.mark.asyncio
async def test_vscode_and_neovim_paths_get_the_same_completions(daemons: tuple[Daemon, Daemon]) -> None:
    vscode, neovim = await asyncio.gather(_session(daemons[0], inline=True), _session(daemons[1], inline=False))
    width = max(len(t) for t, _ in vscode)
    print(f"\n{'typed':<{width}}  VS Code path | Neovim path")
    for (typed, a), (_, b) in zip(vscode, neovim):
        print(f"{typed:<{width}}  {a!r} | {b!r}{'' if a == b else '   <- differs'}")
    assert len(vscode) == len(neovim) == sum(len(t) for t in TYPED)
    same = sum(a == b for (_, a), (_, b) in zip(vscode, neovim))
    print(f"{same}/{len(vscode)} keystrokes identical")
    assert any(a for _, a in vscode), "no completion at all: the trace shows nothing"
    assert [a for _, a in vscode] == [b for _, b in neovim]
