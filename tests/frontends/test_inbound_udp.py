"""Inbound UDP ports of the built-in engine's stack: one session (a kernel socket) per mesh peer,
replies back to that peer from the port it sent to, idle sessions closed, sessions capped."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

import pytest

from anex_agent.frontends.inbound import InboundServer
from anex_agent.frontends.inbound_udp import IDLE_TIMEOUT, SessionBudget, UdpInboundPort
from anex_agent.netstack import ipv4, udp
from anex_agent.netstack.aio import NetstackRuntime
from anex_agent.netstack.stack import Stack
from tests.polling import wait_until

MESH = "10.45.0.2"
PEER = "10.45.0.1"


class Echo(asyncio.DatagramProtocol):
    """A workload's UDP server on loopback: answers ``echo:<data>`` (or ``reply`` bytes when set)."""

    def __init__(self) -> None:
        self.sources: list[tuple[str, int]] = []
        self.data: list[bytes] = []
        self.reply: bytes | None = None

    def connection_made(self, transport) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr) -> None:
        self.sources.append(addr)
        self.data.append(data)
        self.transport.sendto(self.reply if self.reply is not None else b"echo:" + data, addr)


class Mesh:
    """A stack at MESH whose packets out are collected; datagrams from mesh peers go in."""

    def __init__(self) -> None:
        self.packets: list[bytes] = []
        self.runtime = NetstackRuntime(Stack(MESH, mtu=1420), self.packets.append)

    def send(self, sport: int, dport: int, data: bytes, src: str = PEER) -> None:
        self.runtime.deliver(udp.build(ipaddress.IPv4Address(src).packed, sport, ipaddress.IPv4Address(MESH).packed,
                                       dport, data))

    def received(self) -> list[tuple[int, int, bytes]]:
        """(source port, destination port, data) of the datagrams the stack sent to PEER."""
        out = []
        for packet in self.packets:
            d = udp.parse(ipv4.parse(packet))
            assert d.src == ipaddress.IPv4Address(MESH).packed and d.dst == ipaddress.IPv4Address(PEER).packed
            out.append((d.src_port, d.dst_port, d.data))
        return out


@pytest.fixture
async def echo():
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
    yield protocol, transport.get_extra_info("sockname")[1]
    transport.close()


@pytest.fixture
async def mesh():
    m = Mesh()
    yield m
    m.runtime.close()


async def test_each_peer_gets_its_own_replies_from_the_port_it_sent_to(echo, mesh):
    workload, port = echo
    relay = UdpInboundPort(mesh.runtime, port)
    try:
        mesh.send(40001, port, b"first")
        mesh.send(40002, port, b"second")
        mesh.send(40001, port, b"third")
        replies = await wait_until(lambda: len(mesh.received()) == 3 and mesh.received(), what="three replies")
        assert sorted(replies) == [(port, 40001, b"echo:first"), (port, 40001, b"echo:third"),
                                   (port, 40002, b"echo:second")]
        # one kernel socket per mesh peer: the workload sees two loopback sources
        assert {host for host, _ in workload.sources} == {"127.0.0.1"} and len(set(workload.sources)) == 2
        assert relay.sessions == 2 and relay.opened == 2 and relay.report()["dropped_full"] == 0
    finally:
        relay.close()


async def test_idle_sessions_end_and_a_peer_coming_back_gets_a_new_one(echo, mesh):
    workload, port = echo
    budget = SessionBudget()
    relay = UdpInboundPort(mesh.runtime, port, budget=budget)
    try:
        mesh.send(40001, port, b"a")
        await wait_until(lambda: len(mesh.received()) == 1, what="the reply")
        now = asyncio.get_running_loop().time()
        assert relay.expire(now) == 0 and relay.sessions == 1  # not idle long enough
        assert relay.expire(now + IDLE_TIMEOUT + 1) == 1
        assert relay.sessions == 0 and budget.used == 0
        mesh.send(40001, port, b"b")
        await wait_until(lambda: len(mesh.received()) == 2, what="the second reply")
        assert relay.opened == 2 and len(set(workload.sources)) == 2  # a fresh socket: a new loopback port
    finally:
        relay.close()
    assert budget.used == 0


