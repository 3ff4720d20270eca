"""Stand-ins for what lives inside a cluster, for the demo and the integration tests.

Run as a process (inside the ``cluster`` network namespace)::

    python -m anex_agent.testing.services http --listen 10.77.0.2:8080 [--name echo]
    python -m anex_agent.testing.services dns --listen 10.77.0.2:53 --record echo.default.svc.cluster.local=10.77.0.2
    python -m anex_agent.testing.services sink --listen 10.77.0.2:9000      # bulk TCP: counts and discards
    python -m anex_agent.testing.services source --listen 10.77.0.2:9001    # bulk TCP: sends N bytes on request
    python -m anex_agent.testing.services udp --listen 127.0.0.1:5300 [--name echo]   # UDP echo

* ``http``: aiohttp; ``GET /anything`` answers ``{"service": NAME, "method": "GET", "path": ...,
  "peer": ...}``; ``POST`` (and every other method) echoes the request body back with the
  same fields in ``X-Echo-*`` headers. Any path.
* ``dns``: a tiny authoritative DNS server (dnspython messages, UDP and TCP) answering
  A records for the given names and NXDOMAIN for everything else, as a cluster's DNS
  does for ``svc.namespace.svc.cluster.local``.
* ``udp``: answers each datagram with ``NAME <datagram>``, to its sender.
* ``source``: reads an 8-byte big-endian length, sends that many bytes, closes (benchmarks).
* ``sink``: reads until EOF, then answers with the 8-byte count (benchmarks).

Each prints ``ready`` on stdout once listening, so a parent can wait for it.
"""

from __future__ import annotations

import argparse
import asyncio
import struct
import sys

import dns.flags
import dns.message
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rrset
from aiohttp import web

from anex_agent import parse

CHUNK = 256 * 1024


# ---------------------------------------------------------------- HTTP echo


def make_http_app(name: str) -> web.Application:
    async def handle(request: web.Request) -> web.StreamResponse:
        peer = request.transport.get_extra_info("peername") if request.transport else None
        peer_text = peer[0] if peer else ""
        if request.method in ("GET", "HEAD"):
            return web.json_response({"service": name, "method": request.method, "path": request.path_qs, "peer": peer_text})
        body = await request.read()
        headers = {"X-Echo-Service": name, "X-Echo-Method": request.method, "X-Echo-Path": request.path_qs, "X-Echo-Peer": peer_text}
        return web.Response(body=body, headers=headers, content_type="application/octet-stream")

    app = web.Application(client_max_size=1 << 30)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


async def serve_http(listen: str, name: str) -> None:
    host, port = parse.listen(listen)
    runner = web.AppRunner(make_http_app(name), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, host, port, reuse_address=True).start()
    print("ready", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- DNS


def answer_dns(wire: bytes, records: dict[str, str]) -> bytes | None:
    """Answer one DNS query (wire format) from ``records`` (lower-case FQDN without dot -> IPv4)."""
    try:
        query = dns.message.from_wire(wire)
    except Exception:  # not a DNS message: drop it, as servers do
        return None
    response = dns.message.make_response(query)
    response.flags |= dns.flags.AA
    if not query.question:
        response.set_rcode(dns.rcode.FORMERR)
        return response.to_wire()
    question = query.question[0]
    name = question.name.to_text().rstrip(".").lower()
    if name not in records:
        response.set_rcode(dns.rcode.NXDOMAIN)
    elif question.rdtype == dns.rdatatype.A:
        response.answer.append(dns.rrset.from_text(question.name, 5, dns.rdataclass.IN, dns.rdatatype.A, records[name]))
    # other types for a known name: NOERROR with no answer (NODATA)
    return response.to_wire()


class _DnsUdp(asyncio.DatagramProtocol):
    def __init__(self, records: dict[str, str]) -> None:
        self.records = records

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        reply = answer_dns(data, self.records)
        if reply is not None:
            self.transport.sendto(reply, addr)


async def serve_dns(listen: str, records: dict[str, str]) -> None:
    host, port = parse.listen(listen)
    loop = asyncio.get_running_loop()
    await loop.create_datagram_endpoint(lambda: _DnsUdp(records), local_addr=(host, port))

    async def tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                reply = answer_dns(await reader.readexactly(length), records)
                if reply is None:
                    break
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    await asyncio.start_server(tcp, host, port, reuse_address=True)
    print("ready", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- UDP echo


class _UdpEcho(asyncio.DatagramProtocol):
    def __init__(self, name: str) -> None:
        self.prefix = name.encode() + b" "

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.transport.sendto(self.prefix + data, addr)


async def serve_udp(listen: str, name: str) -> None:
    host, port = parse.listen(listen)
    await asyncio.get_running_loop().create_datagram_endpoint(lambda: _UdpEcho(name), local_addr=(host, port))
    print("ready", flush=True)
    await asyncio.Event().wait()


# ---------------------------------------------------------------- bulk TCP


async def serve_bulk(listen: str, mode: str) -> None:
    host, port = parse.listen(listen)
    payload = bytes(CHUNK)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if mode == "source":
                (left,) = struct.unpack("!Q", await reader.readexactly(8))
                while left > 0:
                    writer.write(payload[: min(left, CHUNK)])
                    left -= min(left, CHUNK)
                    await writer.drain()
            else:
                total = 0
                while chunk := await reader.read(CHUNK):
                    total += len(chunk)
                writer.write(struct.pack("!Q", total))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    await asyncio.start_server(handle, host, port, reuse_address=True)
    print("ready", flush=True)
    await asyncio.Event().wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anex_agent.testing.services")
    parser.add_argument("kind", choices=["http", "dns", "udp", "sink", "source"])
    parser.add_argument("--listen", required=True, metavar="IP:PORT", type=parse.arg_type(parse.listen))
    parser.add_argument("--name", default="echo")
    parser.add_argument("--record", action="append", default=[], metavar="NAME=IPV4")
    args = parser.parse_args(argv)
    if args.kind == "http":
        coro = serve_http(args.listen, args.name)
    elif args.kind == "dns":
        records = {}
        for item in args.record:
            name, _, ip = item.partition("=")
            records[name.rstrip(".").lower()] = ip
        coro = serve_dns(args.listen, records)
    elif args.kind == "udp":
        coro = serve_udp(args.listen, args.name)
    else:
        coro = serve_bulk(args.listen, args.kind)
    try:
        asyncio.run(coro)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
