"""``soldaemon status``: ask the running daemon for its health.

Light on purpose (a websocket client, no server, no torch): the daemon is
found by :mod:`soldaemon.discovery`, as sol-lsp finds it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import TYPE_CHECKING, Any, Mapping

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI

from soldaemon.auth import authorization_header
from soldaemon.discovery import find_daemon
from soldaemon.errors import ProtocolError, Unavailable
from soldaemon.protocol import Health, Status, decode_server, encode_client
from soldaemon.server.settings import SOL_DIAGNOSIS_KEYS

if TYPE_CHECKING:
    from soldaemon.config import Config


async def query_health(url: str, token: str, timeout: float = 5.0) -> dict[str, Any]:
    """Connect, ask ``health``, return the status body. Raises
    :class:`Unavailable` when no daemon answers."""
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
    """``soldaemon status``: print the running daemon's health. Raises
    :class:`Unavailable` when none answers."""
    target = find_daemon(config, url=getattr(args, "url", None))
    body = asyncio.run(query_health(target.url, target.token, getattr(args, "timeout", 5.0) or 5.0))
    print(json.dumps(body, indent=2) if getattr(args, "json", False) else _format_health(target.url, body))
    return 0