async def test_the_idle_timer_closes_sessions_by_itself(echo, mesh):
    workload, port = echo
    relay = UdpInboundPort(mesh.runtime, port, idle_timeout=0.01)
    try:
        mesh.send(40001, port, b"a")
        mesh.send(40002, port, b"b")
        await wait_until(lambda: relay.opened == 2, what="two sessions")
        await wait_until(lambda: relay.sessions == 0, what="the idle sessions closed")
    finally:
        relay.close()


async def test_sessions_are_capped_and_the_drops_counted_and_logged_once(echo, mesh, caplog):
    workload, port = echo
    budget = SessionBudget(limit=2)
    relay = UdpInboundPort(mesh.runtime, port, budget=budget)
    caplog.set_level(logging.WARNING, logger="anex_agent.frontends.inbound_udp")
    try:
        for sport in (40001, 40002):
            mesh.send(sport, port, b"x")
        await wait_until(lambda: len(mesh.received()) == 2, what="two replies")
        mesh.send(40003, port, b"over")
        mesh.send(40004, port, b"over")
        mesh.send(40001, port, b"known")  # a peer with a session is still served
        await wait_until(lambda: len(mesh.received()) == 3, what="the known peer's reply")
        assert relay.dropped_full == 2 and relay.sessions == 2 and budget.used == 2
        assert [d for _, dport, d in mesh.received() if dport in (40003, 40004)] == []
        assert b"over" not in workload.data
        assert len([r for r in caplog.records if "sessions open (the most)" in r.message]) == 1
        relay.expire(asyncio.get_running_loop().time() + IDLE_TIMEOUT)
        mesh.send(40003, port, b"again")
        await wait_until(lambda: any(dport == 40003 for _, dport, _ in mesh.received()), what="a new peer served")
    finally:
        relay.close()


async def test_a_port_nobody_serves_counts_refusals(mesh):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    relay = UdpInboundPort(mesh.runtime, port)  # nothing listens there now
    try:
        for _ in range(3):
            mesh.send(40001, port, b"anyone?")
            await wait_until(lambda: relay.sessions == 1, what="the session")
        await wait_until(lambda: relay.refused >= 1, what="the port unreachable counted")
        assert mesh.received() == []
    finally:
        relay.close()


async def test_a_reply_too_large_for_the_mesh_is_dropped_and_counted(echo, mesh):
    workload, port = echo
    workload.reply = bytes(2000)  # the stack does not fragment: at most MTU - 28 bytes
    relay = UdpInboundPort(mesh.runtime, port)
    try:
        mesh.send(40001, port, b"big?")
        await wait_until(lambda: relay.dropped == 1, what="the large reply dropped")
        workload.reply = bytes(1392)
        mesh.send(40001, port, b"fits?")
        await wait_until(lambda: len(mesh.received()) == 1, what="the reply that fits")
    finally:
        relay.close()


async def test_close_unbinds_the_port_and_closes_every_session(echo, mesh):
    workload, port = echo
    relay = UdpInboundPort(mesh.runtime, port)
    mesh.send(40001, port, b"a")
    await wait_until(lambda: len(mesh.received()) == 1, what="the reply")
    relay.close()
    relay.close()  # twice is harmless
    assert port not in mesh.runtime.stack.udp_ports and relay.sessions == 0 and relay.budget.used == 0
    mesh.send(40001, port, b"b")
    assert mesh.runtime.stack.drops["UDP port not bound"] == 1


async def test_the_inbound_server_syncs_udp_ports_and_retries_one_the_stack_held(echo, mesh, caplog):
    workload, port = echo
    server = InboundServer()
    held = mesh.runtime.udp_open(port)  # an ephemeral port of the agent's own, say
    caplog.set_level(logging.WARNING, logger="anex_agent.frontends.inbound")
    server.sync(mesh.runtime, (), (port,))
    assert server.report() == {} and any(f"inbound {port}/udp: not served for now" in r.message for r in caplog.records)
    held.close()
    server.sync(mesh.runtime, (), (port,))
    assert list(server.report()) == [f"{port}/udp"]
    mesh.send(40001, port, b"a")
    await wait_until(lambda: mesh.received() == [(port, 40001, b"echo:a")], what="the reply")
    assert server.report()[f"{port}/udp"]["sessions"] == 1
    server.sync(mesh.runtime, (), ())
    assert server.report() == {} and port not in mesh.runtime.stack.udp_ports
    server.sync(mesh.runtime, (), (port,))
    server.stop()
    assert port not in mesh.runtime.stack.udp_ports
