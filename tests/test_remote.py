"""The remote backend (soldaemon.remote): an OpenAI-compatible completions
engine behind the daemon's API.

Three layers:

- pure pieces: URL handling, back-off, stream parsing, API key, config;
- the engine against small HTTP servers on loopback written here, for what a
  real engine will not do on demand: answer garbage, drop connections, hang,
  stream forever (to time the cancel);
- the real thing (``slow``): llama-cpp-python's OpenAI-compatible server
  (``python -m llama_cpp.server``, the ``[server]`` extra, in the ``bench``
  extra) on the embedded GGUF, reached through a real ``soldaemon serve``
  websocket: streaming, cancel (the engine stops computing), the engine killed
  mid-request and restarted.
"""

from __future__ import annotations

import asyncio
import http.server
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import psutil
import pytest

from soldaemon.api import CancelToken, CompletionRequest, Delta, Done
from soldaemon.config import config_from_dict
from soldaemon.errors import ConfigError, SolError
from tests.fixtures.daemon import complete
from soldaemon.errors import RemoteBadResponse, RemoteHttpError, RemoteTimeout, RemoteUnavailable
from soldaemon.remote.endpoint import Backoff, Endpoint, read_api_key
from soldaemon.remote.engine import RemoteEngine
from soldaemon.remote.stream import parse_chunk

# --------------------------------------------------------------------------
# Pure pieces
# --------------------------------------------------------------------------


def test_endpoint_accepts_base_urls_and_hides_credentials() -> None:
    e = Endpoint.parse("http://gpu-box:8000")
    assert (e.https, e.host, e.port, e.base, e.shown) == (False, "gpu-box", 8000, "/v1", "http://gpu-box:8000/v1")
    assert Endpoint.parse("https://llm.example/v1/").base == "/v1"
    assert Endpoint.parse("https://llm.example/team/v1").shown == "https://llm.example/team/v1"
    assert Endpoint.parse("https://llm.example").port == 443
    secret = Endpoint.parse("http://bob:hunter2@[::1]:9000/v1")
    assert secret.shown == "http://[::1]:9000/v1" and "hunter2" not in secret.shown
    assert secret.userinfo == "bob:hunter2"
    with pytest.raises(ConfigError, match="port"):
        Endpoint.parse("http://host:99999")


