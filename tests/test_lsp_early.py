"""sol-lsp's early lines (``earlyLines``): a multi-line inline answer is
returned with its first whole lines while the daemon writes the rest, and the
rest follows (``sol/completionReady``, then the same place answered from it),
with a scripted daemon client that streams deltas."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from lsprotocol import types

from soldaemon.api import CompletionRequest, Delta, Done
from soldaemon.shown import early_text

from lsp.completer import Completer
from lsp.context import ContextRing
from lsp.settings import Settings
from tests.test_lsp_units import ScriptedClient, _store

P = types.Position
TEXT = "def f(xs):\n    total = 0\n    \n    return total\n"
CURSOR = P(2, 4)                 # the empty line of the body, after its indentation


@pytest.mark.parametrize("streamed, line_prefix, next_line, shown", [
    ("for x in xs:", "    ", None, None),                              # no whole line yet
    ("for x in xs:\n", "    ", None, None),                            # a bare block opener
    ("for x in xs:\n        total += x\n", "    ", None, "for x in xs:\n        total += x"),
    ("for x in xs:\n        total += x\n    ret", "    ", None, "for x in xs:\n        total += x"),
    ("total = sum(\n", "    ", None, None),                            # an open bracket
    ("total = (a +\n        b)\n", "    ", None, "total = (a +\n        b)"),
    ("total += 1\nreturn 2\n", "    ", None, "total += 1"),            # the next line leaves the block
    ("return total\n", "    ", "    return total", None),              # repeats the next line
    ("\n\n", "    ", None, None),                                      # nothing yet
    ("x = y\n", "", None, "x = y"),
])
def test_which_first_lines_may_show_early(streamed: str, line_prefix: str, next_line: str | None,
                                          shown: str | None) -> None:
    assert early_text(streamed, line_prefix, next_line) == shown


class StreamingClient(ScriptedClient):
    """Streams ``chunks`` as deltas, ``gap`` seconds apart, then answers
    ``done`` with ``final`` (default: the chunks joined)."""

    def __init__(self, chunks: list[str], gap: float = 0.05, final: str | None = None,
                 streamed: str | None = None) -> None:
        super().__init__()
        self.chunks, self.gap = chunks, gap
        self.final = "".join(chunks) if final is None else final
        self.streamed = streamed
        self.finished: list[str] = []

    async def complete(self, req: CompletionRequest, *, timeout_s: float | None = None,
                       on_delta: Any = None) -> Any:
        self.requests.append(req)
        self._in_flight.add(req.id)
        try:
            for chunk in self.chunks:
                await asyncio.sleep(self.gap)
                if req.id in self.cancelled:
                    return Done(req.id, (), "cancelled")
                if on_delta is not None:
                    on_delta(Delta(req.id, chunk))
            await asyncio.sleep(self.gap)
        finally:
            self._in_flight.discard(req.id)
        if req.id in self.cancelled:
            return Done(req.id, (), "cancelled")
        self.finished.append(req.id)
        return Done(req.id, (self.final,), "stop", streamed=self.streamed)


def _completer(client: ScriptedClient, **settings: Any) -> tuple[Completer, Any, list[str]]:
    store = _store(a=TEXT)
    completer = Completer(Settings(**{"warm": False, "alternatives": 1, "debounce_ms": 0, "early_lines": True,
                                      **settings}), store, ContextRing(), client)  # type: ignore[arg-type]
    ready: list[str] = []
    completer.on_rest_ready = ready.append
    return completer, store, ready


BLOCK = ["for x in xs:\n", "        total += x\n", "        if total > 9:\n", "            break"]


async def _early_then_typed(client: ScriptedClient, typed: str | None = None) -> tuple[Completer, list[str], str]:
    """An early answer at the cursor, then ``typed`` (default: all of it)
    inserted there, as the editor would; (completer, announced uris, early text)."""
    completer, store, ready = _completer(client)
    got = await completer.suggest("file:///a", CURSOR, automatic=True, early=True)
    assert got is not None
    early = got.items[0]
    store.change(types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(uri="file:///a", version=2), [
        types.TextDocumentContentChangePartial(range=types.Range(CURSOR, CURSOR),
                                               text=early if typed is None else typed)]))
    return completer, ready, early


@pytest.mark.asyncio
async def test_a_block_shows_its_first_lines_early_and_the_rest_follows() -> None:
    client = StreamingClient(BLOCK)
    completer, _, ready = _completer(client)
    got = await completer.suggest("file:///a", CURSOR, automatic=True, early=True)
    assert got is not None and got.items == ("for x in xs:\n        total += x",)
    assert not client.finished and not client.cancelled          # the daemon still writes the rest
    while not client.finished:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0)
    assert ready == ["file:///a"]
    # the editor asks again at the same place: the whole block, without the daemon
    again = await completer.suggest("file:///a", CURSOR, automatic=False, early=True)
    assert again is not None and again.cached and again.items == ("".join(BLOCK),)
    assert len(client.requests) == 1
    # once: a later request at the same place asks the daemon again
    assert await completer.suggest("file:///a", CURSOR, automatic=False, early=True) is not None
    assert len(client.requests) == 2


@pytest.mark.asyncio
async def test_typing_along_the_early_lines_keeps_the_rest_coming() -> None:
    client = StreamingClient(BLOCK, gap=0.05)
    completer, ready, _ = await _early_then_typed(client, "for")
    typed = await completer.suggest("file:///a", P(2, 7), automatic=True, early=True)
    assert typed is not None and typed.cached and typed.items == (" x in xs:\n        total += x",)
    assert client.cancelled == []                                # the rest was not stopped
    while not client.finished:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0)
    assert ready == ["file:///a"]
    more = await completer.suggest("file:///a", P(2, 7), automatic=True, early=True)
    assert more is not None and more.items == (" x in xs:\n        total += x\n        if total > 9:\n            break",)
    assert len(client.requests) == 1


@pytest.mark.asyncio
async def test_accepting_the_early_lines_waits_for_the_rest() -> None:
    client = StreamingClient(BLOCK, gap=0.05)
    completer, _, early = await _early_then_typed(client)
    assert early == "for x in xs:\n        total += x"
    after = await completer.suggest("file:///a", P(3, 18), automatic=True, early=True)
    assert after is not None and after.items == ("\n        if total > 9:\n            break",)
    assert len(client.requests) == 1 and client.cancelled == []


OTHER = "total = sum(xs)\n        if total > 9:\n            return 0"   # a candidate that starts otherwise


@pytest.mark.asyncio
async def test_a_candidate_shown_later_keeps_the_streamed_answer_as_second_item() -> None:
    client = StreamingClient(BLOCK, final=OTHER, streamed="".join(BLOCK))
    completer, _, ready = _completer(client)
    got = await completer.suggest("file:///a", CURSOR, automatic=True, early=True)
    assert got is not None and got.items == ("for x in xs:\n        total += x",)
    while not client.finished:
        await asyncio.sleep(0.02)
    await asyncio.sleep(0)
    assert ready == ["file:///a"]
    again = await completer.suggest("file:///a", CURSOR, automatic=True, early=True)
    assert again is not None and again.cached and again.items == (OTHER, "".join(BLOCK))
    assert again.indices == (0, 1) and len(client.requests) == 1


@pytest.mark.parametrize("streamed, asked", [("".join(BLOCK), 1), (None, 2)])
@pytest.mark.asyncio
async def test_accepting_early_lines_a_candidate_replaced_goes_on_from_them(streamed: str | None,
                                                                             asked: int) -> None:
    # with done.streamed the rest of the lines shown is served; without it the daemon is asked again
    client = StreamingClient(BLOCK, gap=0.05, final=OTHER, streamed=streamed)
    completer, _, early = await _early_then_typed(client)
    after = await completer.suggest("file:///a", P(3, 18), automatic=True, early=True)
    assert len(client.requests) == asked
    if streamed is not None:
        assert after is not None and after.cached and after.items == ("\n        if total > 9:\n            break",)


@pytest.mark.asyncio
async def test_typing_elsewhere_stops_the_rest_and_nothing_is_announced() -> None:
    client = StreamingClient(BLOCK, gap=0.05)
    completer, ready, _ = await _early_then_typed(client, "while")
    client.chunks = ["x:\n", "        pass"]
    await completer.suggest("file:///a", P(2, 9), automatic=True, early=True)
    assert client.cancelled == [client.requests[0].id]
    await asyncio.sleep(0.3)
    assert ready == []


@pytest.mark.asyncio
async def test_without_early_lines_or_for_plain_completion_the_whole_answer_is_awaited() -> None:
    for settings, early in (({"early_lines": False}, True), ({}, False)):
        client = StreamingClient(BLOCK, gap=0.01)
        completer, _, ready = _completer(client, **settings)
        got = await completer.suggest("file:///a", CURSOR, automatic=True, early=early)
        assert got is not None and got.items == ("".join(BLOCK),) and client.finished and ready == []


@pytest.mark.asyncio
async def test_an_answer_done_before_a_whole_line_is_returned_as_usual() -> None:
    client = StreamingClient(["total = len(xs)"], gap=0.01)
    completer, _, ready = _completer(client)
    got = await completer.suggest("file:///a", CURSOR, automatic=True, early=True)
    assert got is not None and got.items == ("total = len(xs)",) and not got.cached and ready == []


@pytest.mark.asyncio
async def test_the_server_announces_the_rest_as_sol_completion_ready() -> None:
    """The server wires the completer to a ``sol/completionReady`` notification
    with the document's uri, and the option reaches the completer."""
    import json

    from lsp.server import COMPLETION_READY, build_server

    server = build_server(Settings(start_daemon=False))
    written: list[bytes] = []

    class Keep:
        def write(self, data: bytes) -> None:
            written.append(data)

        def close(self) -> None:
            pass

    server.protocol.set_writer(Keep())
    message = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"capabilities": {}, "processId": None, "rootUri": None,
                          "initializationOptions": {"earlyLines": True}}}
    server.protocol.handle_message(json.loads(json.dumps(message), object_hook=server.protocol.structure_message))
    await asyncio.sleep(0.05)
    assert server.completer is not None and server.completer.settings.early_lines
    assert server.completer.on_rest_ready is not None
    server.completer.on_rest_ready("file:///w/a.py")
    sent = b"".join(written).decode()
    assert COMPLETION_READY == "sol/completionReady"
    assert '"method": "sol/completionReady"' in sent.replace('":"', '": "') and "file:///w/a.py" in sent
    await server.stop_daemon_client()
