"""Frame writes batched per turn of the event loop, for both ends of the read port
(rpc/readport.py's server, rpc/readport_client.py's client)."""

from __future__ import annotations

import asyncio

__all__ = ["Corked"]


class Corked:
    """Frames written to one connection within one turn of the event loop go out as one write
    (one send on the socket) at the end of that turn: at concurrency, several reads asked or
    answered in the same turn cost one system call and one wake-up of the peer, not one each. A
    lone frame waits no longer than the rest of the turn.

    ReadPortClient.send_now writes past it, straight to the transport, ahead of frames corked
    earlier in the same turn: safe because every frame is whole in one write and requests are
    matched to answers by id, not by order."""

    def __init__(self, transport: asyncio.WriteTransport) -> None:
        self.transport = transport
        self._parts: list[bytes] = []

    def write(self, frame: bytes) -> None:
        if not self._parts:
            asyncio.get_running_loop().call_soon(self.flush)
        self._parts.append(frame)

    def flush(self) -> None:
        if not self._parts:
            return
        parts, self._parts = self._parts, []
        if not self.transport.is_closing():
            self.transport.write(parts[0] if len(parts) == 1 else b"".join(parts))
