"""The SOCKS5 proxy against real servers: curl (--socks5-hostname, --socks5, -U), PySocks (UDP ASSOCIATE) and raw clients."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ipaddress
import logging
import os
import shutil
import socket

import dns.message
import pytest

from anex_agent.net.datagram import OSDatagramDialer
from anex_agent.net.dialer import OSDialer, StreamConnection
from anex_agent.errors import ConfigError, PortInUseError
from anex_agent.frontends import relay as relay_module
from anex_agent.frontends.socks5 import Socks5Server
from anex_agent.frontends.socks5_core import SocksAuth
from anex_agent.net.resolver import Resolver
from tests.polling import GENEROUS, wait_until

from .servers import PEERS, echo_server, loads, non_loopback_ipv4, pattern, run_origin, tiny_dns
from .test_proxy_guards import SPELLINGS, RawOrigin, RecordingDialer

CLUSTER_NAME = "web.default.svc.cluster.local"
AUTH = SocksAuth("alice", "s3cret")
needs_curl = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")


@contextlib.asynccontextmanager
async def socks_env(auth: SocksAuth | None = None, records: dict[str, list[str]] | None = None):
    """A SOCKS5 proxy on a random loopback port whose dialer resolves CLUSTER_NAME through a real DNS server."""
    async with tiny_dns(records or {CLUSTER_NAME: ["127.0.0.1"]}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0))
        async with Socks5Server(dialer, host="127.0.0.1", port=0, auth=auth) as socks:
            yield socks.address[1], dns


async def curl(*args: str, data: bytes | None = None) -> tuple[int, bytes, str]:
    proc = await asyncio.create_subprocess_exec(
        "curl", "-sS", "--max-time", "20", *args,
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate(data)
    return proc.returncode, out, err.decode()


@needs_curl
async def test_curl_socks5_hostname_resolves_cluster_names_through_the_cluster_dns():
    async with run_origin("a") as (port, _), socks_env() as (socks_port, dns):
        code, out, err = await curl("--socks5-hostname", f"127.0.0.1:{socks_port}", f"http://{CLUSTER_NAME}:{port}/info?s=1")
        assert code == 0, err
        assert loads(out)["path_qs"] == "/info?s=1"
        assert (CLUSTER_NAME, "A") in dns.queries  # the proxy asked the cluster's DNS, not curl


@needs_curl
async def test_curl_socks5_with_an_address_resolved_by_the_client_and_a_streamed_body():
    body = os.urandom(300_000)
    async with run_origin("a") as (port, _), socks_env() as (socks_port, dns):
        code, out, err = await curl("--socks5", f"127.0.0.1:{socks_port}", "--data-binary", "@-",
                                    f"http://127.0.0.1:{port}/upload", data=body)
        assert code == 0, err
        assert loads(out)["sha256"] == hashlib.sha256(body).hexdigest()
        assert dns.queries == []


@needs_curl
async def test_curl_with_credentials_and_without():
    async with run_origin("a") as (port, app), socks_env(auth=AUTH) as (socks_port, _):
        url = f"http://{CLUSTER_NAME}:{port}/info"
        code, out, err = await curl("--socks5-hostname", f"127.0.0.1:{socks_port}", "-U", "alice:s3cret", url)
        assert code == 0, err
        assert loads(out)["method"] == "GET"
        seen = len(app[PEERS])
        for user in (["-U", "alice:wrong"], []):
            code, out, err = await curl("--socks5-hostname", f"127.0.0.1:{socks_port}", *user, url)
            assert code != 0 and out == b"", (user, err)
        assert len(app[PEERS]) == seen  # refused before anything was dialled


# ---------------------------------------------------------------- a raw client


class RawSocks:
    """A SOCKS5 client written out byte by byte (RFC 1928), to see every reply code."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, port: int, host: str = "127.0.0.1", auth: tuple[bytes, bytes] | None = None):
        reader, writer = await asyncio.open_connection(host, port)
        client = cls(reader, writer)
        try:
            writer.write(bytes([5, 1, 2 if auth else 0]))
            assert await client.read(2) == bytes([5, 2 if auth else 0])
            if auth:
                user, password = auth
                writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
                assert await client.read(2) == bytes([1, 0])
            yield client
        finally:
            writer.close()

    async def read(self, n: int) -> bytes:
        return await asyncio.wait_for(self.reader.readexactly(n), 20)

    async def request(self, host: str, port: int, command: int = 1, extra: bytes = b"") -> tuple[int, str, int]:
        """Send a request; return (REP, BND.ADDR, BND.PORT)."""
        try:
            address = ipaddress.ip_address(host)
            encoded = bytes([1 if address.version == 4 else 4]) + address.packed
        except ValueError:
            encoded = bytes([3, len(host)]) + host.encode()
        self.writer.write(bytes([5, command, 0]) + encoded + port.to_bytes(2, "big") + extra)
        head = await self.read(4)
        assert head[0] == 5 and head[2] == 0
        size = {1: 4, 4: 16}[head[3]]
        bound = ipaddress.ip_address(await self.read(size))
        return head[1], str(bound), int.from_bytes(await self.read(2), "big")


