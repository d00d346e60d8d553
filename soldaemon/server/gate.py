"""A websocket connection class that counts each socket in a
:class:`~soldaemon.server.handshake.HandshakeGate` from the TCP accept until its opening
handshake ends. ``serve(..., create_connection=gated_connection(gate, on_evict))``."""

from __future__ import annotations

import asyncio
from typing import Any, Callable

from websockets.asyncio.server import ServerConnection

from soldaemon.server.handshake import HandshakeGate


def gated_connection(gate: HandshakeGate[Any], on_evict: Callable[[str], None]) -> type[ServerConnection]:
    """A :class:`ServerConnection` subclass bound to ``gate``; ``on_evict`` gets the peer of each
    handshake the bounds close."""

    class GatedConnection(ServerConnection):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            peer = transport.get_extra_info("peername")
            host = str(peer[0]) if isinstance(peer, tuple) and peer else "?"
            for victim in gate.admit(self, host):
                on_evict(host)
                victim.transport.abort()

        async def handshake(self, *args: Any, **kwargs: Any) -> None:
            try:
                await super().handshake(*args, **kwargs)
            finally:
                gate.done(self)

        def connection_lost(self, exc: Exception | None) -> None:
            gate.done(self)
            super().connection_lost(exc)

    return GatedConnection