def test_backoff_doubles_up_to_the_cap_and_resets() -> None:
    now = [100.0]
    b = Backoff(0.5, 3.0, clock=lambda: now[0])
    assert b.remaining() == 0
    assert [b.failed("x") for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert b.remaining() == 3.0
    now[0] += 2.0
    assert b.remaining() == 1.0
    b.succeeded()
    assert b.remaining() == 0 and b.failures == 0
    assert b.failed("y") == 0.5


def test_stream_events_parse_or_fail_clearly() -> None:
    ep = Endpoint.parse("http://h:1")
    piece = parse_chunk(ep, b'{"choices": [{"text": "ab", "index": 0, "finish_reason": null}]}')
    assert (piece.text, piece.finish_reason) == ("ab", None)
    assert parse_chunk(ep, b'{"choices": [{"text": "", "finish_reason": "length"}]}').finish_reason == "length"
    usage = parse_chunk(ep, b'{"choices": [], "usage": {"completion_tokens": 7}}')
    assert usage.text == "" and usage.usage == {"completion_tokens": 7}
    with pytest.raises(RemoteBadResponse, match="not JSON"):
        parse_chunk(ep, b"<html>")
    with pytest.raises(RemoteBadResponse, match=r"choices\[0\]\.text"):
        parse_chunk(ep, b'{"choices": [{"message": {"content": "chat"}}]}')
    with pytest.raises(RemoteHttpError, match="out of memory") as info:
        parse_chunk(ep, b'{"error": {"message": "out of memory", "code": 503}}')
    assert info.value.retryable and info.value.status == 503


def test_api_key_from_env_then_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key_file = tmp_path / "key"
    key_file.write_text("file-key\nignored\n")
    monkeypatch.setenv("SOL_TEST_KEY", "env-key")
    assert read_api_key("SOL_TEST_KEY", str(key_file)) == "env-key"
    monkeypatch.setenv("SOL_TEST_KEY", "")
    assert read_api_key("SOL_TEST_KEY", str(key_file)) == "file-key"
    assert read_api_key(None, None) is None
    with pytest.raises(ConfigError, match=r"\$SOL_TEST_KEY"):
        read_api_key("SOL_TEST_KEY", None)
    with pytest.raises(ConfigError, match="cannot read"):
        read_api_key(None, str(tmp_path / "missing"))


def test_config_checks_backoff_order() -> None:
    with pytest.raises(ConfigError, match="max_backoff_s"):
        config_from_dict({"backend": {"backoff_s": 5, "max_backoff_s": 1}})
    c = config_from_dict({"backend": {"kind": "remote", "url": "http://h:8000", "fallback_local": True,
                                      "prompt_format": "tokens", "retries": 0}})
    assert c.backend.fallback_local and c.backend.prompt_format == "tokens"


# --------------------------------------------------------------------------
# Small loopback servers
# --------------------------------------------------------------------------


def _chunk(text: str, finish: str | None = None) -> bytes:
    obj = {"object": "text_completion", "choices": [{"text": text, "index": 0, "finish_reason": finish}]}
    return b"data: " + json.dumps(obj).encode() + b"\n\n"


class ScriptedEngine:
    """A loopback HTTP server that answers ``POST /v1/completions`` the way
    ``mode`` says, counting attempts and noticing when a client goes away."""

    def __init__(self, port: int = 0) -> None:
        self.mode = "ok"
        self.attempts = 0
        self.bodies: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.client_gone = threading.Event()
        self.chunks_sent = 0
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                body = b'{"object": "list", "data": [{"id": "scripted"}]}'
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                outer.attempts += 1
                length = int(self.headers.get("Content-Length", 0))
                outer.bodies.append(json.loads(self.rfile.read(length)))
                outer.headers.append(dict(self.headers))
                getattr(outer, "_" + outer.mode)(self)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    @staticmethod
    def _send(h: Any, status: int, ctype: str, body: bytes) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        h.wfile.write(body)

    def _ok(self, h: Any) -> None:
        body = _chunk("return") + _chunk(" a") + _chunk(" +") + _chunk(" b") + _chunk("\n", "stop") + b"data: [DONE]\n\n"
        self._send(h, 200, "text/event-stream", body)

    def _text(self, h: Any) -> None:
        self._send(h, 200, "text/html", b"<html>It works!</html>")

    def _nonjson(self, h: Any) -> None:
        self._send(h, 200, "text/event-stream", b"data: hello there\n\n")

    def _schema(self, h: Any) -> None:
        self._send(h, 200, "text/event-stream", b'data: {"result": "x"}\n\n')

    def _e500(self, h: Any) -> None:
        self._send(h, 500, "application/json", b'{"error": {"message": "CUDA error: device lost"}}')

    def _e404(self, h: Any) -> None:
        self._send(h, 404, "application/json", b'{"detail": "Not Found"}')

    def _drop(self, h: Any) -> None:
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)

    def _hang(self, h: Any) -> None:
        time.sleep(3.0)

    def _forever(self, h: Any) -> None:
        """Stream one line of a list every 20 ms until the client leaves."""
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        try:
            for i in range(5000):
                h.wfile.write(_chunk(f"    {i},\n"))
                h.wfile.flush()
                self.chunks_sent += 1
                time.sleep(0.02)
        except OSError:
            self.client_gone.set()

    def _die(self, h: Any) -> None:
        """A few chunks, then the connection drops (the engine crashed)."""
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(_chunk("x = 1") + _chunk("\n"))
        h.wfile.flush()
        h.close_connection = True
        h.connection.shutdown(socket.SHUT_RDWR)


@pytest.fixture(scope="module")
def tiny_tokenizer() -> Any:
    from soldaemon_bench.tiny import build_tokenizer

    return build_tokenizer()


@pytest.fixture
def scripted() -> Iterator[ScriptedEngine]:
    server = ScriptedEngine()
    yield server
    server.close()


def _engine(tokenizer: Any, url: str, *, local: Any = None, max_lines: int = 8, **backend: Any) -> RemoteEngine:
    settings = {"kind": "remote", "url": url, "backoff_s": 0.3, "max_backoff_s": 2.0, "timeout_s": 5, **backend}
    config = config_from_dict({"backend": settings, "completion": {"max_lines": max_lines}})
    return RemoteEngine(config, tokenizer, "tiny", local=local)


