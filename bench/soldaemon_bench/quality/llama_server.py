"""Run llama.cpp's ``llama-server`` the way llama.vscode tells its users to,
and talk ``/infill`` to it.

llama.vscode's README gives these CPU-only commands (``-hf`` fetches the
model; here ``-m`` is the daemon's own embedded GGUF instead)::

    llama-server -hf ggml-org/Qwen2.5-Coder-1.5B-Q8_0-GGUF --port 8012 -ub 512 -b 512 --ctx-size 0 --cache-reuse 256
    llama-server -hf ggml-org/Qwen2.5-Coder-0.5B-Q8_0-GGUF --port 8012 -ub 1024 -b 1024 --ctx-size 0 --cache-reuse 256

So: ``-ub``/``-b`` 1024 for the 0.5B and 512 for the larger model, the
model's own context (``--ctx-size 0``), KV-cache reuse by shifting chunks of
at least 256 tokens, everything else at llama.cpp's defaults (flash attention
``auto``, which enables it on the CPU; slots auto). ``-ngl`` is left out: no
GPU. Two deviations, both so the peer gets the same machine as the daemon:
``-t``/``-tb`` set to the daemon's thread count, and the port is a free one
on 127.0.0.1 rather than 8012.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from soldaemon_bench.quality.llama_server_build import ServerBinary


class ServerError(RuntimeError):
    """The server did not start, or answered an error; the message says which."""


def server_args(gguf: Path, port: int, threads: int, *, small_model: bool = True,
                slot_dir: Path | None = None) -> list[str]:
    """llama.vscode's documented CPU command line for ``gguf`` (see the
    module doc). ``small_model``: the 0.5B's batch sizes (1024) rather than
    the 1.5B's (512). ``slot_dir``: a cold server, for the quality column,
    whose holes must not reuse each other's prompts (the daemon's column
    runs cold too): no host-memory prompt cache (``--cache-ram 0``), and
    ``--slot-save-path`` so that ``/slots/N?action=erase`` is allowed (the
    server refuses slot actions without it; nothing is saved there)."""
    batch = "1024" if small_model else "512"
    args = ["-m", str(gguf), "--host", "127.0.0.1", "--port", str(port), "-ub", batch, "-b", batch,
            "--ctx-size", "0", "--cache-reuse", "256", "-t", str(threads), "-tb", str(threads)]
    if slot_dir is not None:
        args += ["--cache-ram", "0", "--slot-save-path", str(slot_dir)]
    return args


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the bench that started it
    dies (Linux ``prctl(PR_SET_PDEATHSIG)``), so a killed run leaves no server."""
    import ctypes
    import signal

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class LlamaServer:
    """A running ``llama-server``; ``stop()`` (or leaving the ``with``) ends it."""

    binary: ServerBinary
    gguf: Path
    threads: int
    small_model: bool = True
    cold: bool = False
    log_path: Path | None = None
    port: int = 0
    proc: subprocess.Popen[bytes] | None = None
    _slot_dir: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def args(self) -> list[str]:
        if self.cold and self._slot_dir is None:
            self._slot_dir = tempfile.TemporaryDirectory(prefix="llama-slots-")
        slot_dir = Path(self._slot_dir.name) if self._slot_dir is not None else None
        return server_args(self.gguf, self.port, self.threads, small_model=self.small_model, slot_dir=slot_dir)

    def start(self, timeout_s: float = 300.0) -> LlamaServer:
        """Start it and wait until ``/health`` answers 200 (the model is
        loaded). Raises ServerError with the log's tail when it exits or
        does not get ready within ``timeout_s``."""
        if not self.gguf.is_file():
            raise ServerError(f"the GGUF {self.gguf} does not exist")
        self.port = self.port or free_port()
        log = open(self.log_path, "wb") if self.log_path else subprocess.DEVNULL
        self.proc = subprocess.Popen([str(self.binary.path), *self.args()], stdout=log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL,
                                     preexec_fn=_die_with_parent if sys.platform == "linux" else None)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise ServerError(f"llama-server exited {self.proc.returncode} while starting{self._log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.stop()
        raise ServerError(f"llama-server was not ready within {timeout_s:.0f} s{self._log_tail()}")

    def _log_tail(self) -> str:
        if self.log_path and self.log_path.is_file():
            return ": " + self.log_path.read_text(errors="replace")[-1500:]
        return ""

    def post(self, route: str, body: dict[str, Any], timeout_s: float = 300.0) -> dict[str, Any]:
        """POST ``body`` as JSON to ``route``; the JSON answer. Raises
        ServerError on an HTTP error (with the server's message)."""
        req = urllib.request.Request(f"{self.url}{route}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"}, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                return dict(json.loads(resp.read()))
        except urllib.error.HTTPError as exc:
            raise ServerError(f"llama-server {route}: HTTP {exc.code}: {exc.read()[:500]!r}") from exc

    def infill(self, body: dict[str, Any]) -> dict[str, Any]:
        return self.post("/infill", body)

    def erase_slots(self) -> None:
        """Drop every slot's KV cache (``POST /slots/N?action=erase``), so the
        next request computes its whole prompt."""
        with urllib.request.urlopen(f"{self.url}/slots", timeout=30) as resp:
            slots = json.loads(resp.read())
        for slot in slots:
            self.post(f"/slots/{slot['id']}?action=erase", {})

    def stop(self) -> None:
        """End the server (SIGTERM, then SIGKILL after 10 s). Idempotent."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._slot_dir is not None:
            self._slot_dir.cleanup()
            self._slot_dir = None

    def __enter__(self) -> LlamaServer:
        return self.start() if self.proc is None else self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def default_threads() -> int:
    """The daemon's default: torch's intra-op threads (one per core)."""
    try:
        import torch

        return int(torch.get_num_threads())
    except ImportError:
        return os.cpu_count() or 1
