"""The proxy's guards on real sockets: this machine is out of reach for clients from beyond
loopback in every spelling (nothing dialled), and ambiguous request framing is refused (400,
nothing forwarded, connection closed)."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from anex_agent.net.dialer import OSDialer
from anex_agent.frontends.proxy import ProxyServer
from anex_agent.net.resolver import Resolver

from .servers import non_loopback_ipv4, tiny_dns


class RecordingDialer:
    """An OSDialer that remembers every (host, port) it was asked to dial."""

    def __init__(self, inner: OSDialer) -> None:
        self.inner = inner
        self.calls: list[tuple[str, int]] = []

    async def open_connection(self, host: str, port: int):
        self.calls.append((host, port))
        return await self.inner.open_connection(host, port)


class RawOrigin:
    """A TCP server on 127.0.0.1 that records every connection and every byte it receives,
    and answers each connection with ``reply`` (if any) once it saw a request head."""

    def __init__(self, reply: bytes = b"") -> None:
        self.reply = reply
        self.connections = 0
        self.received = b""
        self.port = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        try:
            while data := await reader.read(65536):
                self.received += data
                if self.reply and b"\r\n\r\n" in self.received:
                    writer.write(self.reply)
                    await writer.drain()
        except OSError:
            pass
        finally:
            writer.close()

    @contextlib.asynccontextmanager
    async def running(self):
        server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        self.port = server.sockets[0].getsockname()[1]
        try:
            yield self
        finally:
            server.close()
            await server.wait_closed()


async def exchange(host: str, port: int, raw: bytes, timeout: float = 10) -> bytes:
    """Send ``raw`` from a connection to the proxy and read until the proxy closes it."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), timeout=timeout)  # read() == until EOF: the proxy closed
    finally:
        writer.close()


@pytest.fixture
def outside_address():
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    return address


# how each spelling goes into a request target (IPv6 in brackets, RFC 3986 §3.2.2)
SPELLINGS = [
    "127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f000001", "0177.0.0.1", "127.0.0.1.",
    "[::ffff:127.0.0.1]", "[::1]", "[::]", "[0:0:0:0:0:0:0:1]", "[::ffff:7f00:1]", "[::1%25lo]",
    "0.0.0.0", "0", "localhost", "LOCALHOST.", "localhost.localdomain", "ip6-localhost",
    "api.localhost", "x.y.LocalHost",
]


@pytest.mark.parametrize("method", ["GET", "CONNECT"])
async def test_a_client_from_beyond_loopback_gets_403_for_every_spelling_and_nothing_is_dialled(
    outside_address, method
):
    origin = RawOrigin()
    dialer = RecordingDialer(OSDialer())
    async with origin.running(), ProxyServer(dialer, host=outside_address, port=0) as proxy:
        for spelling in SPELLINGS:
            authority = f"{spelling}:{origin.port}"
            target = authority if method == "CONNECT" else f"http://{authority}/info"
            response = await exchange(
                outside_address, proxy.address[1], f"{method} {target} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            )
            assert response.startswith(b"HTTP/1.1 403 Forbidden\r\n"), (spelling, response)
            assert b"is this machine" in response and b"only local clients" in response, spelling
            assert b"Connection: close" in response
    assert dialer.calls == []
    assert origin.connections == 0


@pytest.mark.parametrize("spelling", ["::1", "::ffff:127.0.0.1"])
async def test_ipv6_spellings_without_brackets_are_refused_too(outside_address, spelling):
    dialer = RecordingDialer(OSDialer())
    async with ProxyServer(dialer, host=outside_address, port=0) as proxy:
        for raw in (f"CONNECT {spelling}:9555 HTTP/1.1\r\nHost: x\r\n\r\n",
                    f"GET http://{spelling}:9555/ HTTP/1.1\r\nHost: x\r\n\r\n"):
            response = await exchange(outside_address, proxy.address[1], raw.encode())
            assert response.split(b" ", 2)[1] in (b"400", b"403"), (raw, response)
    assert dialer.calls == []


@pytest.mark.parametrize(
    "name, addresses",
    [("loop.default.svc.cluster.local", ["127.0.0.1"]), ("loop2.default.svc.cluster.local", ["127.3.4.5"]),
     ("mapped.default.svc.cluster.local", ["::ffff:127.0.0.1"])],
)
async def test_a_name_that_resolves_to_loopback_is_refused_on_the_address_dialled(outside_address, name, addresses):
    """The spelling says nothing; the dialer's answer does: 403, and the origin sees no byte."""
    origin = RawOrigin()
    async with origin.running(), tiny_dns({name: addresses}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0))
        async with ProxyServer(dialer, host=outside_address, port=0) as proxy:
            for raw in (f"GET http://{name}:{origin.port}/info HTTP/1.1\r\nHost: x\r\n\r\n",
                        f"CONNECT {name}:{origin.port} HTTP/1.1\r\nHost: x\r\n\r\nGET /inside HTTP/1.1\r\n\r\n"):
                response = await exchange(outside_address, proxy.address[1], raw.encode())
                assert response.startswith(b"HTTP/1.1 403 Forbidden\r\n"), response
                assert name.encode() in response
        await asyncio.sleep(0.05)  # let the origin read whatever might have come
    assert origin.received == b""