async def test_connect_relays_both_ways_with_half_close_and_early_bytes():
    async with echo_server() as (port, events), socks_env() as (socks_port, _):
        async with RawSocks.connect(socks_port) as client:
            code, bound, bound_port = await client.request("127.0.0.1", port, extra=b"sent before the reply;")
            assert (code, bound) == (0, "127.0.0.1") and bound_port > 0  # the proxy's end of the connection
            client.writer.write(b"then more")
            client.writer.write_eof()
            assert await asyncio.wait_for(client.reader.read(), 20) == b"sent before the reply;then more"
        assert events == ["eof"]


async def test_connect_to_an_ipv6_address():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 here")
    server = await asyncio.start_server(lambda r, w: w.close(), "::1", 0)
    async with server, socks_env() as (socks_port, _):
        async with RawSocks.connect(socks_port) as client:
            code, _, _ = await client.request("::1", server.sockets[0].getsockname()[1])
    assert code == 0


@pytest.mark.parametrize(
    "host, command, expected",
    [
        ("nosuch.default.svc.cluster.local", 1, 4),  # NXDOMAIN from the cluster DNS: host unreachable
        ("127.0.0.1", 2, 7),  # BIND: command not supported
        ("127.0.0.1", 3, 7),  # UDP ASSOCIATE: command not supported
    ],
)
async def test_reply_codes_from_the_real_server(host, command, expected):
    async with socks_env() as (socks_port, _):
        async with RawSocks.connect(socks_port) as client:
            code, bound, bound_port = await client.request(host, 9, command=command)
            assert (code, bound, bound_port) == (expected, "0.0.0.0", 0)
            assert await asyncio.wait_for(client.reader.read(), 20) == b""  # and closed


async def test_a_closed_port_is_connection_refused():
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))  # bound, not listening: the kernel answers a SYN with RST
    try:
        async with socks_env() as (socks_port, _):
            async with RawSocks.connect(socks_port) as client:
                code, _, _ = await client.request("127.0.0.1", listener.getsockname()[1])
        assert code == 5
    finally:
        listener.close()


async def test_credentials_on_the_wire():
    async with echo_server() as (port, _), socks_env(auth=AUTH) as (socks_port, _):
        async with RawSocks.connect(socks_port, auth=(b"alice", b"s3cret")) as client:
            code, _, _ = await client.request("127.0.0.1", port)
            assert code == 0
        reader, writer = await asyncio.open_connection("127.0.0.1", socks_port)
        writer.write(bytes([5, 1, 2, 1, 5]) + b"alice" + bytes([5]) + b"wrong")
        assert await asyncio.wait_for(reader.read(), 20) == bytes([5, 2, 1, 1])  # failure, then closed
        writer.close()


