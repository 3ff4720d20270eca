"""StreamTransport over a stand-in stream whose send buffer the test fills and frees: bytes keep
their order whatever the buffer does between writes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from anex_agent.netstack.aio import WRITE_HIGH_WATER, StreamTransport


class Conn:
    def __init__(self):
        self.space = 0
        self.sent = bytearray()  # what reached the send buffer, in order

    def write(self, data) -> int:
        n = min(self.space, len(data))
        self.sent += bytes(data[:n])
        self.space -= n
        return n


class Stream:
    """The parts of TcpStream the transport uses; ``freed`` wakes a waiting sendall."""

    def __init__(self):
        self.conn = Conn()
        self._rt = SimpleNamespace(kick=lambda: None)
        self.freed = asyncio.Event()
        self.waiting = asyncio.Event()  # a sendall waits for room
        self.closed = asyncio.Event()

    async def sendall(self, data) -> None:
        view = memoryview(data)
        while view:
            view = view[self.conn.write(view):]
            if view:
                self.freed.clear()
                self.waiting.set()
                await self.freed.wait()

    async def recv_into(self, buf) -> int:
        await self.closed.wait()
        return 0

    async def aclose(self) -> None:
        self.closed.set()

    def abort(self) -> None:
        self.closed.set()


class Recorder(asyncio.Protocol):
    def __init__(self):
        self.events = []

    def pause_writing(self):
        self.events.append("pause")

    def resume_writing(self):
        self.events.append("resume")


async def test_a_write_after_the_buffer_freed_does_not_overtake_what_waits():
    stream, protocol = Stream(), Recorder()
    transport = StreamTransport(stream, protocol, ("10.254.0.9", 40000), ("10.254.0.2", 2222))
    pump = asyncio.create_task(transport.pump(), name="pump")
    first = b"A" * (WRITE_HIGH_WATER + 10)
    transport.write(first)  # the buffer is full: all of it waits for the writer
    await stream.waiting.wait()  # the writer is sending it, blocked on the full buffer
    stream.conn.space = 1 << 30  # an ACK frees the buffer; the writer has not run yet
    transport.write(b"B" * 100)  # must queue behind the first write, not go straight in
    stream.freed.set()
    transport.close()
    await asyncio.wait_for(pump, 10)
    assert bytes(stream.conn.sent) == first + b"B" * 100
    assert protocol.events == ["pause", "resume"]  # more than the high-water mark waited, then all went
