"""Unit tests of sol-lsp's pieces, no daemon process: position encodings and
incremental sync (against a reference), the context ring's bounds, settings,
the completer's policy (debounce, cursor moves, typed-through, errors) with a
scripted daemon client, the websocket client against an in-process fake
daemon (cancel ids end to end, empty at once when down, reconnect), and the
one-message status reporter."""

from __future__ import annotations

import asyncio
import json
import random
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from websockets.asyncio.server import ServerConnection, serve

from soldaemon.api import CompletionRequest, Done
from soldaemon.protocol import ErrorFrame

from lsp.completer import Completer, DaemonRequestFailed, tidy_items
from lsp.context import ContextRing
from lsp.daemon_client import DaemonClient, StatusUpdate
from lsp.launcher import DaemonLauncher, Target
from lsp.documents import Document, DocumentStore, line_starts, units
from lsp.events import event_target as _event_target
from lsp.settings import Settings, SettingsError, parse_args
from lsp.status import StatusReporter

P = types.Position


# --------------------------------------------------------------------------
# Documents and positions
# --------------------------------------------------------------------------


def test_offsets_in_every_encoding() -> None:
    doc = Document("file:///x", "a😀b\r\nxé\rz")
    assert doc.offset_at(P(0, 3), "utf-16") == 2          # after a(1) + 😀(2)
    assert doc.offset_at(P(0, 2), "utf-16") == 1          # inside the surrogate pair: its start
    assert doc.offset_at(P(0, 99), "utf-16") == 3         # past the end: end of line, before \r\n
    assert doc.offset_at(P(0, 5), "utf-8") == 2           # a(1) + 😀(4)
    assert doc.offset_at(P(0, 2), "utf-32") == 2
    assert doc.offset_at(P(1, 2), "utf-16") == 7          # "xé" on line 1 (after \r\n)
    assert doc.offset_at(P(1, 2), "utf-8") == 6           # é is 2 bytes: byte 2 is inside it
    assert doc.offset_at(P(2, 1), "utf-16") == 9          # line 2 after a lone \r
    assert doc.offset_at(P(7, 0), "utf-16") == len(doc.text)
    assert units("a😀é", "utf-16") == 4 and units("a😀é", "utf-8") == 7 and units("a😀é", "utf-32") == 3


def _position(text: str, offset: int, encoding: str) -> types.Position:
    """Reference: the LSP position of ``offset`` (a naive, obviously right scan)."""
    line, start, i = 0, 0, 0
    while i < offset:
        if text[i] == "\r" and i + 1 < len(text) and text[i + 1] == "\n":
            if i + 2 > offset:
                break
            i += 2
            line, start = line + 1, i
            continue
        if text[i] in "\r\n":
            i += 1
            line, start = line + 1, i
            continue
        i += 1
    return P(line, units(text[start:offset], encoding))  # type: ignore[arg-type]


@pytest.mark.parametrize("encoding", ["utf-16", "utf-8", "utf-32"])
def test_incremental_edits_match_a_reference(encoding: str) -> None:
    rng = random.Random(7)
    pieces = ["a", "é", "😀", "\n", "\r\n", "\r", "xy", "", "def f():\n    pass\n"]
    store = DocumentStore(encoding)  # type: ignore[arg-type]
    text = "start\n😀 line\r\nend"
    store.open(types.TextDocumentItem("file:///t", "python", 1, text))
    for version in range(2, 400):
        a, b = sorted(rng.randint(0, len(text)) for _ in range(2))
        # Never split a \r\n pair or a character: positions name character starts.
        if 0 < a < len(text) and text[a - 1] == "\r" and text[a] == "\n":
            a -= 1
        if 0 < b < len(text) and text[b - 1] == "\r" and text[b] == "\n":
            b -= 1
        new = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))
        change = types.TextDocumentContentChangePartial(
            range=types.Range(_position(text, a, encoding), _position(text, b, encoding)), text=new)
        result = store.change(types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(uri="file:///t", version=version), [change]))
        text = text[:a] + new + text[b:]
        assert result is not None
        doc, offset = result
        assert doc.text == text and offset == a + len(new) and doc.version == version
        assert doc._starts == line_starts(text)
    whole = types.TextDocumentContentChangeWholeDocument(text="new\ntext")
    doc, _ = store.change(types.DidChangeTextDocumentParams(
        types.VersionedTextDocumentIdentifier(uri="file:///t", version=500), [whole])) or (None, 0)
    assert doc is not None and doc.text == "new\ntext"