async def test_malformed_negotiation_is_closed_after_the_allowed_answer():
    async with socks_env() as (socks_port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", socks_port)
        writer.write(bytes([4, 1, 0, 80, 127, 0, 0, 1, 0]))  # a SOCKS4 request
        assert await asyncio.wait_for(reader.read(), 20) == b""
        writer.close()


async def test_a_silent_client_is_closed_after_the_handshake_timeout():
    async with Socks5Server(OSDialer(), host="127.0.0.1", port=0, handshake_timeout=0.2) as socks:
        reader, writer = await asyncio.open_connection("127.0.0.1", socks.address[1])
        writer.write(bytes([5, 1]))  # half a greeting, then nothing
        assert await asyncio.wait_for(reader.read(), 30) == b""
        writer.close()


class StreamDialer:
    """Connections without a kernel socket, as the user-space engine's: the relay copies through its pool."""

    async def open_connection(self, host: str, port: int):
        return StreamConnection(*await asyncio.open_connection(host, port))


async def test_the_data_phase_borrows_the_relays_pooled_buffers(monkeypatch):
    taken = []
    real_take = relay_module._pool.take
    monkeypatch.setattr(relay_module._pool, "take", lambda: taken.append(1) or real_take())
    payload = pattern(4 * 1024 * 1024)
    async with echo_server() as (port, _), Socks5Server(StreamDialer(), host="127.0.0.1", port=0) as socks:
        async with RawSocks.connect(socks.address[1]) as client:
            assert (await client.request("127.0.0.1", port))[0] == 0

            async def send() -> None:
                client.writer.write(payload)
                await client.writer.drain()
                client.writer.write_eof()

            sender = asyncio.ensure_future(send())
            echoed = await asyncio.wait_for(client.reader.read(), 60)
            await sender
    assert hashlib.sha256(echoed).digest() == hashlib.sha256(payload).digest()
    assert taken  # bulk went through COPY_BUFFERs of the shared pool


# ---------------------------------------------------------------- who may connect


async def test_port_in_use_names_the_variable():
    async with Socks5Server(OSDialer(), host="127.0.0.1", port=0) as first:
        with pytest.raises(PortInUseError) as caught:
            async with Socks5Server(OSDialer(), host="127.0.0.1", port=first.address[1]):
                pass
    assert caught.value.source == "ANEX_SOCKS_LISTEN"


@pytest.fixture
def outside_address():
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    return address


def test_beyond_loopback_needs_credentials():
    with pytest.raises(ConfigError) as caught:
        Socks5Server(OSDialer(), host="0.0.0.0", port=0)
    assert caught.value.source == "ANEX_SOCKS_LISTEN" and "needs credentials" in str(caught.value)


async def test_a_client_from_beyond_loopback_is_not_allowed_to_this_machine(outside_address):
    dialer = RecordingDialer(OSDialer())
    async with Socks5Server(dialer, host=outside_address, port=0, auth=AUTH) as socks:
        for spelling in SPELLINGS:
            host = spelling.strip("[]").replace("%25", "%")  # an IP literal goes as IPv4/IPv6, the rest as a name
            async with RawSocks.connect(socks.address[1], host=outside_address, auth=(b"alice", b"s3cret")) as client:
                code, _, _ = await client.request(host, 9555)
                assert code == 2, spelling  # connection not allowed by ruleset
    assert dialer.calls == []


async def test_a_name_resolving_to_loopback_is_not_allowed_on_the_address_dialled(outside_address):
    name = "loop.default.svc.cluster.local"
    origin = RawOrigin()
    async with origin.running(), tiny_dns({name: ["127.0.0.1"]}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0))
        async with Socks5Server(dialer, host=outside_address, port=0, auth=AUTH) as socks:
            async with RawSocks.connect(socks.address[1], host=outside_address, auth=(b"alice", b"s3cret")) as client:
                code, _, _ = await client.request(name, origin.port, extra=b"must not arrive")
                assert code == 2
                assert await asyncio.wait_for(client.reader.read(), 20) == b""
    assert origin.received == b""  # the connection that reached it was closed before a byte was sent


