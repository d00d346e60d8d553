"""Inline items as each editor draws them, and what their events count.

Neovim 0.12 (``runtime/lua/vim/lsp/inline_completion.lua``) draws an item
as an *overlay*: it skips the longest common prefix of the buffer line
(from the range start) and the item's first line, and paints the rest over
the buffer from there. VS Code shows the difference between the replaced
range and ``insertText`` as ghost text. Both read right only when the item
is the whole line as it will be after accepting: the range runs to the end
of the line and ``insertText`` carries the text after the cursor.
``neovim_overlay`` below is that documented rule, written out; the real
Neovim 0.7 of Debian has no inline completion (tests/test_lsp_editor_docs.py
runs it on plain completion)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from lsprotocol import types

from lsp.completer import Suggestion
from lsp.events import to_event
from lsp.server import SolLanguageServer
from lsp.settings import Settings
from soldaemon.server.metrics import Metrics

REPO = Path(__file__).resolve().parents[1]


def neovim_overlay(line: str, item: types.InlineCompletionItem, cursor: int) -> str:
    """What Neovim 0.12 shows on the cursor's line for ``item``: the
    item's first line, less its common prefix with the buffer from the
    range start, painted over the buffer (``virt_text_pos = 'overlay'``)."""
    start = item.range.start.character if item.range is not None else cursor
    first = str(item.insert_text).split("\n", 1)[0]
    tail = line[start:]
    skip = 0
    while skip < min(len(tail), len(first)) and tail[skip] == first[skip]:
        skip += 1
    text, col = first[skip:], start + skip
    return line[:col] + text + line[col + len(text):]


def accepted_line(line: str, item: types.InlineCompletionItem, cursor: int) -> str:
    """The line after accepting (single-line items): the range replaced."""
    if item.range is None:
        return line[:cursor] + str(item.insert_text) + line[cursor:]
    return line[:item.range.start.character] + str(item.insert_text) + line[item.range.end.character:]


def items_for(line: str, cursor: int, completion: str) -> list[types.InlineCompletionItem]:
    server = SolLanguageServer(Settings())
    s = Suggestion("c1", (completion,), (0,), line[:cursor], line_suffix=line[cursor:])
    return server.inline_items(s, types.Position(0, cursor))


@pytest.mark.parametrize("line, cursor, completion", [
    ("    result = compute()", len("    result = compute("), "data, 3"),                 # inside brackets
    ("print()  # a long comment after the cursor", len("print("), "x"),              # completion shorter
    ("    return ", len("    return "), "a + b"),                                    # at the line end
])
def test_neovim_0_12_paints_the_line_as_it_will_read(line: str, cursor: int, completion: str) -> None:
    (item,) = items_for(line, cursor, completion)
    assert item.range == types.Range(types.Position(0, 0), types.Position(0, len(line)))
    want = line[:cursor] + completion + line[cursor:]
    assert accepted_line(line, item, cursor) == want
    assert neovim_overlay(line, item, cursor) == want     # no text after the cursor painted over


def test_the_item_carries_the_characters_before_the_cursor() -> None:
    (item,) = items_for("x = f()", 6, "1")
    assert item.command is not None and item.command.arguments == ["c1", 0, 6]


def test_accepted_length_counts_from_the_range_start_as_copilot_vim_does() -> None:
    """copilot.vim (and VS Code) count acceptedLength from the item's range
    start; sol-lsp's range starts at column 0, so the line prefix is taken
    off before the daemon counts characters."""
    (item,) = items_for("    total = ", 12, "a + b")
    wire = {"insertText": item.insert_text, "command": {"title": "t", "command": "sol.accepted",
                                                       "arguments": item.command.arguments}}  # type: ignore[union-attr]
    event = to_event("partial", {"item": wire, "acceptedLength": 12 + 3})
    assert event is not None and event.accepted_chars == 3
    assert to_event("partial", {"item": wire, "acceptedLength": 5}).accepted_chars == 0  # type: ignore[union-attr]


def test_accept_rate_is_exported_only_once_a_shown_event_exists() -> None:
    metrics = Metrics(lambda: {})
    metrics.record_event("accepted")
    text = metrics.render()[0].decode()
    assert 'sol_completion_events_total{kind="accepted"} 1.0' in text
    assert "sol_accept_rate " not in text          # no client reported "shown": no ratio, not 0
    assert metrics.event_counts()["accept_rate"] is None
    metrics.record_event("shown")
    metrics.record_event("shown")
    assert "sol_accept_rate 0.5" in metrics.render()[0].decode()


def test_one_debounce_default_for_the_extension_and_sol_lsp() -> None:
    package = json.loads((REPO / "vscode-extension" / "package.json").read_text())
    default = package["contributes"]["configuration"]["properties"]["soldaemon.debounceMs"]["default"]
    assert default == Settings().debounce_ms


def test_languages_and_enable() -> None:
    s, _ = Settings().with_options({"languages": {"*": True, "markdown": False}})
    assert s.language_enabled("python") and not s.language_enabled("markdown")
    off, _ = s.with_options({"enable": False})
    assert not off.language_enabled("python")
    from lsp.settings import SettingsError, parse_args

    assert not parse_args(["--languages", "*=false,go=true"]).settings.language_enabled("python")
    with pytest.raises(SettingsError, match="languages.go"):
        Settings().with_options({"languages": {"go": "maybe"}})
