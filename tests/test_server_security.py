"""Who may connect, against a real daemon process: no token, a wrong token, a
token in the URL, a foreign Origin, a rebound Host, a real web page in
headless Chromium, a non-loopback bind."""

from __future__ import annotations

import asyncio
import http.client
import http.server
import json
import shutil
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any, Iterator

import pytest
from websockets.asyncio.client import connect
from websockets.asyncio.server import ServerConnection
from websockets.asyncio.server import serve as ws_serve
from websockets.exceptions import InvalidStatus

from tests.fixtures.daemon import FAKE_ENGINE, Daemon, spawn
from tests.fixtures.require import require

PAGE = Path(__file__).parent / "fixtures" / "ws_page.html"


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    d = spawn(tmp_path_factory.mktemp("sec"), args=["--engine", FAKE_ENGINE])
    assert isinstance(d, Daemon)
    yield d
    d.stop()


async def handshake_status(url: str, headers: list[tuple[str, str]], origin: str | None = None) -> int:
    try:
        async with connect(url, additional_headers=headers, origin=origin, proxy=None,  # type: ignore[arg-type]
                           open_timeout=10) as ws:
            await ws.recv()
            return 101
    except InvalidStatus as exc:
        return exc.response.status_code


@pytest.mark.asyncio
async def test_handshake_refusals(daemon: Daemon) -> None:
    good = daemon.auth()
    assert await handshake_status(daemon.url, good) == 101
    assert await handshake_status(daemon.url + "/v1", good) == 101
    assert await handshake_status(daemon.url, []) == 401
    assert await handshake_status(daemon.url, [("Authorization", "Bearer " + "x" * 43)]) == 401
    assert await handshake_status(daemon.url, [("Authorization", daemon.token)]) == 401
    assert await handshake_status(f"{daemon.url}/?token={daemon.token}", []) == 401
    assert await handshake_status(daemon.url, good, origin="https://evil.example") == 403
    assert await handshake_status(daemon.url, [], origin="https://evil.example") == 403
    assert await handshake_status(daemon.url, good, origin="null") == 403
    assert await handshake_status(daemon.url + "/v2", good) == 404
    assert "refused a handshake: Origin not allowed ('https://evil.example')" in daemon.stderr()


def test_http_endpoints_need_the_token_and_a_loopback_host(daemon: Daemon) -> None:
    port = int(daemon.url.rsplit(":", 1)[1])
    for path in ("/healthz", "/metrics"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path)
        response = conn.getresponse()
        assert response.status == 401 and response.getheader("WWW-Authenticate", "").startswith("Bearer")
        assert daemon.token not in response.read().decode()
        conn.close()
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", path, headers={"Host": f"attacker.example:{port}",
                                           "Authorization": f"Bearer {daemon.token}"})
        assert conn.getresponse().status == 403  # DNS rebinding
        conn.close()
        status, _ = daemon.http_get(path, {"Origin": "https://evil.example"})
        assert status == 403
        status, _ = daemon.http_get(path)
        assert status == 200


def test_refusals_do_not_kill_the_daemon(daemon: Daemon) -> None:
    assert daemon.proc.poll() is None
    assert daemon.health()["state"] == "ready"


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def test_a_web_page_in_chromium_cannot_connect(daemon: Daemon, tmp_path: Path) -> None:
    """A page served from another local origin runs ``new WebSocket(...)`` to
    the daemon in real headless Chromium: refused. The same page reaches a
    plain websocket server (control), so the refusal is the daemon's."""
    require(_chromium(), "Debian's chromium", "apt-get install -y chromium")
    reports: list[dict[str, str]] = []
    got = threading.Event()

    class Page(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            body = PAGE.read_bytes()
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self) -> None:  # noqa: N802
            length = int(self.headers.get("Content-Length", "0"))
            reports.append(json.loads(self.rfile.read(length)))
            self.send_response(204)
            self.end_headers()
            got.set()

        def log_message(self, *args: Any) -> None:
            pass

    page_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Page)
    threading.Thread(target=page_server.serve_forever, daemon=True).start()

    control_port: list[int] = []
    control_ready = threading.Event()
    stop_control = threading.Event()

    def run_control() -> None:
        async def echo(ws: ServerConnection) -> None:
            async for message in ws:
                await ws.send("control says hi")

        async def main() -> None:
            async with ws_serve(echo, "127.0.0.1", 0) as server:
                control_port.append(server.sockets[0].getsockname()[1])  # type: ignore[index]
                control_ready.set()
                while not stop_control.is_set():
                    await asyncio.sleep(0.05)

        asyncio.run(main())

    control = threading.Thread(target=run_control, daemon=True)
    control.start()
    assert control_ready.wait(10)
    page_port = page_server.server_address[1]
    targets = [
        {"name": "daemon", "url": daemon.url + "/"},
        {"name": "daemon_token_in_url", "url": f"{daemon.url}/?token={daemon.token}"},
        {"name": "control", "url": f"ws://127.0.0.1:{control_port[0]}/"},
    ]
    query = urllib.parse.urlencode({"targets": json.dumps(targets),
                                    "report": f"http://127.0.0.1:{page_port}/report"})
    browser = subprocess.Popen(
        [str(_chromium()), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--no-proxy-server", f"--user-data-dir={tmp_path / 'chromium-profile'}",
         f"http://127.0.0.1:{page_port}/ws_page.html?{query}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        assert got.wait(90), "the page never reported"
    finally:
        browser.terminate()
        try:
            browser.wait(10)
        except subprocess.TimeoutExpired:
            browser.kill()
            browser.wait(5)
        page_server.shutdown()
        stop_control.set()
        control.join(5)
    result = reports[0]
    print(f"\n[chromium] {result}")
    assert result["control"] == "message:control says hi"  # the browser can do websockets
    assert result["daemon"] in ("error", "close:1006")
    assert result["daemon_token_in_url"] in ("error", "close:1006")
    log = daemon.stderr()
    assert "refused a handshake: Origin not allowed" in log


def test_non_loopback_bind_is_refused_by_default(tmp_path: Path) -> None:
    for i, how in enumerate((["--host", "0.0.0.0"], [])):
        server = {"host": "0.0.0.0"} if not how else {}
        t0 = time.perf_counter()
        out = spawn(tmp_path / str(i), args=["--engine", FAKE_ENGINE, *how], server=server, expect_ready=False,
                    ready_timeout=60)
        assert isinstance(out, subprocess.CompletedProcess)
        assert out.returncode == 2, (how, out.stdout, out.stderr)
        assert "allow_remote" in out.stderr and "Traceback" not in out.stderr
        assert "soldaemon ready" not in out.stdout
        assert time.perf_counter() - t0 < 30


@pytest.mark.asyncio
async def test_allow_remote_still_needs_the_token(start_daemon: Any) -> None:
    d = start_daemon(args=["--engine", FAKE_ENGINE, "--host", "0.0.0.0", "--allow-remote"])
    port = int(d.url.rsplit(":", 1)[1])
    url = f"ws://127.0.0.1:{port}"
    assert await handshake_status(url, []) == 401
    assert await handshake_status(url, d.auth(), origin="https://evil.example") == 403
    assert await handshake_status(url, d.auth()) == 101
