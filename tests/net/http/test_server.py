"""The agent API's HTTP server (anex_agent.net.http.server): keep-alive, malformed requests, a
streamed answer written as it comes and ended when the caller goes away, and the same server
over a stream an engine hands over (the protocol factory)."""

from __future__ import annotations

import asyncio
import json
import logging

import h11
import pytest

from anex_agent.net.http.server import MALFORMED, HttpServer, Request, Response, StreamResponse, json_response


class Recorder:
    def __init__(self) -> None:
        self.peers: list = []
        self.stream_closed = asyncio.Event()
        self.release = asyncio.Event()

    async def handle(self, request: Request):
        self.peers.append(request.peername)
        if request.path == "/stream":
            return StreamResponse(self.lines())
        if request.path == "/echo":
            body = b"".join([c async for c in request.chunks()])
            return json_response({"method": request.method, "query": request.query, "bytes": len(body),
                                  "auth": request.headers.get("authorization")})
        return Response(body=b"hello\n")

    async def lines(self):
        try:
            yield b"first\n"
            await self.release.wait()
            yield b"second\n"
        finally:
            self.stream_closed.set()


async def roundtrip(reader, writer, data: bytes) -> bytes:
    writer.write(data)
    await writer.drain()
    head = await reader.readuntil(b"\r\n\r\n")
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")))
    return head + await reader.readexactly(length)


async def test_keep_alive_query_headers_and_body():
    rec = Recorder()
    server = HttpServer(rec.handle)
    await server.listen("127.0.0.1", 0)
    port = next(iter(server._servers.values())).sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        first = await roundtrip(reader, writer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert first.startswith(b"HTTP/1.1 200") and first.endswith(b"hello\n")
        second = await roundtrip(reader, writer, b"PUT /echo?a=1&a=2&b=x+y HTTP/1.1\r\nHost: x\r\n"
                                                 b"Authorization: Bearer t\r\nContent-Length: 3\r\n\r\nabc")
        assert b'"query": {"a": "1", "b": "x y"}' in second and b'"bytes": 3' in second
        assert b'"auth": "Bearer t"' in second
        third = await roundtrip(reader, writer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert third.endswith(b"hello\n")
        assert len(set(rec.peers)) == 1 and len(rec.peers) == 3  # one connection for all three
    finally:
        writer.close()
        await server.close()


async def test_a_malformed_request_is_a_400_problem_and_the_connection_closes():
    server = HttpServer(Recorder().handle)
    await server.listen("127.0.0.1", 0)
    port = next(iter(server._servers.values())).sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET / HTTP/1.1\r\nno colon here\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 5)
        assert answer.startswith(b"HTTP/1.1 400") and b"application/problem+json" in answer
    finally:
        writer.close()
        await server.close()


def h11_complaint(data: bytes) -> str:
    """What h11 says about ``data`` as a request (the text the peer must not see)."""
    conn = h11.Connection(h11.SERVER)
    conn.receive_data(data)
    with pytest.raises(h11.RemoteProtocolError) as info:
        conn.next_event()
    return str(info.value)


@pytest.mark.parametrize("data", [
    b"GET / HTTP/1.1\r\nno colon here\r\n\r\n",
    b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"NOT-HTTP\r\n\r\n",
])
async def test_a_malformed_request_is_answered_with_a_fixed_text_and_the_detail_is_logged_at_debug(data, caplog):
    complaint = h11_complaint(data)
    caplog.set_level(logging.DEBUG, logger="anex_agent.net.http.server")
    server = HttpServer(Recorder().handle)
    await server.listen("127.0.0.1", 0)
    port = next(iter(server._servers.values())).sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(data)
        answer = await asyncio.wait_for(reader.read(), 60)
    finally:
        writer.close()
        await server.close()
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400")
    assert json.loads(body)["detail"] == MALFORMED
    assert complaint.encode() not in answer
    logged = [r for r in caplog.records if "malformed request" in r.getMessage()]
    assert logged and all(r.levelno == logging.DEBUG for r in logged) and complaint in logged[0].getMessage()


async def test_a_stream_is_written_as_it_comes_and_ends_when_the_caller_leaves():
    rec = Recorder()
    server = HttpServer(rec.handle)
    await server.listen("127.0.0.1", 0)
    port = next(iter(server._servers.values())).sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"GET /stream HTTP/1.1\r\nHost: x\r\n\r\n")
        got = b""
        while b"first\n" not in got:
            got += await asyncio.wait_for(reader.read(1000), 5)  # before the second line exists
        assert b"Transfer-Encoding: chunked" in got
        writer.close()  # the caller goes away while the stream waits
        await asyncio.wait_for(rec.stream_closed.wait(), 5)
    finally:
        await server.close()


async def test_served_over_a_handed_over_stream_with_its_peer():
    """As an engine with its own TCP stack does: the protocol gets a transport whose peername is
    the mesh caller's."""
    rec = Recorder()
    server = HttpServer(rec.handle)
    loop = asyncio.get_running_loop()
    listener = await loop.create_server(server.protocol_factory(), "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        answer = await roundtrip(reader, writer, b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.endswith(b"hello\n")
        assert rec.peers[0][0] == "127.0.0.1" and rec.peers[0][1] == writer.get_extra_info("sockname")[1]
    finally:
        writer.close()
        listener.close()
        await server.close()
