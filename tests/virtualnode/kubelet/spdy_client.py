"""A SPDY/3.1 client for tests, on our own core (client side): what kubectl's spdystream does.

:func:`connect` sends the upgrade request and returns the 101's status and headers and a
:class:`Client` whose streams are collected as they come (``data``, ``ended``, ``reset``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from anex_agent.virtualnode.kubelet.streams import spdy


@dataclass
class ClientStream:
    id: int
    data: bytearray = field(default_factory=bytearray)
    ended: asyncio.Event = field(default_factory=asyncio.Event)
    replied: asyncio.Event = field(default_factory=asyncio.Event)
    reset: bool = False


class Client:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.conn = spdy.Connection(client=True)
        self.streams: dict[int, ClientStream] = {}
        self.goaway = asyncio.Event()
        self.closed = asyncio.Event()
        self.changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._read(), name="test spdy client: read")

    async def _read(self) -> None:
        try:
            while data := await self.reader.read(65536):
                for event in self.conn.receive_data(data):
                    stream = self.streams.get(getattr(event, "stream_id", -1))
                    if isinstance(event, spdy.StreamReplied) and stream:
                        stream.replied.set()
                    elif isinstance(event, spdy.DataReceived) and stream:
                        stream.data += event.data
                        self.conn.acknowledge_received(event.stream_id, len(event.data))
                    elif isinstance(event, spdy.StreamEnded) and stream:
                        stream.ended.set()
                    elif isinstance(event, spdy.StreamReset) and stream:
                        stream.reset = True
                        stream.ended.set()
                    elif isinstance(event, spdy.GoAwayReceived):
                        self.goaway.set()
                self.changed.set()
                await self.flush()
        except (ConnectionError, OSError):
            pass
        finally:
            self.closed.set()
            for stream in self.streams.values():
                stream.ended.set()
            self.changed.set()

    async def flush(self) -> None:
        data = self.conn.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)
            await self.writer.drain()

    async def open(self, **headers: str) -> ClientStream:
        stream_id = self.conn.open_stream(headers)
        stream = self.streams[stream_id] = ClientStream(stream_id)
        await self.flush()
        replied = asyncio.ensure_future(stream.replied.wait())
        ended = asyncio.ensure_future(stream.ended.wait())  # reset, or the connection closed
        await asyncio.wait({replied, ended}, return_when=asyncio.FIRST_COMPLETED)  # as spdystream waits
        replied.cancel()
        ended.cancel()
        return stream

    async def send(self, stream: ClientStream, data: bytes, *, fin: bool = False) -> None:
        self.conn.send_data(stream.id, data, fin=fin)
        await self.flush()

    async def end(self, stream: ClientStream) -> None:
        self.conn.end_stream(stream.id)
        await self.flush()

    async def wait_for(self, predicate) -> None:
        while not predicate():
            self.changed.clear()
            await self.changed.wait()

    async def close(self) -> None:
        self.writer.close()
        await self.closed.wait()
        self._task.cancel()


async def connect(host: str, port: int, path: str, protocols: str, *, upgrade: str = "SPDY/3.1"
                  ) -> tuple[int, dict[str, str], bytes, Client | None]:
    """(status, headers, body, client): a client only when the answer is 101."""
    reader, writer = await asyncio.open_connection(host, port)
    writer.write((f"POST {path} HTTP/1.1\r\nHost: kubelet\r\nConnection: Upgrade\r\nUpgrade: {upgrade}\r\n"
                  f"X-Stream-Protocol-Version: {protocols}\r\nContent-Length: 0\r\n\r\n").encode())
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        if ":" in line:
            name, value = line.split(":", 1)
            headers[name.strip().lower()] = value.strip()
    if status != 101:
        body = await reader.readexactly(int(headers.get("content-length") or 0))
        writer.close()
        return status, headers, body, None
    return status, headers, b"", Client(reader, writer)
