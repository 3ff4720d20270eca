"""The one h11 driver (anex_agent.net.http.stream): events in order over a real socket pair, output
coalesced until the threshold or a flush, ``before_wait`` before each read, EOF as
``ConnectionClosed``, a broken peer as h11's error, and the same over a dialer-style connection."""

from __future__ import annotations

import asyncio
import socket

import h11
import pytest

from anex_agent.net.http import stream as stream_module
from anex_agent.net.http.stream import FLUSH_AT, H11Stream


async def _pair():
    a, b = socket.socketpair()
    one = await asyncio.open_connection(sock=a)
    other = await asyncio.open_connection(sock=b)
    return one, other


class Recorder:
    """What a transport was asked to write, and the bytes it hands to reads (then EOF)."""

    def __init__(self, incoming: list[bytes]) -> None:
        self.incoming = list(incoming)
        self.writes: list[bytes] = []
        self.reads = 0

    async def recv(self) -> bytes:
        self.reads += 1
        return self.incoming.pop(0) if self.incoming else b""

    async def write(self, data: bytes) -> None:
        self.writes.append(data)


async def test_a_request_and_its_answer_over_asyncio_streams():
    (cr, cw), (sr, sw) = await _pair()
    client = H11Stream.over_streams(h11.CLIENT, cr, cw)
    server = H11Stream.over_streams(h11.SERVER, sr, sw)
    await client.send(h11.Request(method="POST", target="/x", headers=[("Host", "a"), ("Content-Length", "5")]),
                      h11.Data(data=b"hello"), h11.EndOfMessage(), flush=True)
    request = await server.next_event()
    assert isinstance(request, h11.Request) and request.target == b"/x" and server.got_bytes
    assert (await server.next_event()).data == b"hello"
    assert isinstance(await server.next_event(), h11.EndOfMessage)
    await server.send(h11.Response(status_code=204, headers=[]), h11.EndOfMessage(), flush=True)
    assert (await client.next_event()).status_code == 204
    assert isinstance(await client.next_event(), h11.EndOfMessage)
    cw.close()
    sw.close()


async def test_output_waits_for_the_threshold_or_a_flush():
    transport = Recorder([])
    out = H11Stream(h11.CLIENT, transport.recv, transport.write)
    await out.send(h11.Request(method="POST", target="/", headers=[("Host", "a"), ("Transfer-Encoding", "chunked")]))
    await out.send(h11.Data(data=b"x" * 100))
    assert transport.writes == []  # queued: head and first chunk leave together
    await out.send(h11.Data(data=b"y" * FLUSH_AT))
    assert len(transport.writes) == 1 and transport.writes[0].startswith(b"POST / HTTP/1.1")
    await out.send(h11.EndOfMessage())
    assert len(transport.writes) == 1
    await out.flush()
    assert transport.writes[-1] == b"0\r\n\r\n" and len(transport.writes) == 2
    await out.flush()  # nothing queued: nothing written
    assert len(transport.writes) == 2


async def test_before_wait_runs_before_each_read_and_eof_is_connection_closed():
    transport = Recorder([b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n", b"\r\nok"])
    waits = []

    async def before_wait() -> None:
        waits.append(transport.reads)

    client = H11Stream(h11.CLIENT, transport.recv, transport.write)
    await client.send(h11.Request(method="GET", target="/", headers=[("Host", "a")]), h11.EndOfMessage(), flush=True)
    assert (await client.next_event(before_wait)).status_code == 200
    assert waits == [0, 1]  # the head came in two reads, each preceded by the hook
    assert (await client.next_event(before_wait)).data == b"ok"
    assert isinstance(await client.next_event(before_wait), h11.EndOfMessage)
    client.h11.start_next_cycle()
    assert isinstance(await client.next_event(before_wait), h11.ConnectionClosed)  # the empty read: EOF


async def test_a_broken_peer_raises_h11s_error():
    transport = Recorder([b"NOT HTTP AT ALL\r\n\r\n"])
    server = H11Stream(h11.SERVER, transport.recv, transport.write)
    with pytest.raises(h11.RemoteProtocolError):
        await server.next_event()


async def test_over_a_connection_reads_into_its_own_buffer(monkeypatch):
    monkeypatch.setattr(stream_module, "RECV_BUFFER", 8)  # a head longer than one read

    class Conn:
        def __init__(self) -> None:
            self.data = b"GET /long/path HTTP/1.1\r\nHost: a\r\n\r\n"
            self.sent: list[bytes] = []

        async def recv_into(self, view) -> int:
            n = min(len(view), len(self.data))
            view[:n] = self.data[:n]
            self.data = self.data[n:]
            return n

        async def sendall(self, data: bytes) -> None:
            self.sent.append(data)

    conn = Conn()
    server = H11Stream.over_connection(h11.SERVER, conn)
    assert server.conn is conn
    assert (await server.next_event()).target == b"/long/path"
    await server.send(h11.Response(status_code=200, headers=[("Content-Length", "0")]), h11.EndOfMessage(), flush=True)
    assert conn.sent == [b"HTTP/1.1 200 \r\nContent-Length: 0\r\n\r\n"]
