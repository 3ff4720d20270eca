"""The OS datagram dialer: kernel UDP sockets per address family, received datagrams to the callback."""

from __future__ import annotations

import asyncio
import socket

import pytest

from anex_agent.net.datagram import OSDatagramDialer
from anex_agent.net.resolver import Resolver
from tests.polling import GENEROUS


class Echo(asyncio.DatagramProtocol):
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.seen: list[tuple] = []

    def datagram_received(self, data: bytes, addr) -> None:
        self.seen.append(addr)
        self.transport.sendto(b"echo:" + data, addr)


async def echo_on(host: str):
    loop = asyncio.get_running_loop()
    transport, proto = await loop.create_datagram_endpoint(Echo, local_addr=(host, 0))
    return transport, proto, transport.get_extra_info("sockname")[1]


def collector():
    queue: asyncio.Queue = asyncio.Queue()
    return queue, lambda data, source: queue.put_nowait((data, source))


async def test_datagrams_to_ipv4_and_ipv6_destinations_come_back_through_the_callback():
    families = ["127.0.0.1"] + (["::1"] if socket.has_ipv6 else [])
    queue, on_datagram = collector()
    sock = OSDatagramDialer(Resolver()).open_datagram(on_datagram)
    try:
        for host in families:
            try:
                transport, _, port = await echo_on(host)
            except OSError:
                continue  # no IPv6 on this machine
            try:
                sock.sendto(b"hi " + host.encode(), host, port)
                data, source = await asyncio.wait_for(queue.get(), GENEROUS)
                assert data == b"echo:hi " + host.encode() and source == (host, port)
            finally:
                transport.close()
    finally:
        sock.close()
    assert sock.dropped == 0


async def test_after_close_nothing_is_sent_or_delivered():
    queue, on_datagram = collector()
    transport, echo, port = await echo_on("127.0.0.1")
    sock = OSDatagramDialer(Resolver()).open_datagram(on_datagram)
    try:
        sock.sendto(b"one", "127.0.0.1", port)
        await asyncio.wait_for(queue.get(), GENEROUS)
        sock.close()
        sock.close()  # twice is harmless
        with pytest.raises(OSError):
            sock.sendto(b"two", "127.0.0.1", port)
        assert len(echo.seen) == 1
    finally:
        transport.close()


def test_the_dialer_keeps_the_resolver_it_was_given():
    resolver = Resolver()
    assert OSDatagramDialer(resolver).resolver is resolver
