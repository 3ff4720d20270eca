"""The mesh DNS forwarder against a real dnspython-built upstream on loopback (UDP and TCP)."""

from __future__ import annotations

import asyncio
import socket
import struct

import dns.asyncquery
import dns.message
import dns.rcode
import dns.rdatatype
import dns.rrset
import pytest

from anex_agent.errors import ConfigError
from anex_agent.gateway.dns import DnsForwarder, error_reply
from anex_agent.gateway.settings import parse_upstream
from tests.polling import GENEROUS

ZONE = {"web.default.svc.cluster.local.": "10.96.0.42"}


def _answer(wire: bytes) -> bytes:
    query = dns.message.from_wire(wire)
    reply = dns.message.make_response(query)
    name = query.question[0].name.to_text()
    if name in ZONE and query.question[0].rdtype == dns.rdatatype.A:
        reply.answer.append(dns.rrset.from_text(name, 30, "IN", "A", ZONE[name]))
    else:
        reply.set_rcode(dns.rcode.NXDOMAIN)
    return reply.to_wire()


class Upstream:
    """A tiny authoritative server for ZONE on 127.0.0.1 (UDP + TCP, same port); counts queries."""

    def __init__(self, silent: bool = False) -> None:
        self.silent = silent
        self.queries = 0

    async def start(self) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        upstream = self

        class Proto(asyncio.DatagramProtocol):
            def connection_made(self, transport):
                self.transport = transport

            def datagram_received(self, data, addr):
                upstream.queries += 1
                if not upstream.silent:
                    self.transport.sendto(_answer(data), addr)

        for _ in range(50):  # UDP and TCP on one port number: retry when that TCP port is taken
            self.udp, _ = await loop.create_datagram_endpoint(Proto, local_addr=("127.0.0.1", 0))
            port = self.udp.get_extra_info("sockname")[1]
            try:
                self.tcp = await asyncio.start_server(self._on_tcp, "127.0.0.1", port)
                return "127.0.0.1", port
            except OSError:
                self.udp.close()
        raise RuntimeError("no port free for both UDP and TCP")

    async def _on_tcp(self, reader, writer):
        try:
            while True:
                (length,) = struct.unpack("!H", await reader.readexactly(2))
                data = await reader.readexactly(length)
                self.queries += 1
                reply = _answer(data)
                writer.write(struct.pack("!H", len(reply)) + reply)
                await writer.drain()
        except asyncio.IncompleteReadError:
            writer.close()

    async def close(self) -> None:
        self.udp.close()
        self.tcp.close()
        await self.tcp.wait_closed()


@pytest.fixture
async def upstream():
    server = Upstream()
    addr = await server.start()
    yield server, addr
    await server.close()


async def _forwarder(addr, tg, timeout=GENEROUS):
    fwd = DnsForwarder(listen_host="127.0.0.1", listen_port=0, upstream=addr, timeout=timeout)
    # port 0 for UDP and TCP separately would differ; bind UDP first, then TCP on the same port
    await fwd.serve(tg)
    return fwd


async def test_udp_query_is_forwarded_with_its_id(upstream):
    server, addr = upstream
    async with asyncio.TaskGroup() as tg:
        fwd = await _forwarder(addr, tg)
        try:
            query = dns.message.make_query("web.default.svc.cluster.local", "A")
            query.id = 4242
            reply = await dns.asyncquery.udp(query, "127.0.0.1", port=fwd.bound_port, timeout=GENEROUS)
            assert reply.id == 4242
            assert reply.rcode() == dns.rcode.NOERROR
            assert [r.address for r in reply.answer[0]] == ["10.96.0.42"]
            missing = await dns.asyncquery.udp(dns.message.make_query("nope.cluster.local", "A"),
                                               "127.0.0.1", port=fwd.bound_port, timeout=GENEROUS)
            assert missing.rcode() == dns.rcode.NXDOMAIN
            assert server.queries == 2
        finally:
            await fwd.close()


async def test_tcp_query_is_forwarded_over_tcp(upstream):
    server, addr = upstream
    async with asyncio.TaskGroup() as tg:
        fwd = await _forwarder(addr, tg)
        try:
            tcp_port = fwd._server.sockets[0].getsockname()[1]
            for qid in (7, 8):  # two queries on one connection would need a raw client; two connections here
                query = dns.message.make_query("web.default.svc.cluster.local", "A")
                query.id = qid
                reply = await dns.asyncquery.tcp(query, "127.0.0.1", port=tcp_port, timeout=GENEROUS)
                assert reply.id == qid
                assert [r.address for r in reply.answer[0]] == ["10.96.0.42"]
        finally:
            await fwd.close()


async def test_silent_upstream_gives_servfail():
    server = Upstream(silent=True)
    addr = await server.start()
    try:
        async with asyncio.TaskGroup() as tg:
            fwd = await _forwarder(addr, tg, timeout=0.3)
            try:
                query = dns.message.make_query("web.default.svc.cluster.local", "A")
                reply = await dns.asyncquery.udp(query, "127.0.0.1", port=fwd.bound_port, timeout=GENEROUS)
                assert reply.id == query.id
                assert reply.rcode() == dns.rcode.SERVFAIL
                assert server.queries == 1
            finally:
                await fwd.close()
    finally:
        await server.close()


async def test_unreachable_upstream_gives_servfail():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]  # nothing listens on TCP here once closed
    async with asyncio.TaskGroup() as tg:
        fwd = await _forwarder(("127.0.0.1", dead_port), tg, timeout=1)
        try:
            reply = await fwd.resolve(dns.message.make_query("x.cluster.local", "A").to_wire(), tcp=True)
            assert dns.message.from_wire(reply).rcode() == dns.rcode.SERVFAIL
        finally:
            await fwd.close()


async def test_garbage_gets_formerr_with_the_same_id():
    fwd = DnsForwarder(listen_host="127.0.0.1", upstream=("127.0.0.1", 9))
    reply = await fwd.resolve(b"\x12\x34garbage", tcp=False)
    qid, flags = struct.unpack("!HH", reply[:4])
    assert qid == 0x1234
    assert flags & 0x8000 and flags & 0xF == dns.rcode.FORMERR
    assert error_reply(b"\x01", dns.rcode.FORMERR) is None


@pytest.mark.parametrize(
    "text, expected",
    [("10.96.0.10", ("10.96.0.10", 53)), ("10.96.0.10:5353", ("10.96.0.10", 5353)),
     ("[fd00::a]:53", ("fd00::a", 53)), ("fd00::a", ("fd00::a", 53))],
)
def test_parse_upstream(text, expected):
    assert parse_upstream(text) == expected


@pytest.mark.parametrize("text", ["kube-dns", "10.96.0.10:x", "10.96.0.10:70000", "[fd00::a]x", "10.96.0.10:²",
                                  "10.96.0.10:٣", "10.96.0.10:３", "10.96.0.10:①", "10.96.0.10:0", ":53"])
def test_parse_upstream_rejects(text):
    with pytest.raises(ConfigError, match="--dns-upstream"):
        parse_upstream(text)
