"""The remote backend's HTTP layer (soldaemon.remote.stream and .probe over
httpx) against real loopback servers, plain and TLS: what the engine sends
is bounded, the environment's proxies are not used, and close() from
another thread ends a request at once, before the engine answered too."""

from __future__ import annotations

import http.server
import shutil
import socket
import ssl
import subprocess
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from soldaemon.errors import RemoteBadResponse, RemoteHttpError
from soldaemon.remote.endpoint import Endpoint
from soldaemon.remote.probe import Probe
from soldaemon.remote.stream import MAX_LINE, CouldNotConnect, UpstreamStream

EVENT = b'data: {"choices": [{"text": "ok", "index": 0, "finish_reason": "stop"}]}\n\ndata: [DONE]\n\n'


class Engine:
    """A loopback server whose ``POST`` answer is ``answer(handler)``;
    ``GET`` lists one model. Records each request's headers."""

    def __init__(self, answer: Callable[[Any], None], tls: ssl.SSLContext | None = None) -> None:
        self.headers: list[dict[str, str]] = []
        self.left = threading.Event()       # the client went away while we were still writing
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                outer.headers.append(dict(self.headers))
                _send(self, 200, "application/json", b'{"data": [{"id": "m"}]}')

            def do_POST(self) -> None:
                outer.headers.append(dict(self.headers))
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                try:
                    answer(self)
                except OSError:
                    outer.left.set()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        if tls is not None:
            self.server.socket = tls.wrap_socket(self.server.socket, server_side=True)
        scheme = "https" if tls is not None else "http"
        self.url = f"{scheme}://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _send(h: Any, status: int, ctype: str, body: bytes) -> None:
    h.send_response(status)
    h.send_header("Content-Type", ctype)
    h.send_header("Content-Length", str(len(body)))
    h.end_headers()
    h.wfile.write(body)


def _ok(h: Any) -> None:
    _send(h, 200, "text/event-stream", EVENT)


def _hang(h: Any) -> None:
    time.sleep(3.0)


@pytest.fixture
def serve() -> Iterator[Callable[..., Engine]]:
    started: list[Engine] = []

    def start(answer: Callable[[Any], None], tls: ssl.SSLContext | None = None) -> Engine:
        started.append(Engine(answer, tls))
        return started[-1]

    yield start
    for engine in started:
        engine.close()


def _stream(url: str, timeout_s: float = 5.0) -> UpstreamStream:
    return UpstreamStream(Endpoint.parse(url), {"prompt": "x", "stream": True},
                          {"Content-Type": "application/json", "User-Agent": "soldaemon"},
                          connect_timeout_s=2.0, timeout_s=timeout_s)


def _texts(stream: UpstreamStream) -> list[str]:
    stream.open()
    try:
        return [p.text for p in stream.pieces()]
    finally:
        stream.release()


