"""Real local servers for the front-end tests: a tiny DNS server, a TCP echo server, an HTTP origin."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket

import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
from aiohttp import web


class TinyDns(asyncio.DatagramProtocol):
    """Answers A/AAAA for the names in ``records`` (name -> addresses), NXDOMAIN otherwise.

    ``queries`` records every (name, rdtype text) asked, so tests see what reached it.
    """

    def __init__(self, records: dict[str, list[str]], ttl: int = 60) -> None:
        self.records = {k.lower().rstrip("."): v for k, v in records.items()}
        self.ttl = ttl
        self.queries: list[tuple[str, str]] = []
        self.transport: asyncio.DatagramTransport | None = None
        self.port = 0

    def connection_made(self, transport) -> None:
        self.transport = transport
        self.port = transport.get_extra_info("sockname")[1]

    def datagram_received(self, data: bytes, addr) -> None:
        query = dns.message.from_wire(data)
        question = query.question[0]
        name = question.name.to_text(omit_final_dot=True).lower()
        rdtype = dns.rdatatype.to_text(question.rdtype)
        self.queries.append((name, rdtype))
        response = dns.message.make_response(query)
        if name not in self.records:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            want_v6 = question.rdtype == dns.rdatatype.AAAA
            addresses = [a for a in self.records[name] if (":" in a) == want_v6]
            if addresses:
                response.answer.append(dns.rrset.from_text(question.name, self.ttl, "IN", rdtype, *addresses))
        self.transport.sendto(response.to_wire(), addr)


@contextlib.asynccontextmanager
async def tiny_dns(records: dict[str, list[str]], ttl: int = 60):
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(lambda: TinyDns(records, ttl), local_addr=("127.0.0.1", 0))
    try:
        yield proto
    finally:
        transport.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.asynccontextmanager
async def echo_server():
    """TCP server echoing every byte back; on EOF from the client it half-closes too.

    Yields (port, events) where events collects "eof" when the client's FIN arrived.
    """
    events: list[str] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(1 << 16):
            writer.write(data)
            await writer.drain()
        events.append("eof")
        writer.write_eof()
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], events
    finally:
        server.close()
        await server.wait_closed()


def non_loopback_ipv4() -> str | None:
    """An address of this machine outside 127/8 (the source of a UDP 'connect' towards a test net)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.123", 9))  # TEST-NET-1: no packet is sent by connect() on UDP
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def pattern(n: int) -> bytes:
    """Deterministic, non-repeating-ish bytes for body integrity checks."""
    out = bytearray()
    counter = 0
    while len(out) < n:
        out += hashlib.sha256(counter.to_bytes(8, "big")).digest()
        counter += 1
    return bytes(out[:n])


PEERS = web.AppKey("peers", list)


def origin_app(name: str) -> web.Application:
    """An HTTP origin: /info describes the request, /upload hashes a streamed body, /download streams n bytes."""
    peers: list[tuple[str, int]] = []

    async def info(request: web.Request) -> web.Response:
        peers.append(request.transport.get_extra_info("peername")[:2])
        body = await request.read()
        return web.json_response(
            {
                "origin": name,
                "method": request.method,
                "path_qs": request.path_qs,
                "host": request.headers.get("Host"),
                "via": request.headers.get("Via"),
                "headers": {k.lower(): v for k, v in request.headers.items()},
                "body_len": len(body),
                "peer": list(peers[-1]),
            },
            headers={"X-Origin": name},
        )

    async def upload(request: web.Request) -> web.Response:
        digest = hashlib.sha256()
        total = 0
        async for chunk in request.content.iter_chunked(1 << 16):
            digest.update(chunk)
            total += len(chunk)
        return web.json_response(
            {"len": total, "sha256": digest.hexdigest(), "chunked": "chunked" in request.headers.get("Transfer-Encoding", "")}
        )

    async def download(request: web.Request) -> web.StreamResponse:
        n = int(request.query["n"])
        response = web.StreamResponse()  # no Content-Length: chunked to the proxy
        await response.prepare(request)
        data = pattern(n)
        for i in range(0, n, 1 << 16):
            await response.write(data[i : i + (1 << 16)])
        await response.write_eof()
        return response

    app = web.Application(client_max_size=1 << 30)
    app[PEERS] = peers
    app.router.add_route("*", "/info", info)
    app.router.add_route("*", "/info/{tail:.*}", info)
    app.router.add_post("/upload", upload)
    app.router.add_put("/upload", upload)
    app.router.add_get("/download", download)
    return app


@contextlib.asynccontextmanager
async def run_origin(name: str):
    """Yields (port, app) of a running origin on 127.0.0.1."""
    app = origin_app(name)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    try:
        yield site._server.sockets[0].getsockname()[1], app
    finally:
        await runner.cleanup()


def loads(body: bytes) -> dict:
    return json.loads(body.decode())
