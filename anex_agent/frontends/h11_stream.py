"""An h11 connection bound to a :class:`anex_agent.net.dialer.Connection`, with coalesced output.

The thin I/O driver the proxy uses on both sides (client: ``h11.SERVER``; origin:
``h11.CLIENT``). h11 itself is sans-I/O; this class only feeds it bytes and writes
what it produces.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import h11

from anex_agent.net.dialer import Connection

RECV_BUFFER = 64 * 1024  # bytes read per recv (one per side of each proxied connection: kept modest)
MAX_HEAD_BYTES = 64 * 1024  # request/response line + headers (h11 max_incomplete_event_size)
FLUSH_AT = 64 * 1024  # queued output bytes that trigger a write


class H11Stream:
    """An h11 connection bound to a :class:`Connection`.

    Output is coalesced: :meth:`send` queues h11's bytes and writes them once
    :data:`FLUSH_AT` bytes are waiting or ``flush=True``; callers flush before they
    wait for input (``next_event(before_wait=...)``). On loopback and on the mesh every
    write is a packet, so head + body + end of a small message go out as one.
    Only one task may write to a stream at a time.
    """

    def __init__(self, role, conn: Connection) -> None:
        self.h11 = h11.Connection(role, max_incomplete_event_size=MAX_HEAD_BYTES)
        self.conn = conn
        self._buf = bytearray(RECV_BUFFER)
        self._view = memoryview(self._buf)
        self._out: list[bytes] = []
        self._out_len = 0

    async def next_event(self, before_wait: Callable[[], Awaitable[None]] | None = None):
        """The next h11 event; raises h11.RemoteProtocolError or OSError.

        ``before_wait`` runs each time the peer's bytes must be awaited (to flush the
        other side's queued output first).
        """
        while True:
            event = self.h11.next_event()
            if event is not h11.NEED_DATA:
                return event
            if before_wait is not None:
                await before_wait()
            n = await self.conn.recv_into(self._view)
            self.h11.receive_data(bytes(self._view[:n]))  # b"" tells h11 about EOF

    async def send(self, event, *, flush: bool = False) -> None:
        """Queue ``event``; write the queue when it is large or ``flush`` is set."""
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
        await self.conn.sendall(data)