async def test_local_clients_still_reach_loopback_spellings():
    origin = RawOrigin(reply=b"HTTP/1.1 204 No Content\r\n\r\n")
    async with origin.running(), ProxyServer(OSDialer(), host="127.0.0.1", port=0) as proxy:
        for spelling in ("127.1", "2130706433", "localhost"):
            reader, writer = await asyncio.open_connection("127.0.0.1", proxy.address[1])
            writer.write(f"GET http://{spelling}:{origin.port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            writer.close()
            assert head.startswith(b"HTTP/1.1 204 "), (spelling, head)
    assert origin.connections == 3


SMUGGLING = [
    # CL.TE: a front end reading Content-Length would take "0\r\n\r\n" as the body and the rest as a second request
    b"POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"0\r\n\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    # TE.CL, other order and case
    b"POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: x\r\ntransfer-encoding: CHUNKED\r\ncontent-length: 4\r\n\r\n"
    b"5c\r\nGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n0\r\n\r\n",
    # duplicate Content-Length with different values (RFC 9112 §6.3 item 5)
    b"POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nContent-Length: 40\r\n\r\n"
    b"abcdGET /smuggled HTTP/1.1\r\nHost: x\r\n\r\n",
    b"POST http://127.0.0.1:{port}/a HTTP/1.1\r\nHost: x\r\nContent-Length: 4, 40\r\n\r\nabcd",
    # the same through CONNECT
    b"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
]


@pytest.mark.parametrize("raw", SMUGGLING, ids=["CL.TE", "TE.CL", "CL-CL", "CL-list", "CONNECT"])
async def test_ambiguous_framing_is_400_closed_and_never_forwarded(raw):
    origin = RawOrigin(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
    async with origin.running(), ProxyServer(OSDialer(), host="127.0.0.1", port=0) as proxy:
        response = await exchange("127.0.0.1", proxy.address[1], raw.replace(b"{port}", str(origin.port).encode()))
        await asyncio.sleep(0.05)
    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n"), response
    assert response.count(b"\r\nVia: ") == 1  # one answer, then the connection was closed
    assert b"Connection: close" in response
    assert origin.connections == 0 and origin.received == b""


async def test_same_content_length_twice_is_one_content_length_to_the_origin():
    origin = RawOrigin(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    async with origin.running(), ProxyServer(OSDialer(), host="127.0.0.1", port=0) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.address[1])
        writer.write(f"POST http://127.0.0.1:{origin.port}/ HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n"
                     f"Content-Length: 4\r\n\r\nabcd".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert origin.received.lower().count(b"content-length:") == 1
    assert origin.received.endswith(b"\r\n\r\nabcd")


async def test_a_response_with_both_framings_reaches_the_client_chunked_without_its_content_length():
    origin = RawOrigin(reply=b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n"
                             b"5\r\nhello\r\n0\r\n\r\n")
    async with origin.running(), ProxyServer(OSDialer(), host="127.0.0.1", port=0) as proxy:
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy.address[1])
        writer.write(f"GET http://127.0.0.1:{origin.port}/ HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 10)
        writer.close()
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"content-length" not in head.lower() and b"transfer-encoding: chunked" in head.lower()
    assert body == b"5\r\nhello\r\n0\r\n\r\n"


async def test_the_dialer_reports_the_addresses_it_tried():
    from anex_agent.errors import DialRefused, ResolveError

    async with tiny_dns({"two.default.svc.cluster.local": ["127.0.0.7", "127.0.0.8"]}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0))
        with pytest.raises(DialRefused) as refused:
            await dialer.open_connection("two.default.svc.cluster.local", 9)  # nothing listens on 9 (discard)
        with pytest.raises(ResolveError) as unresolved:
            await dialer.open_connection("none.default.svc.cluster.local", 9)
    assert sorted(refused.value.tried) == ["127.0.0.7", "127.0.0.8"]  # both, in the order dialled
    assert unresolved.value.tried == ()
