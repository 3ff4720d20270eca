"""The one h11 driver: an h11 connection bound to a byte transport, with coalesced output.

h11 is sans-I/O; :class:`H11Stream` only feeds it the bytes the transport reads and writes
what it produces. Every HTTP/1.1 speaker of the package drives h11 through it: the small
client (:mod:`.client`, ``h11.CLIENT`` over asyncio streams), the small server
(:mod:`.server`, ``h11.SERVER`` over asyncio streams) and the HTTP proxy
(:mod:`anex_agent.frontends.proxy`, both roles over a dialer's connection).

Contract:
* :meth:`H11Stream.next_event` returns h11's next event, reading when h11 needs data (an empty
  read is EOF, which h11 turns into ``ConnectionClosed``); it raises what h11 raises
  (``h11.RemoteProtocolError``) and what the transport raises (OSError). ``before_wait`` runs
  before each read (the proxy flushes the other side's queued output first).
  :attr:`H11Stream.got_bytes` says whether any byte arrived since it was last cleared.
* :meth:`H11Stream.send` queues h11's bytes for its events and writes the queue when
  :data:`FLUSH_AT` bytes wait or ``flush=True``; on loopback and on the mesh every write is a
  packet, so head + body + end of a small message go out as one. Only one task may send on a
  stream at a time.
* :meth:`H11Stream.over_connection` binds it to an :class:`anex_agent.net.dialer.Connection`
  (``recv_into`` a buffer of its own), :meth:`H11Stream.over_streams` to an asyncio stream pair.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import h11

if TYPE_CHECKING:
    from anex_agent.net.dialer import Connection

RECV_BUFFER = 64 * 1024  # bytes read per recv (one per side of each proxied connection: kept modest)
MAX_HEAD_BYTES = 64 * 1024  # request/response line + headers (h11 max_incomplete_event_size)
FLUSH_AT = 64 * 1024  # queued output bytes that trigger a write


class H11Stream:
    """See the module docstring."""

    def __init__(self, role, recv: Callable[[], Awaitable[bytes]], write: Callable[[bytes], Awaitable[None]]) -> None:
        self.h11 = h11.Connection(role, max_incomplete_event_size=MAX_HEAD_BYTES)
        self._recv = recv
        self._write = write
        self._out: list[bytes] = []
        self._out_len = 0
        self.got_bytes = False
        self.conn: Connection | None = None  # over_connection: the connection (its owner closes it)

    @classmethod
    def over_connection(cls, role, conn: Connection) -> H11Stream:
        """Over a dialer's connection, read into a buffer of the stream's own."""
        view = memoryview(bytearray(RECV_BUFFER))

        async def recv() -> bytes:
            n = await conn.recv_into(view)
            return bytes(view[:n])

        stream = cls(role, recv, conn.sendall)
        stream.conn = conn
        return stream

    @classmethod
    def over_streams(cls, role, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *,
                     read_chunk: int = RECV_BUFFER) -> H11Stream:
        """Over an asyncio stream pair (each flush is a write and a drain)."""
        async def recv() -> bytes:
            return await reader.read(read_chunk)

        async def write(data: bytes) -> None:
            writer.write(data)
            await writer.drain()

        return cls(role, recv, write)

    async def next_event(self, before_wait: Callable[[], Awaitable[None]] | None = None):
        """The next h11 event; raises h11.RemoteProtocolError or OSError (see the module docstring)."""
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if before_wait is not None:
                await before_wait()
            data = await self._recv()
            if data:
                self.got_bytes = True
            self.h11.receive_data(data)  # b"" tells h11 about EOF

    async def send(self, *events, flush: bool = False) -> None:
        """Queue ``events``; write the queue when it is large or ``flush`` is set."""
        for event in events:
            data = self.h11.send(event)
            if data:
                self._out.append(data)
                self._out_len += len(data)
        if flush or self._out_len >= FLUSH_AT:
            await self.flush()

    async def flush(self) -> None:
        if not self._out:
            return
        data = self._out[0] if len(self._out) == 1 else b"".join(self._out)
        self._out.clear()
        self._out_len = 0
        await self._write(data)