# --------------------------------------------------------------------------
# Context ring
# --------------------------------------------------------------------------


def _store(**docs: str) -> DocumentStore:
    store = DocumentStore()
    for name, text in docs.items():
        store.open(types.TextDocumentItem(f"file:///{name}", "python", 1, text))
    return store


@pytest.mark.asyncio
async def test_the_server_keeps_one_copy_of_each_document_that_the_editor_agrees_with() -> None:
    """didOpen/didChange/didClose through pygls' own dispatch reach only
    sol-lsp's store: pygls' workspace keeps no second copy (it would split
    lines at a form feed too, and put this edit on the wrong line)."""
    from lsp.server import build_server

    server = build_server(Settings(start_daemon=False))

    class Discard:
        def write(self, data: bytes) -> None:
            pass

        def close(self) -> None:
            pass

    server.protocol.set_writer(Discard())

    def send(method: str, params: dict[str, Any], msg_id: int | None = None) -> None:
        message = {"jsonrpc": "2.0", "method": method, "params": params, **({"id": msg_id} if msg_id else {})}
        server.protocol.handle_message(json.loads(json.dumps(message), object_hook=server.protocol.structure_message))

    uri = "file:///w/paged.py"
    send("initialize", {"capabilities": {}, "processId": None, "rootUri": None}, 1)
    send("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                   "text": "a = 1\x0c\nb = 2\n"}})
    send("textDocument/didChange", {"textDocument": {"uri": uri, "version": 2}, "contentChanges": [
        {"range": {"start": {"line": 1, "character": 0}, "end": {"line": 1, "character": 0}}, "text": "X"}]})
    await asyncio.sleep(0.05)
    doc = server.documents.get(uri)
    assert doc is not None and doc.text == "a = 1\x0c\nXb = 2\n" and doc.version == 2
    assert list(server.workspace.text_documents) == []
    send("textDocument/didClose", {"textDocument": {"uri": uri}})
    await asyncio.sleep(0.05)
    assert len(server.documents) == 0
    await server.stop_daemon_client()


def test_context_ring_bounds_order_and_snapshots() -> None:
    body = "".join(f"line {i}\n" for i in range(200))
    store = _store(a=body, b=body, c=body, cur=body, blank="\n\n  \n")
    ring = ContextRing(max_entries=4, max_chunks=3, chunk_lines=10, max_chunk_chars=40, max_total_chars=100)
    for name in ("a", "b", "cur", "blank"):
        ring.opened(f"file:///{name}", store)
    ring.touch("file:///a", 3)                 # within half a chunk of line 0: moves that anchor
    assert len(ring) == 4
    ring.touch("file:///b", 150)               # a new spot: evicts the oldest (b@0)
    assert len(ring) == 4
    chunks = ring.chunks("file:///cur", store)
    assert [c.uri for c in chunks] == ["file:///b", "file:///a"]   # newest first; no cur, no blank
    assert chunks[0].text.startswith("line 145") and all(len(c.text) <= 40 for c in chunks)
    assert sum(len(c.text) for c in chunks) <= 100
    assert ring.chunks("file:///cur", store) == chunks              # stable while nothing else changes
    ring.closed("file:///a", store)
    store.close("file:///a")
    assert [c.uri for c in ring.chunks("file:///cur", store)] == ["file:///b", "file:///a"]  # snapshot


def test_context_ring_sends_an_opened_document_whole_and_an_edit_as_its_window() -> None:
    body = "".join(f"line {i}\n" for i in range(200))
    big = "".join(f"line {i}\n" for i in range(2000))
    store = _store(a=body, b=big, cur="x\n")
    ring = ContextRing(chunk_lines=10, max_chunk_chars=4000)
    ring.opened("file:///a", store)
    ring.opened("file:///b", store)
    ring.touch("file:///a", 150)               # an edit in a document sent whole: nothing more to send
    ring.touch("file:///b", 1500)              # one past what its whole chunk holds: a window of its own
    chunks = [(c.uri, c.text) for c in ring.chunks("file:///cur", store)]
    assert chunks[0][0] == "file:///b" and chunks[0][1].startswith("line 1495") and chunks[0][1].count("\n") == 10
    assert ("file:///a", body) in chunks       # the whole document: the daemon picks what is relevant
    assert [u for u, _ in chunks].count("file:///a") == 1
    head = [t for u, t in chunks if u == "file:///b" and t.startswith("line 0\n")]
    assert head and len(head[0]) == 4000       # a big document's head, cut at max_chunk_chars


# --------------------------------------------------------------------------
# Settings and event params
# --------------------------------------------------------------------------


def test_settings_from_flags_and_initialization_options() -> None:
    launch = parse_args(["--stdio", "--debounce-ms", "10", "--no-warm", "--start-daemon",
                         "--daemon-command", "soldaemon --config 'my file.yaml' serve", "--url", "ws://127.0.0.1:2"])
    s = launch.settings
    assert s.debounce_ms == 10.0 and s.warm is False and s.start_daemon is True and s.url == "ws://127.0.0.1:2"
    assert s.daemon_command == ("soldaemon", "--config", "my file.yaml", "serve")
    # What to run, where the daemon is and which token to send are launch-only:
    # initializationOptions (a project's settings) cannot set them.
    s2, ignored = s.with_options({"maxTokens": 32, "url": "ws://127.0.0.1:1", "daemonCommand": ["a", "b"],
                                  "startDaemon": True, "tokenFile": "/etc/shadow", "budgetMs": None, "shiny": 1})
    assert (s2.max_tokens, s2.url, s2.daemon_command, s2.budget_ms, s2.token_file) == \
        (32, "ws://127.0.0.1:2", ("soldaemon", "--config", "my file.yaml", "serve"), None, None)
    assert sorted(ignored) == ["daemonCommand (command line only)", "shiny", "startDaemon (command line only)",
                               "tokenFile (command line only)", "url (command line only)"]
    for bad in ({"maxTokens": 0}, {"maxTokens": 1.5}, {"warm": "maybe"},
                {"multiline": "all"}, {"debounceMs": True}):
        with pytest.raises(SettingsError):
            Settings().with_options(bad)
    with pytest.raises(SystemExit):
        parse_args(["--max-tokens", "lots"])
    with pytest.raises(SystemExit):
        parse_args(["--url", "http://x"])


# The VS Code extension's settings it forwards as sol-lsp options (serverOptions
# in vscode-extension/src/settings.ts): its key -> (sol-lsp's key, the value
# that means "not sent", so sol-lsp's default applies).
FORWARDED = {"debounceMs": ("debounceMs", None), "maxLines": ("maxLines", None),
             "startTimeoutSeconds": ("startTimeoutS", None), "slowTtftMs": ("slowMs", None),
             "maxTokens": ("maxTokens", 0), "budgetMs": ("budgetMs", 0)}


def test_the_extensions_settings_fit_sol_lsps_option_schema() -> None:
    """One schema for the options both have: every value the extension's
    package.json allows (and its settings.ts clamps to, checked in
    settings.test.ts) is one sol-lsp accepts; defaults agree but for the
    extension's documented slowTtftMs (docs/vscode.md)."""
    from lsp.settings import OPTIONS

    properties = json.loads((Path(__file__).resolve().parent.parent / "vscode-extension" / "package.json")
                            .read_text())["contributes"]["configuration"]["properties"]
    schema = {opt.key: opt.json_schema() for opt in OPTIONS}
    defaults = {opt.key: getattr(Settings(), opt.field) for opt in OPTIONS}
    for ext_key, (key, unset) in FORWARDED.items():
        prop, rule = properties[f"soldaemon.{ext_key}"], schema[key]
        assert rule is not None and prop["type"] in (rule["type"], "integer"), (ext_key, prop, rule)
        low = prop["minimum"] + (1 if prop["minimum"] == unset else 0)      # "unset" is never sent
        assert rule["minimum"] <= low and prop["maximum"] <= rule["maximum"], (ext_key, prop, rule)
        if prop["default"] != unset and ext_key != "slowTtftMs":
            assert prop["default"] == defaults[key], (ext_key, prop["default"], defaults[key])
    assert schema["multiline"] == {"type": "string", "enum": ["auto", "single", "multi"]}
    assert schema["budgetMs"] == {"type": ["number", "null"], "minimum": 1, "maximum": 120_000}


def test_event_params_forms() -> None:
    item = {"insertText": "x", "command": {"title": "t", "command": "sol.accepted", "arguments": ["c3", 1]}}
    assert _event_target({"item": item, "acceptedLength": 4}) == ("c3", 1, 4)
    from_line_start = {**item, "command": {**item["command"], "arguments": ["c3", 1, 10]}}
    assert _event_target({"item": from_line_start, "acceptedLength": 14}) == ("c3", 1, 4)
    assert _event_target({"id": "c9", "index": 0}) == ("c9", 0, None)
    assert _event_target({"id": "c9", "index": 99}) is None
    assert _event_target({"item": {"insertText": "x"}}) is None
    assert _event_target("nonsense") is None


# --------------------------------------------------------------------------
# Completer (scripted daemon client)
# --------------------------------------------------------------------------


class ScriptedClient:
    """Stands in for DaemonClient: answers every complete with ``answer``
    after ``delay`` seconds."""

    def __init__(self, answer: Any = None, delay: float = 0.0, ready: bool = True,
                 ready_after: float | None = None) -> None:
        self.answer = answer
        self.delay = delay
        self.ready = ready
        self.ready_after = ready_after      # s: a daemon on its way, ready after this long (None: none comes)
        self.requests: list[CompletionRequest] = []
        self.cancelled: list[str] = []
        self.pokes = 0
        self._n = 0
        self._in_flight: set[str] = set()

    def new_id(self, kind: str = "c", tag: str | None = None) -> str:
        self._n += 1
        return f"{kind}{self._n}"

    def poke(self) -> None:
        self.pokes += 1

    async def wait_ready(self) -> bool:
        if not self.ready and self.ready_after is not None:
            await asyncio.sleep(self.ready_after)
            self.ready = True
        return self.ready

    def in_flight(self, kind: str = "complete") -> list[str]:
        return sorted(self._in_flight)

    def cancel(self, request_id: str) -> bool:
        self.cancelled.append(request_id)
        return True

    def warm(self, req: CompletionRequest) -> bool:
        return True

    async def complete(self, req: CompletionRequest, *, timeout_s: float | None = None, on_delta: Any = None) -> Any:
        self.requests.append(req)
        self._in_flight.add(req.id)
        try:
            await asyncio.sleep(self.delay)
        finally:
            self._in_flight.discard(req.id)
        if isinstance(self.answer, ErrorFrame):
            return ErrorFrame(req.id, self.answer.code, self.answer.message, self.answer.retryable, None)
        return Done(req.id, tuple(self.answer or ()), "stop")


def answered_without_waiting(coro: Any) -> Any:
    """Run ``coro`` one step and return its result; fails when it suspended
    (awaited a timer, the daemon, a reconnection) instead of answering: "at
    once" without a wall-clock bound a busy machine could break."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise AssertionError("it waited for something instead of answering at once")


def _completer(client: ScriptedClient, text: str = "def f(x):\n    return \n", **settings: Any
               ) -> tuple[Completer, DocumentStore]:
    store = _store(a=text, other="import os\n")
    ring = ContextRing()
    ring.opened("file:///other", store)
    # One item per request unless a test asks for alternatives.
    completer = Completer(Settings(**{"warm": False, "alternatives": 1, **settings}), store, ring,
                          client)  # type: ignore[arg-type]
    return completer, store


@pytest.mark.asyncio
async def test_completer_policy() -> None:
    client = ScriptedClient(["x + 1\n    y\n\n", "", "x + 1\n    y"])
    completer, store = _completer(client, debounce_ms=0)
    got = await completer.suggest("file:///a", P(1, 11), automatic=False, tag="7")
    assert got is not None and got.items == ("x + 1\n    y",) and got.indices == (0,)   # tidied, deduplicated
    assert got.line_prefix == "    return "
    req = client.requests[-1]
    assert (req.prefix, req.suffix, req.priority) == ("def f(x):\n    return ", "\n", "high")
    assert [c.uri for c in req.context] == ["file:///other"]
    # Cursor moved, no edit: an automatic trigger asks nothing.
    assert await completer.suggest("file:///a", P(0, 3), automatic=True) is None
    assert len(client.requests) == 1
    # Typing through the suggestion: answered from it, no daemon round trip.
    doc = store.get("file:///a")
    assert doc is not None
    store.change(types.DidChangeTextDocumentParams(types.VersionedTextDocumentIdentifier(uri="file:///a", version=2), [
        types.TextDocumentContentChangePartial(range=types.Range(P(1, 11), P(1, 11)), text="x +")]))
    cached = await completer.suggest("file:///a", P(1, 14), automatic=True)
    assert cached is not None and cached.cached and cached.items == (" 1\n    y",)
    assert cached.request_id == got.request_id and len(client.requests) == 1


@pytest.mark.asyncio
async def test_completer_debounce_not_ready_and_errors() -> None:
    client = ScriptedClient(["a"], delay=0.05)
    completer, _ = _completer(client, debounce_ms=30)
    first = asyncio.ensure_future(completer.suggest("file:///a", P(1, 11), automatic=True))
    await asyncio.sleep(0.005)
    second = await completer.suggest("file:///a", P(1, 11), automatic=True)
    assert await first is None and second is not None       # overtaken during its debounce
    assert len(client.requests) == 1
    # A newer request cancels older ones still running on the daemon.
    slow = asyncio.ensure_future(completer.suggest("file:///a", P(1, 11), automatic=False))
    await asyncio.sleep(0.02)
    await completer.suggest("file:///a", P(1, 11), automatic=False)
    await slow
    assert client.cancelled == [client.requests[-2].id]

    down = ScriptedClient(["a"], ready=False)
    completer, _ = _completer(down)
    # empty at once: the answer comes without waiting for anything (no debounce, no daemon)
    assert answered_without_waiting(completer.suggest("file:///a", P(1, 11), automatic=False)) is None
    assert down.pokes == 1 and not down.requests

    # a daemon on its way: the request waits for it and is answered; one overtaken meanwhile is not
    coming = ScriptedClient(["a"], ready=False, ready_after=0.05)
    completer, _ = _completer(coming)
    found = await completer.suggest("file:///a", P(1, 11), automatic=False)
    assert found is not None and found.items == ("a",) and coming.pokes == 1
    coming = ScriptedClient(["a"], ready=False, ready_after=0.05)
    completer, _ = _completer(coming)
    older = asyncio.ensure_future(completer.suggest("file:///a", P(1, 11), automatic=False))
    await asyncio.sleep(0.01)
    newer = await completer.suggest("file:///a", P(1, 11), automatic=False)
    assert await older is None and newer is not None and len(coming.requests) == 1

    failing = ScriptedClient(ErrorFrame("x", "bad_request", "the prompt is empty", False, None))
    completer, _ = _completer(failing)
    with pytest.raises(DaemonRequestFailed):
        await completer.suggest("file:///a", P(1, 11), automatic=False)
    busy = ScriptedClient(ErrorFrame("x", "busy", "too many", True, None))
    completer, _ = _completer(busy)
    assert await completer.suggest("file:///a", P(1, 11), automatic=False) is None


@pytest.mark.asyncio
async def test_invoked_completions_get_distinct_alternatives_greedy_first() -> None:
    class Sampling(ScriptedClient):
        """Greedy answers "x + 1"; sampled requests "x + 1" then "x - 1"."""

        async def complete(self, req: CompletionRequest, **kwargs: Any) -> Any:
            self.answer = ["x + 1"] if req.temperature == 0 else ["x + 1", "x - 1"][:req.n]
            return await super().complete(req, **kwargs)

    client = Sampling()
    completer, _ = _completer(client, debounce_ms=0, alternatives=3, alternatives_temperature=0.4)
    got = await completer.suggest("file:///a", P(1, 11), automatic=False)
    assert got is not None and got.items == ("x + 1", "x - 1")     # distinct only
    greedy, sampled = client.requests
    assert (greedy.n, greedy.temperature) == (1, 0.0)
    assert (sampled.n, sampled.temperature, sampled.prefix) == (2, 0.4, greedy.prefix)
    assert [got.id_of(i) for i in range(2)] == [greedy.id, sampled.id] and got.indices == (0, 1)
    # An automatic trigger: the greedy request only.
    client.requests.clear()
    completer, _ = _completer(client, debounce_ms=0, alternatives=3)
    assert await completer.suggest("file:///a", P(1, 11), automatic=True) is not None
    assert [(r.n, r.temperature) for r in client.requests] == [(1, 0.0)]


def test_request_windows_and_items() -> None:
    text = "".join(f"{i:05d}\n" for i in range(3000))         # 18000 chars
    completer, store = _completer(ScriptedClient(), text=text, max_prefix_chars=5000, max_suffix_chars=100)
    doc = store.get("file:///a")
    assert doc is not None
    req = completer.build_request(doc, 12_000, "c1")
    assert len(req.prefix) <= 5000 and req.prefix.startswith(("0", "1", "2")) and text.endswith(req.prefix + text[12_000:])
    assert req.prefix == text[len(text[:12_000]) - len(req.prefix):12_000] and text[12_000 - len(req.prefix) - 1] == "\n"
    assert len(req.suffix) <= 100 and req.suffix.endswith("\n")
    # The window start moves in coarse steps: nearby cursors share the prefix start.
    assert completer.build_request(doc, 12_006, "c2").prefix.startswith(req.prefix)
    assert tidy_items(("a\nb\nc", "  ", "a\nb"), 2) == (["a\nb"], [0])


# --------------------------------------------------------------------------
# DaemonClient against an in-process fake daemon
# --------------------------------------------------------------------------


class FakeDaemon:
    """Speaks just enough protocol: hello, then records frames; answers
    ``cancel`` with a cancelled ``done`` and never answers ``complete``."""

    def __init__(self) -> None:
        self.frames: list[dict[str, Any]] = []
        self.server: Any = None
        self.port = 0

    async def handler(self, ws: ServerConnection) -> None:
        await ws.send(json.dumps({"type": "status", "kind": "hello", "protocol": 1, "state": "ready"}))
        async for raw in ws:
            frame = json.loads(raw)
            self.frames.append(frame)
            if frame["type"] == "cancel":
                await ws.send(json.dumps({"type": "done", "id": frame["id"], "items": [],
                                          "finish_reason": "cancelled", "timings": {}}))

    async def start(self, port: int = 0) -> None:
        self.server = await serve(self.handler, "127.0.0.1", port)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        self.server.close()
        await self.server.wait_closed()


@pytest.mark.asyncio
async def test_daemon_client_cancels_by_id_and_survives_the_daemon(tmp_path: Path) -> None:
    fake = FakeDaemon()
    await fake.start()
    updates: list[StatusUpdate] = []
    client = DaemonClient(lambda: Target(f"ws://127.0.0.1:{fake.port}", "t" * 43, tmp_path / "token", "test"),
                          on_status=updates.append, backoff_initial_s=0.05, backoff_max_s=0.1,
                          failure_message_after_s=0.3)
    client.start()
    try:
        for _ in range(1000):
            if client.ready:
                break
            await asyncio.sleep(0.01)
        assert client.ready
        req = CompletionRequest(id=client.new_id("c", "42"), prefix="x = ", suffix="")
        task = asyncio.ensure_future(client.complete(req))
        for _ in range(1000):
            if any(f["type"] == "complete" for f in fake.frames):
                break
            await asyncio.sleep(0.01)
        task.cancel()                                   # the editor's $/cancelRequest
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(1000):
            if any(f["type"] == "cancel" for f in fake.frames):
                break
            await asyncio.sleep(0.01)
        assert [f["id"] for f in fake.frames] == [req.id, req.id] == ["c1.lsp42", "c1.lsp42"]
        assert [f["type"] for f in fake.frames] == ["complete", "cancel"]
        # cancel() keeps the caller waiting for the daemon's done.
        req2 = CompletionRequest(id=client.new_id(), prefix="y = ", suffix="")
        task2 = asyncio.ensure_future(client.complete(req2))
        await asyncio.sleep(0.05)
        assert client.cancel(req2.id)
        answer = await asyncio.wait_for(task2, 2)
        assert isinstance(answer, Done) and answer.finish_reason == "cancelled"

        await fake.stop()                               # the daemon goes away
        for _ in range(1000):
            if not client.ready:
                break
            await asyncio.sleep(0.01)
        # unavailable at once: no wait for a reconnection
        down = answered_without_waiting(client.complete(CompletionRequest(id=client.new_id(), prefix="z", suffix="")))
        assert isinstance(down, ErrorFrame) and down.code == "unavailable"
        # failing for longer than failure_message_after_s (0.3 s) makes the failure persistent
        for _ in range(1000):
            if [u.persistent for u in updates if u.state == "error"][-1:] == [True]:
                break
            await asyncio.sleep(0.01)
        assert [u.persistent for u in updates if u.state == "error"][-1] is True
        await fake.start(fake.port)                     # back on the same port
        for _ in range(1000):
            if client.ready:
                break
            await asyncio.sleep(0.01)
        assert client.ready and updates[-1].state == "ready"
    finally:
        await client.close()
        await fake.stop()


# --------------------------------------------------------------------------
# Status reporter
# --------------------------------------------------------------------------


class _Protocol:
    def __init__(self) -> None:
        self.sent: list[tuple[str, Any]] = []
        self.asked: list[Any] = []

    def notify(self, method: str, params: Any) -> None:
        self.sent.append((method, params))

    def send_request(self, method: str, params: Any) -> Any:
        from concurrent.futures import Future

        self.asked.append(params)
        return Future()


class _Server:
    def __init__(self) -> None:
        self.protocol = _Protocol()

    @property
    def shown(self) -> list[Any]:
        return self.protocol.asked

    def window_show_message(self, params: types.ShowMessageParams) -> None:
        raise AssertionError("failures are asked with actions (window/showMessageRequest)")

    def error_action(self, title: str) -> None:
        pass


def test_status_reporter_shows_one_message_per_outage() -> None:
    server = _Server()
    report = StatusReporter(server)  # type: ignore[arg-type]
    report.enabled = True
    report(StatusUpdate("connecting", "connecting"))
    for _ in range(5):
        report(StatusUpdate("error", "no soldaemon at ws://127.0.0.1:8765", persistent=True))
    assert len(server.shown) == 1 and len(server.protocol.sent) == 6
    assert server.protocol.sent[-1][0] == "sol/status" and server.protocol.sent[-1][1].state == "error"
    report(StatusUpdate("ready", "soldaemon ready"))
    report(StatusUpdate("error", "again", persistent=True))
    assert len(server.shown) == 1       # a second outage soon after: still no stream of pop-ups


def test_progress_begins_once_created_reports_and_ends() -> None:
    from concurrent.futures import Future

    from lsp.status import Progress

    class Protocol:
        def __init__(self) -> None:
            self.sent: list[Any] = []
            self.created: list[Future[Any]] = []

        def send_request(self, method: str, params: Any) -> Future[Any]:
            self.created.append(Future())
            return self.created[-1]

        def notify(self, method: str, params: Any) -> None:
            self.sent.append(params.value)

    server = _Server()
    proto = Protocol()
    server.protocol = proto  # type: ignore[assignment]
    progress = Progress(server)  # type: ignore[arg-type]
    progress.show("starting")                          # disabled: the client did not announce it
    assert not proto.created
    progress.enabled = True
    progress.show("starting soldaemon")
    progress.show("loading its model")                 # before the client answered: kept
    assert proto.sent == []
    proto.created[0].set_result(None)
    progress.show("still loading")
    progress.done("ready")
    kinds = [type(v).__name__ for v in proto.sent]
    assert kinds == ["WorkDoneProgressBegin", "WorkDoneProgressReport", "WorkDoneProgressEnd"]
    assert proto.sent[0].message == "loading its model"
    progress.show("again")
    proto.created[1].set_exception(RuntimeError("refused"))
    assert not progress.active and len(proto.sent) == 3      # a refused token: no bar


def test_the_launchers_stage_is_the_daemons_last_progress_line(tmp_path: Path) -> None:
    """What a starting daemon prints as ``soldaemon: ...`` on its stdout
    (daemon.out) is the stage sol-lsp shows; its error line is not."""
    launcher = DaemonLauncher(["soldaemon", "serve"], log_path=tmp_path / "daemon.log")
    assert launcher.stage() is None                           # nothing started: no daemon.out
    (tmp_path / "daemon.out").write_text(
        "soldaemon: assembling qwen2.5-coder-0.5b from its parts (once)…\nsome library's noise\n"
        "soldaemon: measuring the linear kernels on this machine (once)…\n"
        "soldaemon: error [model_error]: the model could not load\n")
    assert launcher.stage() == "measuring the linear kernels on this machine (once)…"
    (tmp_path / "daemon.out").write_bytes(b"x" * 10_000 + b"\nsoldaemon: converting a.gguf once\n")
    assert launcher.stage() == "converting a.gguf once"       # read from the file's end only