async def test_past_its_connection_cap_a_client_is_closed_at_once_counted_and_logged_once(caplog):
    """Clients holding the handshake open fill the cap; the next ones are closed on accept,
    counted, one log line for the burst; a freed slot serves again."""
    caplog.set_level(logging.WARNING, logger="anex_agent.frontends.tcp_server")
    async with Socks5Server(OSDialer(Resolver()), host="127.0.0.1", port=0, max_connections=2) as socks:
        port = socks.address[1]
        held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        await wait_until(lambda: len(socks._sessions) == 2, what="both clients served")
        for n in (1, 2):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            assert await asyncio.wait_for(reader.read(1), GENEROUS) == b""  # closed at once, no answer
            writer.close()
            await wait_until(lambda: socks.refused == n, what=f"refusal {n} counted")
        lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
        assert len(lines) == 1 and "ANEX_PROXY_MAX_CONNECTIONS" in lines[0] and "2 already open" in lines[0]
        held[0][1].close()
        await wait_until(lambda: len(socks._sessions) == 1, what="the closed client's session ended")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"\x05\x01\x00")  # a SOCKS5 greeting: served again, answered
        assert await asyncio.wait_for(reader.readexactly(2), GENEROUS) == b"\x05\x00"
        assert socks.refused == 2
        for _r, w in [held[1], (reader, writer)]:
            w.close()


# ---------------------------------------------------------------- UDP ASSOCIATE with PySocks

DNS_NAME = "kube-dns.kube-system.svc.cluster.local"


def pysocks_dns_query(proxy_port: int, server: tuple[str, int], name: str, auth: SocksAuth | None = None,
                      proxy_host: str = "127.0.0.1") -> tuple[dns.message.Message, tuple[str, int]]:
    """Ask ``server`` (an address or a name, and a port) for ``name``'s A record over UDP through the
    SOCKS5 proxy, as PySocks does it (UDP ASSOCIATE; blocking: run it in a thread). Returns the
    answer and the source PySocks read from the relay's header."""
    import socks  # PySocks

    query = dns.message.make_query(name, "A")
    sock = socks.socksocket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.set_proxy(socks.SOCKS5, proxy_host, proxy_port, rdns=True,
                       username=auth.username if auth else None, password=auth.password if auth else None)
        sock.settimeout(GENEROUS)
        sock.sendto(query.to_wire(), server)
        data, source = sock.recvfrom(4096)
    finally:
        sock.close()
    answer = dns.message.from_wire(data)
    assert answer.id == query.id
    return answer, source


def a_records(answer: dns.message.Message) -> list[str]:
    return [item.address for rrset in answer.answer for item in rrset]


async def test_pysocks_sends_a_dns_query_through_udp_associate():
    records = {CLUSTER_NAME: ["10.96.0.7"], DNS_NAME: ["127.0.0.1"]}
    async with tiny_dns(records) as dns_server:
        resolver = Resolver([f"127.0.0.1:{dns_server.port}"], timeout=2.0)
        async with Socks5Server(OSDialer(resolver), host="127.0.0.1", port=0, auth=AUTH,
                                datagrams=OSDatagramDialer(resolver)) as socks:
            port = socks.address[1]
            by_address, source = await asyncio.to_thread(pysocks_dns_query, port, ("127.0.0.1", dns_server.port),
                                                         CLUSTER_NAME, AUTH)
            assert a_records(by_address) == ["10.96.0.7"] and source == ("127.0.0.1", dns_server.port)
            # the DNS server named by a cluster name: the proxy resolves it (PySocks sends the name as it is)
            by_name, source = await asyncio.to_thread(pysocks_dns_query, port, (DNS_NAME, dns_server.port),
                                                      CLUSTER_NAME, AUTH)
            assert a_records(by_name) == ["10.96.0.7"] and source == ("127.0.0.1", dns_server.port)
            await wait_until(lambda: not socks.associations, what="PySocks' associations ended with its close()")
        assert dns_server.queries.count((CLUSTER_NAME, "A")) == 2 and (DNS_NAME, "A") in dns_server.queries
