"""SOCKS5 UDP ASSOCIATE through the real proxy with a raw client (RFC 1928 §4, §7): relaying both ways,
names through the cluster's DNS, strangers and fragments dropped, forbidden destinations, the association's end."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import socket

import pytest

from anex_agent.frontends.socks5 import Socks5Server
from anex_agent.frontends.socks5_core import SocksAuth
from anex_agent.frontends.socks5_udp import UdpAssociation
from anex_agent.net.datagram import OSDatagramDialer
from anex_agent.net.dialer import OSDialer
from anex_agent.net.resolver import Resolver
from tests.polling import GENEROUS, wait_until

from .servers import non_loopback_ipv4, tiny_dns
from .test_socks5_udp_core import header

ECHO_NAME = "echo.default.svc.cluster.local"
AUTH = SocksAuth("alice", "s3cret")


class Datagrams(asyncio.DatagramProtocol):
    """A UDP socket's received datagrams, in order, for a test to await."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[tuple[bytes, tuple]] = asyncio.Queue()
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.queue.put_nowait((data, addr))

    async def next(self) -> tuple[bytes, tuple]:
        return await asyncio.wait_for(self.queue.get(), GENEROUS)


@contextlib.asynccontextmanager
async def udp_socket(host: str = "127.0.0.1", echo: bool = False):
    """A UDP socket on ``host`` (an echo server when ``echo``); yields its protocol and port."""
    loop = asyncio.get_running_loop()

    class Echo(Datagrams):
        def datagram_received(self, data: bytes, addr) -> None:
            super().datagram_received(data, addr)
            self.transport.sendto(b"echo:" + data, addr)

    transport, proto = await loop.create_datagram_endpoint(Echo if echo else Datagrams, local_addr=(host, 0))
    try:
        yield proto, transport.get_extra_info("sockname")[1]
    finally:
        transport.close()


@contextlib.asynccontextmanager
async def proxy(host: str = "127.0.0.1", auth: SocksAuth | None = None, **options):
    """A SOCKS5 proxy with UDP ASSOCIATE whose resolver asks a real DNS server that knows ECHO_NAME (127.0.0.1)."""
    async with tiny_dns({ECHO_NAME: ["127.0.0.1"]}) as dns:
        resolver = Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0)
        async with Socks5Server(OSDialer(resolver), host=host, port=0, auth=auth,
                                datagrams=OSDatagramDialer(resolver), **options) as socks:
            yield socks, dns