def _req(rid: str = "r", **fields: Any) -> CompletionRequest:
    fields.setdefault("prefix", "def add(a, b):\n    ")
    fields.setdefault("suffix", "\n")
    return CompletionRequest(id=rid, **fields)


def _run(engine: RemoteEngine, req: CompletionRequest, cancel: CancelToken | None = None) -> tuple[str, Done]:
    streamed = ""
    for ev in engine.complete(req, cancel or CancelToken()):
        if isinstance(ev, Delta):
            streamed += ev.text
        else:
            return streamed, ev
    raise AssertionError("no done")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_streams_with_the_local_pipeline(tiny_tokenizer: Any, scripted: ScriptedEngine,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SOL_TEST_KEY", "s3cret")
    engine = _engine(tiny_tokenizer, scripted.url, api_key_env="SOL_TEST_KEY", model_name="coder")
    streamed, done = _run(engine, _req(max_tokens=20))
    assert done.finish_reason == "stop" and done.items == ("return a + b",)
    assert streamed.rstrip("\n") == "return a + b"  # multi-line: the preview keeps its newlines
    t = done.timings
    assert t.prompt_tokens > 0 and t.generated_tokens == 5 and 0 < t.ttft_ms <= t.total_ms
    body = scripted.bodies[-1]
    assert body["stream"] is True and body["max_tokens"] == 20 and body["model"] == "coder"
    assert body["temperature"] == 0.0
    # four stop strings (the API's limit): end of text and file separator first, the FIM tokens last
    assert body["stop"] == ["<|endoftext|>", "<|file_sep|>", "<|im_end|>", "<|fim_pad|>"]
    # the FIM prompt of the local pipeline, as text the engine parses back to the same ids
    prompt, _ = engine.build_prompt(_req())
    assert body["prompt"].startswith("<|fim_prefix|>def add(a, b):") and body["prompt"].endswith("<|fim_middle|>")
    assert tiny_tokenizer(body["prompt"])["input_ids"] == prompt.ids
    assert scripted.headers[-1]["Authorization"] == "Bearer s3cret"
    for shown in (engine.info(), engine.diagnosis()):
        assert "s3cret" not in json.dumps(shown)
    # type-through: the user types what was proposed; no new request
    _, again = _run(engine, _req(prefix="def add(a, b):\n    return a"))
    assert again.items == (" + b",) and again.timings.source == "type-through"
    assert scripted.attempts == 1


def test_prompt_as_token_ids(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    engine = _engine(tiny_tokenizer, scripted.url, prompt_format="tokens")
    _run(engine, _req())
    assert scripted.bodies[-1]["prompt"] == engine.build_prompt(_req())[0].ids


@pytest.mark.parametrize(("mode", "error", "retryable", "says"), [
    ("text", RemoteBadResponse, False, "text/html"),
    ("nonjson", RemoteBadResponse, False, "not JSON"),
    ("schema", RemoteBadResponse, False, "choices[0].text"),
    ("e500", RemoteHttpError, True, "HTTP 500 Internal Server Error: CUDA error: device lost"),
    ("e404", RemoteHttpError, False, "HTTP 404 Not Found"),
    ("die", RemoteUnavailable, True, "closed the stream mid-completion"),
])
def test_garbage_and_errors_are_clear(tiny_tokenizer: Any, scripted: ScriptedEngine, mode: str,
                                      error: type[SolError], retryable: bool, says: str) -> None:
    scripted.mode = mode
    engine = _engine(tiny_tokenizer, scripted.url)
    t0 = time.monotonic()
    with pytest.raises(error) as info:
        _run(engine, _req(multiline="multi"))
    assert time.monotonic() - t0 < 3
    assert info.value.retryable is retryable
    assert says in info.value.message and scripted.url in info.value.message
    assert engine.diagnosis()["remote_failures"] == 1


def test_dropped_connections_are_retried_then_fail(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    scripted.mode = "drop"
    engine = _engine(tiny_tokenizer, scripted.url, retries=2, backoff_s=0.05)
    with pytest.raises(RemoteUnavailable, match="3 attempts") as info:
        _run(engine, _req())
    assert info.value.retryable and scripted.attempts == 3


def test_slow_engine_times_out(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    scripted.mode = "hang"
    engine = _engine(tiny_tokenizer, scripted.url, timeout_s=0.3)
    t0 = time.monotonic()
    with pytest.raises(RemoteTimeout, match="did not answer within 0.3 s") as info:
        _run(engine, _req())
    # before the hanging engine would have answered (3 s): the timeout ended it, not the answer
    assert info.value.retryable and time.monotonic() - t0 < 2.5


def test_cancel_while_waiting_for_the_engines_answer(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    scripted.mode = "hang"
    engine = _engine(tiny_tokenizer, scripted.url, timeout_s=10)
    cancel = CancelToken()
    threading.Timer(0.2, cancel.cancel).start()
    t0 = time.monotonic()
    _, done = _run(engine, _req(), cancel)
    # before the hanging engine would have answered (3 s): the cancel ended the wait
    assert done.finish_reason == "cancelled" and time.monotonic() - t0 < 2.5
    assert engine.backoff.failures == 0  # a cancel is not the engine's failure


def test_refused_backs_off_then_recovers(tiny_tokenizer: Any) -> None:
    port = _free_port()
    engine = _engine(tiny_tokenizer, f"http://127.0.0.1:{port}", retries=0, backoff_s=0.4)
    with pytest.raises(RemoteUnavailable, match="connection refused") as info:
        _run(engine, _req())
    assert info.value.retryable
    # at once again: no connection attempt, the back-off answers (its message says so;
    # no wall-clock bound, which a busy machine could break)
    with pytest.raises(RemoteUnavailable, match="backing off"):
        _run(engine, _req())
    diag = engine.diagnosis()
    assert diag["remote_reachable"] is False and diag["remote_backoff_s"] > 0
    server = ScriptedEngine(port)  # the engine comes back on the same port
    try:
        time.sleep(engine.backoff.remaining() + 0.05)
        _, done = _run(engine, _req())
        assert done.items == ("return a + b",)
        assert engine.diagnosis()["remote_reachable"] is True and engine.backoff.failures == 0
    finally:
        server.close()


def test_cancel_closes_the_upstream_stream_at_once(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    scripted.mode = "forever"
    engine = _engine(tiny_tokenizer, scripted.url, max_lines=400)
    cancel = CancelToken()
    events = engine.complete(_req(prefix="PRIMES = [\n", suffix="", multiline="multi", max_tokens=2000), cancel)
    first = next(events)
    assert isinstance(first, Delta)
    t0 = time.monotonic()
    cancel.cancel()
    rest = list(events)
    assert isinstance(rest[-1], Done) and rest[-1].finish_reason == "cancelled"
    # far before the 400-line cap (8 s of 20 ms chunks) would have ended the stream
    assert time.monotonic() - t0 < 3.0
    # the engine notices: its next write fails (one 20 ms chunk later)
    assert scripted.client_gone.wait(2.0)
    assert engine.diagnosis()["remote_upstream_closed"] == 1


def test_budget_closes_the_upstream_stream(tiny_tokenizer: Any, scripted: ScriptedEngine) -> None:
    scripted.mode = "forever"
    engine = _engine(tiny_tokenizer, scripted.url, max_lines=400)
    t0 = time.monotonic()
    _, done = _run(engine, _req(prefix="PRIMES = [\n", suffix="", multiline="multi", max_tokens=2000,
                                budget_ms=300, received_ns=time.perf_counter_ns()))
    # not before the budget; far before the 400-line cap (8 s of 20 ms chunks)
    assert done.finish_reason == "budget" and 0.25 < time.monotonic() - t0 < 4.0
    assert scripted.client_gone.wait(2.0)
    assert done.items and done.items[0].startswith("    0,\n    1,\n")  # what came before the budget ran out


def test_fallback_to_the_local_model_when_the_engine_is_down(tiny_tokenizer: Any, tmp_path: Path) -> None:
    from soldaemon.runtime.engine.local import load_engine
    from soldaemon_bench.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    local_config = config_from_dict({"model": {"path": str(tiny)}, "device": {"threads": 1}})
    loads: list[float] = []

    def local() -> Any:
        loads.append(time.monotonic())
        return load_engine(local_config, progress=False)

    engine = _engine(tiny_tokenizer, f"http://127.0.0.1:{_free_port()}", local=local, fallback_local=True,
                     retries=0)
    assert engine.diagnosis()["fallback_local"] == "not loaded"
    _, done = _run(engine, _req(max_tokens=8))
    assert done.finish_reason in ("stop", "length") and done.timings.generated_tokens > 0
    # while backing off, the next request goes straight to the local model
    _, again = _run(engine, _req("r2", prefix="x = ", max_tokens=4))
    assert again.timings.generated_tokens > 0
    diag = engine.diagnosis()
    assert diag["remote_fallbacks"] == 2 and diag["fallback_local"] == "ready" and len(loads) == 1


def test_without_fallback_the_local_model_is_never_loaded(tiny_tokenizer: Any) -> None:
    def local() -> Any:
        raise AssertionError("loaded")

    engine = _engine(tiny_tokenizer, f"http://127.0.0.1:{_free_port()}", local=local, retries=0)
    with pytest.raises(RemoteUnavailable):
        _run(engine, _req())
    assert engine.diagnosis()["fallback_local"] == "off"


def test_the_remote_package_never_imports_the_runtime() -> None:
    """The local fallback is built by the server's engine loader and handed
    in (``local=``): soldaemon/remote/ imports nothing of soldaemon/runtime/,
    not even inside a function (issue 29)."""
    import ast

    found = []
    for path in sorted((Path(__file__).resolve().parent.parent / "soldaemon" / "remote").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            found += [f"{path.name}:{node.lineno} {n}" for n in names if n.startswith("soldaemon.runtime")]
    assert found == []


def test_daemon_supersede_closes_the_upstream_stream(start_daemon: Any, scripted: ScriptedEngine,
                                                     tmp_path: Path) -> None:
    """A newer keystroke for the same document supersedes the request in
    flight: through a real daemon, its upstream stream is closed (the
    engine sees the client go) and it ends "superseded"."""
    from soldaemon_bench.tiny import build_tiny_model

    scripted.mode = "forever"
    tiny = build_tiny_model(tmp_path / "tiny")
    daemon = start_daemon(args=[], extra_config={
        "backend": {"kind": "remote", "url": scripted.url, "tokenizer": str(tiny)},
        "completion": {"max_lines": 400}})

    async def scenario() -> tuple[dict[str, Any], dict[str, Any]]:
        async with await daemon.connect() as ws:
            doc = {"uri": "file:///project/p.py", "suffix": "", "multiline": "multi", "max_tokens": 2000}
            await ws.send(json.dumps({"type": "complete", "id": "a", "prefix": "PRIMES = [\n", **doc}))
            async with asyncio.timeout(30):
                while json.loads(await ws.recv()).get("type") != "delta":
                    pass
                await ws.send(json.dumps({"type": "complete", "id": "b", "prefix": "PRIMES = [\n    2,\n", **doc}))
                ends: dict[str, dict[str, Any]] = {}
                b_streams = False
                while "a" not in ends or not b_streams:   # b reached the engine: cancelling it closes a stream
                    frame = json.loads(await ws.recv())
                    if frame["type"] in ("done", "error"):
                        ends[frame["id"]] = frame
                    b_streams = b_streams or (frame["type"] == "delta" and frame.get("id") == "b")
                await ws.send(json.dumps({"type": "cancel", "id": "b"}))
                while "b" not in ends:
                    frame = json.loads(await ws.recv())
                    if frame["type"] in ("done", "error"):
                        ends[frame["id"]] = frame
            return ends["a"], ends["b"]

    a, b = asyncio.run(scenario())
    assert a["type"] == "done" and a["finish_reason"] == "superseded", a
    assert b["type"] == "done" and b["finish_reason"] == "cancelled", b
    assert scripted.client_gone.wait(2.0) and scripted.attempts == 2
    assert daemon.health()["counters"]["remote_upstream_closed"] == 2


def test_daemon_falls_back_to_its_local_model(start_daemon: Any, tmp_path: Path) -> None:
    """A real ``soldaemon serve`` with the engine down and fallback_local:
    the completion comes from the local (tiny) model; health says so."""
    from soldaemon_bench.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    url = f"http://127.0.0.1:{_free_port()}"
    daemon = start_daemon(args=["--model", str(tiny)], extra_config={
        "backend": {"kind": "remote", "url": url, "fallback_local": True, "retries": 0}})
    assert f"remote {url}/v1" in daemon.ready_line
    _, done = asyncio.run(_complete(daemon, "f1", "def add(a, b):\n    return ", "\n", max_tokens=8))
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length"), done
    assert done["timings"]["generated_tokens"] > 0
    counters = daemon.health()["counters"]
    assert counters["remote_reachable"] is False and counters["remote_fallbacks"] == 1
    assert counters["fallback_local"] == "ready"


# --------------------------------------------------------------------------
# A real engine: llama-cpp-python's OpenAI-compatible server
# --------------------------------------------------------------------------

# what `python -m llama_cpp.server` imports (the [server] extra)
HAVE_LLAMA_SERVER = all(importlib.util.find_spec(m) is not None for m in (
    "llama_cpp", "fastapi", "uvicorn", "sse_starlette", "starlette_context", "pydantic_settings"))


def _need_llama_server() -> None:
    from tests.fixtures.require import require

    require(HAVE_LLAMA_SERVER, "llama-cpp-python's server (llama_cpp.server)", "pip install -e '.[bench]'")


class LlamaServer:
    """``python -m llama_cpp.server`` on the embedded GGUF, on a fixed port
    (so it can be killed and started again at the same URL)."""

    def __init__(self, gguf: Path, log_dir: Path) -> None:
        self.gguf = gguf
        self.port = _free_port()
        self.log_dir = log_dir
        self.proc: subprocess.Popen[bytes] | None = None
        self.log_path = log_dir / "llama-server-0.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path = self.log_dir / f"llama-server-{time.monotonic_ns()}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llama_cpp.server", "--model", str(self.gguf), "--host", "127.0.0.1",
                 "--port", str(self.port), "--n_threads", "1", "--n_ctx", "4096", "--model_alias", "qwen-coder"],
                stdout=log, stderr=subprocess.STDOUT, env={k: v for k, v in os.environ.items()
                                                           if "proxy" not in k.lower()})
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise AssertionError("llama server did not start:\n" + self.log())

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def cpu_s(self) -> float:
        assert self.proc is not None
        t = psutil.Process(self.proc.pid).cpu_times()
        return t.user + t.system


@pytest.fixture(scope="module")
def llama_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    _need_llama_server()
    from soldaemon import paths
    from soldaemon.weights.embedded import QWEN25_CODER_05B, assemble_gguf

    gguf = assemble_gguf(paths.cache_dir() / "models" / "gguf" / f"{QWEN25_CODER_05B.name}.gguf", progress=False)
    server = LlamaServer(gguf, tmp_path_factory.mktemp("llama"))
    server.start()
    yield server
    server.kill()


@pytest.fixture(scope="module")
def remote_daemon(llama_server: LlamaServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """``soldaemon serve`` with ``backend.kind: remote`` at the llama server;
    the tokenizer comes from the (real) model cache of this machine."""
    from soldaemon.weights.loader import tokenizer_dir
    from tests.fixtures.daemon import Daemon, spawn

    tok_dir, _ = tokenizer_dir(None, progress=False)
    daemon = spawn(tmp_path_factory.mktemp("remote-daemon"), args=[], extra_config={
        "backend": {"kind": "remote", "url": llama_server.url, "tokenizer": str(tok_dir), "backoff_s": 0.5,
                    "max_backoff_s": 2, "timeout_s": 60, "health_interval_s": 0.5},
        "completion": {"max_lines": 400},
    })
    assert isinstance(daemon, Daemon)
    yield daemon
    daemon.stop()


async def _complete(daemon: Any, rid: str, prefix: str, suffix: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    async with await daemon.connect() as ws:
        await ws.send(json.dumps({"type": "complete", "id": rid, "uri": "file:///project/a.py", "prefix": prefix,
                                  "suffix": suffix, **fields}))
        streamed = ""
        async with asyncio.timeout(180):
            while True:
                frame = json.loads(await ws.recv())
                if frame.get("id") != rid:
                    continue
                if frame["type"] == "delta":
                    streamed += frame["text"]
                else:
                    return streamed, frame


PRIMES = ("# the first 1000 prime numbers, one per line\nPRIMES = [\n    2,\n    3,\n    5,\n    7,\n", "")


@pytest.mark.slow
def test_daemon_streams_from_a_real_engine(remote_daemon: Any, llama_server: LlamaServer) -> None:
    ready = remote_daemon.ready_line
    assert "model=qwen-coder" in ready and f"remote {llama_server.url}/v1" in ready
    prefix = "def fibonacci(n):\n    if n < 2:\n        return n\n    return "
    streamed, done = asyncio.run(_complete(remote_daemon, "s1", prefix, "\n\n\nprint(fibonacci(10))\n",
                                           max_tokens=32))
    assert done["type"] == "done" and done["finish_reason"] in ("stop", "length"), done
    item = done["items"][0]
    assert "fibonacci(n" in item, item
    assert streamed and item.startswith(streamed.rstrip())
    t = done["timings"]
    assert t["prompt_tokens"] > 10 and t["generated_tokens"] > 0 and 0 < t["ttft_ms"] <= t["total_ms"]
    health = remote_daemon.health()
    counters = health["counters"]
    assert counters["backend"] == "remote" and counters["remote_reachable"] is True
    assert counters["remote_url"] == f"{llama_server.url}/v1" and "qwen-coder" in counters["remote_models"]
    assert health["engine"]["url"] == f"{llama_server.url}/v1" and health["sol_diagnosis"]["active"] is True
    assert remote_daemon.metric("sol_requests_total") >= 1 and remote_daemon.metric("sol_generated_tokens_total") > 0


@pytest.mark.slow
def test_cancel_stops_the_real_engine(remote_daemon: Any, llama_server: LlamaServer) -> None:
    """A completion that would run for 1500 tokens is cancelled after its
    first delta: the daemon closes the upstream stream, the llama server logs
    the disconnect and stops computing (its CPU time stops growing)."""

    async def scenario() -> tuple[float, float, float, dict[str, Any]]:
        async with await remote_daemon.connect() as ws:
            await _start_long(ws, "long")
            # generating: one second of the engine's CPU time as the control
            c0 = llama_server.cpu_s()
            await asyncio.sleep(1.0)
            busy = llama_server.cpu_s() - c0
            t0 = time.monotonic()
            await ws.send(json.dumps({"type": "cancel", "id": "long"}))
            async with asyncio.timeout(10):
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("id") == "long" and frame["type"] != "delta":
                        break
            cancel_s = time.monotonic() - t0
            await asyncio.sleep(1.0)  # the engine finishes the token it was computing
            c1 = llama_server.cpu_s()
            await asyncio.sleep(1.5)
            idle = (llama_server.cpu_s() - c1) / 1.5
            return busy, idle, cancel_s, frame

    busy, idle, cancel_s, done = asyncio.run(scenario())
    print(f"engine CPU {busy:.2f} CPU-s/s generating, {idle:.3f} after the cancel; cancel→done {cancel_s * 1000:.0f} ms")
    assert done["type"] == "done" and done["finish_reason"] == "cancelled", done
    assert cancel_s < 5.0               # the 1500 tokens would take minutes; a busy machine may take a second
    assert "Disconnected from client" in llama_server.log()
    assert busy > 0.2, f"the engine was not computing before the cancel ({busy:.2f} CPU-s/s)"
    assert idle < busy / 4, f"the engine kept computing after the cancel: {idle:.2f} vs {busy:.2f} CPU-s/s"


async def _start_long(ws: Any, rid: str) -> None:
    """Send a completion that would run for 1500 tokens; return at its first delta."""
    await ws.send(json.dumps({"type": "complete", "id": rid, "prefix": PRIMES[0], "suffix": PRIMES[1],
                              "multiline": "multi", "max_tokens": 1500}))
    async with asyncio.timeout(120):
        while json.loads(await ws.recv()).get("type") != "delta":
            pass


@pytest.mark.slow
def test_engine_killed_mid_request_then_restarted(remote_daemon: Any, llama_server: LlamaServer) -> None:
    async def killed() -> tuple[dict[str, Any], float]:
        async with await remote_daemon.connect() as ws:
            await _start_long(ws, "k")
            llama_server.kill()
            t0 = time.monotonic()
            async with asyncio.timeout(10):
                while True:
                    frame = json.loads(await ws.recv())
                    if frame.get("id") == "k" and frame["type"] != "delta":
                        return frame, time.monotonic() - t0

    frame, took = asyncio.run(killed())
    assert frame["type"] == "error" and frame["code"] == "remote_unavailable" and frame["retryable"] is True, frame
    assert took < 5
    # the daemon lives and says the engine is gone; a request fails fast, retryable
    _, again = asyncio.run(_complete(remote_daemon, "k2", "x = ", "\n", max_tokens=4))
    assert again["type"] == "error" and again["retryable"] is True, again
    deadline = time.monotonic() + 10
    while remote_daemon.health()["counters"]["remote_reachable"] is not False:
        assert time.monotonic() < deadline
        time.sleep(0.2)
    # the engine comes back at the same URL: after the back-off, completions work again
    llama_server.start()
    deadline = time.monotonic() + 60
    while True:
        _, frame = asyncio.run(_complete(remote_daemon, f"r{time.monotonic_ns()}", "def add(a, b):\n    return ",
                                         "\n", max_tokens=8))
        if frame["type"] == "done":
            break
        assert frame["retryable"] is True and time.monotonic() < deadline, frame
        time.sleep(0.5)
    assert frame["finish_reason"] in ("stop", "length") and frame["items"][0], frame
    assert remote_daemon.health()["counters"]["remote_reachable"] is True


def test_trace_bench_replays_keystrokes_through_the_remote_backend(tiny_tokenizer: Any, scripted: ScriptedEngine,
                                                                   tmp_path: Path) -> None:
    from soldaemon_bench.trace import make_trace, run_remote

    source = tmp_path / "shapes.py"
    source.write_text("def area(width, height):\n    result = width * height\n    return result\n")

    class Local:  # what run_remote takes from the local engine: its tokenizer and name
        tokenizer = tiny_tokenizer

        def info(self) -> dict[str, Any]:
            return {"model": "tiny"}

    trace = make_trace([source], 1)
    config = config_from_dict({"backend": {"url": scripted.url}})
    results = run_remote(config, Local(), trace, lambda msg: None)
    every, computed = results["remote"], results["remote:model"]
    assert len(every.ttft_ms) == len(trace) and scripted.attempts == len(computed.ttft_ms) > 0
    assert all(p > 0 for p in every.prompt_tokens[:1])


def test_secret_files_never_reach_the_remote_engine(start_daemon: Any, scripted: ScriptedEngine,
                                                    tmp_path: Path) -> None:
    """Through a real daemon on the remote backend: a secret file's context
    chunk is dropped before the prompt is built, and completing inside a
    secret file is refused without a request upstream."""
    from soldaemon_bench.tiny import build_tiny_model

    tiny = build_tiny_model(tmp_path / "tiny")
    daemon = start_daemon(args=[], extra_config={
        "backend": {"kind": "remote", "url": scripted.url, "tokenizer": str(tiny)}})
    context = [{"uri": "file:///p/.env", "text": "helper_function_name=hunter2\n"},
               {"uri": "file:///home/me/.ssh/id_rsa", "text": "helper_function_name hunter2\n"},
               {"uri": "file:///p/util.py", "text": "def helper_function_name():\n    return 42\n"}]

    async def scenario() -> tuple[Any, Any]:
        async with await daemon.connect() as ws:
            _, ok = await complete(ws, "a", "x = helper_function_name(", uri="file:///p/main.py", context=context, max_tokens=8)
            _, refused = await complete(ws, "b", "KEY=", uri="file:///p/.env.local", max_tokens=8)
            return ok, refused

    ok, refused = asyncio.run(scenario())
    assert type(ok).__name__ == "Done", ok
    assert scripted.attempts == 1
    prompt = json.dumps(scripted.bodies[0])
    assert "helper_function_name" in prompt and "hunter2" not in prompt
    assert type(refused).__name__ == "ErrorFrame" and refused.code == "secret_document", refused
