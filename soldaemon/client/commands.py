"""``soldaemon status``, ``stop`` and the daemon half of ``complete``: a light websocket client of
the daemon :mod:`soldaemon.discovery` finds; a pid is signalled only when it is ours."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from soldaemon.api import CompletionRequest, Delta, Done
from soldaemon.discovery import find_daemon, is_our_daemon, pid_exists
from soldaemon.errors import ProtocolError, SolError, Unavailable
from soldaemon.protocol import Complete, ErrorFrame, Health, Status, decode_server, encode_client
from soldaemon.server.auth import authorization_header
from soldaemon.server.settings import SOL_DIAGNOSIS_KEYS

if TYPE_CHECKING:
    from soldaemon.config import Config


async def query_health(url: str, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """Connect, ask ``health``, return the body; raises :class:`Unavailable` if none answers."""
    from websockets.asyncio.client import connect

    try:
        async with asyncio.timeout(timeout):
            async with connect(url, additional_headers=[authorization_header(token)], proxy=None,
                               open_timeout=timeout, compression=None) as ws:
                await ws.send(encode_client(Health("status")))
                while True:
                    msg = decode_server(await ws.recv())
                    if isinstance(msg, Status) and msg.kind == "health":
                        return dict(msg.body)
    except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed, TimeoutError, ProtocolError) as exc:
        raise Unavailable(f"no soldaemon answering at {url} ({type(exc).__name__}: {exc})",
                          hint="start it with: soldaemon serve") from None


def _format_health(url: str, body: Mapping[str, Any]) -> str:
    diag = body.get("sol_diagnosis") or {}
    load = body.get("load") or {}
    proc = body.get("process") or {}
    lines = [
        f"soldaemon {body.get('daemon', '?')} is {body.get('state')} at {url} "
        f"(pid {proc.get('pid', '?')}, up {float(body.get('uptime_s', 0)):.0f} s)",
        f"  model:  {body.get('model')} on {body.get('device')}",
        "  sol:    " + (", ".join(f"{k}={diag.get(k)}" for k in SOL_DIAGNOSIS_KEYS) if diag else "(loading)"),
        f"  load:   {load.get('connections', 0)} connection(s), {load.get('in_flight', 0)} request(s) in flight, "
        f"queue {load.get('queue_depth', 0)}",
    ]
    return "\n".join(lines)


def run_status(args: argparse.Namespace, config: Config) -> int:
    """``soldaemon status``: print the daemon's health; raises Unavailable if none answers."""
    target = find_daemon(config.server.fallback(), url=getattr(args, "url", None))
    body = asyncio.run(query_health(target.url, target.token, getattr(args, "timeout", 5.0) or 5.0))
    print(json.dumps(body, indent=2) if getattr(args, "json", False) else _format_health(target.url, body))
    return 0


async def ask_complete(url: str, token: str, req: CompletionRequest, *, timeout: float = 60.0,
                       on_delta: Callable[[Delta], None] | None = None) -> Done:
    """One completion's ``done`` from the running daemon. Raises :class:`Unavailable` when none
    answers (or it is still loading), else the daemon's error as a :class:`SolError`."""
    from websockets.asyncio.client import connect

    try:
        async with asyncio.timeout(timeout):
            async with connect(url, additional_headers=[authorization_header(token)], proxy=None,
                               open_timeout=min(timeout, 5.0), compression=None,
                               max_size=16 * 1024 * 1024) as ws:
                await ws.send(encode_client(Complete(req)))
                while True:
                    msg = decode_server(await ws.recv())
                    if isinstance(msg, Delta) and msg.id == req.id and on_delta is not None:
                        on_delta(msg)
                    elif isinstance(msg, Done) and msg.id == req.id:
                        return msg
                    elif isinstance(msg, ErrorFrame) and msg.id in (req.id, None):
                        error = Unavailable(msg.message) if msg.code == "unavailable" else SolError(msg.message)
                        error.code = msg.code
                        raise error
    except (OSError, InvalidHandshake, InvalidURI, ConnectionClosed, TimeoutError, ProtocolError) as exc:
        raise Unavailable(f"no soldaemon answering at {url} ({type(exc).__name__}: {exc})") from None


def stop_daemon(config: Config, *, url: str | None = None, timeout: float = 20.0) -> int:
    """``soldaemon stop``: SIGTERM (a graceful drain) to the daemon answering with our token, once
    its health's pid matches the record's and is this user's ``soldaemon serve``; wait for the
    exit. Returns the pid; raises :class:`Unavailable` when none answers, the pid is not our
    daemon's, or it does not exit."""
    target = find_daemon(config.server.fallback(), url=url)
    body = asyncio.run(query_health(target.url, target.token, min(timeout, 5.0)))
    pid = (body.get("process") or {}).get("pid")
    if not isinstance(pid, int) or pid <= 1 or (target.pid is not None and pid != target.pid):
        raise Unavailable(f"the daemon at {target.url} reports pid {pid!r}, its record says {target.pid}",
                          hint="stop it by hand (kill PID), after checking which process it is")
    if not is_our_daemon(pid):
        raise Unavailable(f"{target.url} reports pid {pid}, which is not a soldaemon of this user; nothing signalled",
                          hint="stop the daemon by hand (kill PID), after checking which process it is")
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_exists(pid) and not _zombie(pid):
        if time.monotonic() > deadline:
            raise Unavailable(f"soldaemon (pid {pid}) did not exit within {timeout:g} s",
                              hint=f"kill -9 {pid}")
        time.sleep(0.05)
    return pid


def run_stop(args: argparse.Namespace, config: Config) -> int:
    pid = stop_daemon(config, url=getattr(args, "url", None), timeout=getattr(args, "timeout", 20.0) or 20.0)
    print(f"soldaemon (pid {pid}) stopped")
    return 0


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent (Linux ``/proc``; elsewhere False)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