def test_the_environments_proxies_are_not_used(serve: Callable[..., Engine],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    """backend.url is where the request goes: a proxy variable (here one
    nobody listens on) changes nothing, for the stream and the probe."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
        monkeypatch.setenv(var, dead)
    for var in ("NO_PROXY", "no_proxy"):
        monkeypatch.delenv(var, raising=False)
    engine = serve(_ok)
    assert _texts(_stream(engine.url)) == ["ok"]
    probe = Probe(Endpoint.parse(engine.url), {}, 60.0, 2.0)
    state = probe.probe_now()
    assert state.reachable is True and state.models == ("m",)


def test_sends_our_headers_and_asks_for_no_compression(serve: Callable[..., Engine]) -> None:
    engine = serve(_ok)
    _texts(_stream(engine.url))
    sent = engine.headers[-1]
    assert sent["Accept-Encoding"] == "identity" and sent["User-Agent"] == "soldaemon"
    assert sent["Host"] == engine.url.removeprefix("http://")


def test_a_line_over_the_bound_ends_the_request(serve: Callable[..., Engine]) -> None:
    """An endless line is refused once it passes MAX_LINE, not buffered on."""
    def endless(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        h.wfile.write(b"data: " + b"x" * (MAX_LINE + 1024))
        h.wfile.flush()
        time.sleep(5.0)

    engine = serve(endless)
    t0 = time.monotonic()
    with pytest.raises(RemoteBadResponse, match=f"over {MAX_LINE} bytes"):
        _texts(_stream(engine.url))
    assert time.monotonic() - t0 < 3.0


def test_an_error_body_is_read_only_up_to_its_bound(serve: Callable[..., Engine]) -> None:
    """A 500 announcing 1 GB: the message comes from the first bytes, at
    once; the rest is never read."""
    def huge(h: Any) -> None:
        h.send_response(500)
        h.send_header("Content-Type", "application/json")
        h.send_header("Content-Length", str(1 << 30))
        h.end_headers()
        h.wfile.write(b'{"error": {"message": "' + b"m" * (1 << 20))
        h.wfile.flush()
        time.sleep(5.0)

    engine = serve(huge)
    stream = _stream(engine.url)
    t0 = time.monotonic()
    with pytest.raises(RemoteHttpError) as info:
        stream.open()
    stream.release()
    assert time.monotonic() - t0 < 3.0
    assert info.value.status == 500 and "HTTP 500 Internal Server Error: " in info.value.message
    assert len(info.value.message) < 500


def _close_while_waiting(url: str) -> tuple[UpstreamStream, float]:
    """open() on another thread against an engine that answers after 3 s;
    close() 0.3 s in. Returns the stream and how long open() went on after."""
    stream = _stream(url, timeout_s=10.0)
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            stream.open()
            outcome.append(None)
        except BaseException as exc:  # handed to the test below
            outcome.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.3)
    t0 = time.monotonic()
    stream.close()
    thread.join(5.0)
    after = time.monotonic() - t0
    stream.release()
    assert outcome == [None], outcome
    return stream, after


def test_close_ends_the_wait_for_the_answer_at_once(serve: Callable[..., Engine]) -> None:
    stream, after = _close_while_waiting(serve(_hang).url)
    assert stream.closed and after < 1.0      # the engine would answer 2.7 s later
    assert list(stream.pieces()) == []


def test_close_mid_stream_frees_the_engine(serve: Callable[..., Engine]) -> None:
    def forever(h: Any) -> None:
        h.send_response(200)
        h.send_header("Content-Type", "text/event-stream")
        h.end_headers()
        for i in range(500):
            h.wfile.write(b'data: {"choices": [{"text": "%d", "index": 0}]}\n\n' % i)
            h.wfile.flush()
            time.sleep(0.02)

    engine = serve(forever)
    stream = _stream(engine.url)
    stream.open()
    pieces = stream.pieces()
    assert next(pieces).text == "0"
    stream.close()
    assert list(pieces) == []                 # ends quietly, no error
    stream.release()
    assert engine.left.wait(2.0)              # the engine's next write failed


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
                    "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    return ctx, cert


def test_tls_checks_the_certificate_against_the_system_store(serve: Callable[..., Engine], tmp_path: Path) -> None:
    ctx, _ = _tls(tmp_path)
    engine = serve(_ok, ctx)
    with pytest.raises(CouldNotConnect, match="CERTIFICATE_VERIFY_FAILED|certificate verify failed"):
        _stream(engine.url).open()


def test_tls_streams_and_closes_at_once(serve: Callable[..., Engine], tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """With the engine's certificate in the trusted store (SSL_CERT_FILE, as
    OpenSSL reads it): the stream works, and close() reaches the TLS socket."""
    ctx, cert = _tls(tmp_path)
    monkeypatch.setenv("SSL_CERT_FILE", str(cert))
    assert _texts(_stream(serve(_ok, ctx).url)) == ["ok"]
    stream, after = _close_while_waiting(serve(_hang, ctx).url)
    assert stream.closed and after < 1.0