@contextlib.asynccontextmanager
async def associate(port: int, host: str = "127.0.0.1", source: tuple[str, int] = ("0.0.0.0", 0),
                    auth: tuple[bytes, bytes] | None = None):
    """A control connection that asked for UDP ASSOCIATE; yields (reader, writer, (BND.ADDR, BND.PORT))."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        writer.write(bytes([5, 1, 2 if auth else 0]))
        assert await asyncio.wait_for(reader.readexactly(2), GENEROUS) == bytes([5, 2 if auth else 0])
        if auth:
            user, password = auth
            writer.write(bytes([1, len(user)]) + user + bytes([len(password)]) + password)
            assert await asyncio.wait_for(reader.readexactly(2), GENEROUS) == bytes([1, 0])
        address = ipaddress.ip_address(source[0])
        writer.write(bytes([5, 3, 0, 1 if address.version == 4 else 4]) + address.packed + source[1].to_bytes(2, "big"))
        head = await asyncio.wait_for(reader.readexactly(4), GENEROUS)
        assert head[:3] == bytes([5, 0, 0]), head
        bound = ipaddress.ip_address(await reader.readexactly({1: 4, 4: 16}[head[3]]))
        bound_port = int.from_bytes(await reader.readexactly(2), "big")
        yield reader, writer, (str(bound), bound_port)
    finally:
        writer.close()


def only_association(socks: Socks5Server) -> UdpAssociation:
    assert len(socks.associations) == 1
    return next(iter(socks.associations))


async def test_datagrams_go_both_ways_and_the_reply_names_its_source():
    async with proxy() as (socks, _), udp_socket(echo=True) as (echo, echo_port), udp_socket() as (client, _):
        async with associate(socks.address[1]) as (_, _, relay):
            assert relay[0] == "127.0.0.1" and relay[1] not in (0, socks.address[1])
            client.transport.sendto(header("127.0.0.1", echo_port) + b"ping", relay)
            data, source = await client.next()
            assert source[:2] == relay
            assert data == header("127.0.0.1", echo_port) + b"echo:ping"
            assert (await echo.next())[0] == b"ping"  # the header was stripped on the way out
            assert only_association(socks).counts["replied"] == 1


async def test_a_name_is_resolved_by_the_proxys_resolver_not_the_clients():
    async with proxy() as (socks, dns), udp_socket(echo=True) as (echo, echo_port), udp_socket() as (client, _):
        async with associate(socks.address[1]) as (_, _, relay):
            client.transport.sendto(header(ECHO_NAME, echo_port) + b"by name", relay)
            data, _ = await client.next()
            assert data == header("127.0.0.1", echo_port) + b"echo:by name"  # the reply names the address
        assert (ECHO_NAME, "A") in dns.queries


async def test_a_strangers_datagram_to_the_relay_is_dropped_and_counted():
    async with proxy() as (socks, _), udp_socket(echo=True) as (echo, echo_port):
        async with udp_socket() as (client, client_port), udp_socket() as (stranger, _):
            async with associate(socks.address[1], source=("127.0.0.1", client_port)) as (_, _, relay):
                stranger.transport.sendto(header("127.0.0.1", echo_port) + b"not yours", relay)
                client.transport.sendto(header("127.0.0.1", echo_port) + b"mine", relay)
                assert (await client.next())[0].endswith(b"echo:mine")
                association = only_association(socks)
                assert association.counts["stranger"] == 1
                assert echo.queue.qsize() == 1 and (await echo.next())[0] == b"mine"  # the stranger's never left
                assert stranger.queue.empty()


async def test_with_port_0_the_first_sender_owns_the_association():
    async with proxy() as (socks, _), udp_socket(echo=True) as (echo, echo_port):
        async with udp_socket() as (first, _), udp_socket() as (second, _):
            async with associate(socks.address[1]) as (_, _, relay):
                first.transport.sendto(header("127.0.0.1", echo_port) + b"1", relay)
                assert (await first.next())[0].endswith(b"echo:1")
                second.transport.sendto(header("127.0.0.1", echo_port) + b"2", relay)
                first.transport.sendto(header("127.0.0.1", echo_port) + b"3", relay)
                assert (await first.next())[0].endswith(b"echo:3")
                assert only_association(socks).counts["stranger"] == 1
                assert [(await echo.next())[0] for _ in range(2)] == [b"1", b"3"]


async def test_replies_from_others_than_the_destinations_are_dropped():
    async with proxy() as (socks, _), udp_socket(echo=True) as (echo, echo_port), udp_socket() as (client, _):
        async with associate(socks.address[1]) as (_, _, relay), udp_socket() as (intruder, _):
            client.transport.sendto(header("127.0.0.1", echo_port) + b"hello", relay)
            _, (host, mesh_port) = await echo.next()  # the relay's mesh-side socket, as the destination saw it
            await client.next()
            intruder.transport.sendto(b"spoofed", (host, mesh_port))
            await wait_until(lambda: only_association(socks).counts["reply from a stranger"] == 1,
                             what="the intruder's datagram dropped")
            assert client.queue.empty()


async def test_fragments_and_malformed_headers_are_dropped():
    async with proxy() as (socks, _), udp_socket(echo=True) as (echo, echo_port), udp_socket() as (client, _):
        async with associate(socks.address[1]) as (_, _, relay):
            client.transport.sendto(header("127.0.0.1", echo_port, frag=1) + b"fragment", relay)
            client.transport.sendto(b"\x00\x00\x00\x09junk", relay)
            client.transport.sendto(header("127.0.0.1", echo_port) + b"whole", relay)
            assert (await client.next())[0].endswith(b"echo:whole")
            counts = only_association(socks).counts
            assert (counts["fragment"], counts["malformed"], counts["sent"]) == (1, 1, 1)
            assert (await echo.next())[0] == b"whole" and echo.queue.empty()


async def test_the_association_ends_when_the_control_connection_closes():
    async with proxy() as (socks, _), udp_socket(echo=True) as (_, echo_port), udp_socket() as (client, _):
        async with associate(socks.address[1]) as (_, writer, relay):
            client.transport.sendto(header("127.0.0.1", echo_port) + b"x", relay)
            await client.next()
            association = only_association(socks)
            writer.close()
            await wait_until(lambda: not socks.associations, what="the association closed")
        assert association.counts["sent"] == 1
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as again:
            again.bind(relay)  # the relay's port is free again: its socket is closed


async def test_an_idle_association_ends_and_closes_the_control_connection():
    async with proxy(udp_idle_timeout=0.2) as (socks, _):
        async with associate(socks.address[1]) as (reader, _, _):
            assert await asyncio.wait_for(reader.read(), GENEROUS) == b""  # the proxy closed it
        await wait_until(lambda: not socks.associations, what="the association closed")


async def test_a_client_from_beyond_loopback_cannot_send_to_this_machine():
    outside = non_loopback_ipv4()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    async with proxy(host=outside, auth=AUTH) as (socks, _), udp_socket(echo=True) as (echo, echo_port):
        async with udp_socket(outside) as (client, client_port), udp_socket(outside, echo=True) as (allowed, allowed_port):
            async with associate(socks.address[1], host=outside, source=(outside, client_port),
                                 auth=(b"alice", b"s3cret")) as (_, _, relay):
                assert relay[0] == outside  # the relay is where the client reached the proxy
                for target in ("127.0.0.1", "localhost", ECHO_NAME):  # ECHO_NAME resolves to 127.0.0.1
                    client.transport.sendto(header(target, echo_port) + b"no", relay)
                for fan_out in ("224.0.0.251", "255.255.255.255"):  # multicast, the limited broadcast
                    client.transport.sendto(header(fan_out, 5353) + b"no", relay)
                client.transport.sendto(header(outside, allowed_port) + b"yes", relay)
                assert (await client.next())[0].endswith(b"echo:yes")
                assert only_association(socks).counts["forbidden"] == 5
                assert echo.queue.empty()


async def test_a_client_from_beyond_loopback_must_name_its_source_port():
    """Port 0 ("not known yet") from beyond this machine: the first datagram from the client's
    address would own the association, and that address can be forged on the path. Refused (02)."""
    outside = non_loopback_ipv4()
    if outside is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    async with proxy(host=outside, auth=AUTH) as (socks, _):
        reader, writer = await asyncio.open_connection(outside, socks.address[1])
        try:
            writer.write(bytes([5, 1, 2]) + bytes([1, 5]) + b"alice" + bytes([6]) + b"s3cret")
            writer.write(bytes([5, 3, 0, 1, 0, 0, 0, 0, 0, 0]))
            assert await asyncio.wait_for(reader.read(), GENEROUS) == bytes([5, 2, 1, 0, 5, 2, 0, 1, 0, 0, 0, 0, 0, 0])
            assert not socks.associations
        finally:
            writer.close()


async def test_without_a_datagram_dialer_udp_associate_is_not_supported():
    async with Socks5Server(OSDialer(), host="127.0.0.1", port=0) as socks:
        reader, writer = await asyncio.open_connection("127.0.0.1", socks.address[1])
        writer.write(bytes([5, 1, 0, 5, 3, 0, 1, 0, 0, 0, 0, 0, 0]))
        assert await asyncio.wait_for(reader.read(), GENEROUS) == bytes([5, 0, 5, 7, 0, 1, 0, 0, 0, 0, 0, 0])
        writer.close()


async def test_an_ipv6_listener_gets_an_ipv6_relay():
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    async with proxy(host="::1") as (socks, _), udp_socket("::1", echo=True) as (echo, echo_port):
        async with udp_socket("::1") as (client, _), associate(socks.address[1], host="::1") as (_, _, relay):
            assert relay[0] == "::1"
            client.transport.sendto(header("::1", echo_port) + b"six", relay)
            data, _ = await client.next()
            assert data == header("::1", echo_port) + b"echo:six"


async def test_a_reply_as_the_idle_timeout_fires_is_not_an_error():
    """The idle timeout expiring and a reply arriving in the same turn: the reply must not try to
    move a timeout that is already ending the association (asyncio raises RuntimeError then)."""
    from anex_agent.frontends.socks5_core import AddressType, AssociateRequest

    association = UdpAssociation(OSDatagramDialer(), "127.0.0.1", AssociateRequest("0.0.0.0", 0, AddressType.IPV4),
                                 "127.0.0.1")
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0) as expired:
            await asyncio.Event().wait()
    assert expired.expired()
    association._idle = expired
    association._active()  # raised RuntimeError('Cannot change state of expiring Timeout')
