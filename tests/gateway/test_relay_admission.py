"""The relay bounds what strangers spend before authentication, apart from the nodes' slots.

Real sockets on loopback: strangers connect from 127.0.0.2 (or name a client in
X-Forwarded-For), the node from 127.0.0.1 with the agent's own relay client.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket

import pytest

from anex_agent.wire import keys
from anex_agent.gateway.relay import Relay, RelayLimits
from anex_agent.tunnels.binds.relay_client import RelayTarget, check_relay

STRANGER = "127.0.0.2"
UPGRADE = ("GET /relay HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           "Sec-WebSocket-Protocol: anex-wg.v2\r\n{extra}\r\n")


class World:
    def __init__(self, **limits) -> None:
        self.k_hub, self.k_node = keys.generate_private_key(), keys.generate_private_key()
        self.node_pub = keys.encode_key(keys.public_key(self.k_node))
        self.hub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self.hub.bind(("127.0.0.1", 0))
        self.relay = Relay(host="127.0.0.1", port=0, hub=self.hub.getsockname(), private_key=self.k_hub,
                           is_peer=lambda pub: pub == self.node_pub, limits=RelayLimits(**limits))
        self.writers: list[asyncio.StreamWriter] = []

    async def node_connects(self) -> tuple[bool, str]:
        target = RelayTarget(url=f"ws://127.0.0.1:{self.relay.bound_port}/relay",
                             gateway_public_key=keys.public_key(self.k_hub))
        return await check_relay(target, private_key=self.k_node, public_key=self.node_pub, timeout=10)

    async def stranger(self, *, source: str = STRANGER, upgrade: bool = True,
                       forwarded_for: str | None = None) -> tuple[asyncio.StreamReader | None, bytes]:
        """A connection that never answers the challenge: what the relay said before it waits
        (no reader: reset before the connect returned)."""
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", self.relay.bound_port, local_addr=(source, 0))
        except ConnectionResetError:  # refused at the accept before the connect returned
            return None, b""
        self.writers.append(writer)
        if not upgrade:
            return reader, b""
        extra = f"X-Forwarded-For: {forwarded_for}\r\n" if forwarded_for else ""
        writer.write(UPGRADE.format(extra=extra).encode("latin-1"))
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        except asyncio.IncompleteReadError:  # its deadline passed already
            return reader, b""
        if head.startswith(b"HTTP/1.1 101"):
            await asyncio.wait_for(reader.read(200), 10)  # the challenge
        return reader, head

    def close(self) -> None:
        for writer in self.writers:
            writer.transport.abort()
        self.hub.close()


@pytest.fixture
async def world(request):
    w = World(**getattr(request, "param", {}))
    await w.relay.start()
    try:
        yield w
    finally:
        w.close()
        await w.relay.close()


async def closed_by_relay(reader: asyncio.StreamReader | None) -> bool:
    """Whether the relay ends this connection (EOF or reset) within a generous deadline."""
    if reader is None:
        return True
    try:
        while await asyncio.wait_for(reader.read(4096), 15):
            pass
    except ConnectionResetError:
        pass
    return True


@pytest.mark.parametrize("world", [{"max_pending_per_source": 2}], indirect=True)
async def test_a_source_beyond_its_share_is_refused_at_the_accept_and_a_node_still_gets_in(world):
    for _ in range(2):
        await world.stranger()
    reader, _ = await world.stranger(upgrade=False)
    assert await closed_by_relay(reader)  # refused before the upgrade was read
    ok, how = await world.node_connects()
    assert ok, how
    report = world.relay.report()
    assert report["refused_source"] == 1 and report["accepted"] == 1 and report["pending"] == 2


@pytest.mark.parametrize("world", [{"max_pending": 3, "max_pending_per_source": 8}], indirect=True)
async def test_when_the_budget_is_full_the_oldest_stranger_makes_room_for_the_node(world):
    first, _ = await world.stranger()
    for _ in range(2):
        await world.stranger()
    ok, how = await world.node_connects()
    assert ok, how
    assert await closed_by_relay(first)
    assert world.relay.report()["refused_evicted"] == 1


@pytest.mark.parametrize("world", [{"auth_timeout": 0.5}], indirect=True)
async def test_a_connection_silent_before_its_upgrade_is_dropped_at_the_deadline(world):
    reader, _ = await world.stranger(upgrade=False)
    assert await closed_by_relay(reader)
    assert world.relay.report()["refused_timeout"] == 1 and world.relay.report()["pending"] == 0


@pytest.mark.parametrize("world", [{"max_pending": 1, "max_connections": 1}], indirect=True)
async def test_authenticated_nodes_do_not_count_as_waiting_and_fill_their_own_slots(world):
    ok, how = await world.node_connects()  # check_relay closes its connection afterwards
    assert ok, how
    stranger, head = await world.stranger()
    assert head.startswith(b"HTTP/1.1 101")  # the node's earlier connection left the budget
    assert world.relay.report()["pending"] == 1


TRUSTED = {"trusted_proxies": (ipaddress.ip_network("127.0.0.0/8"),), "max_pending_per_source": 1}


@pytest.mark.parametrize("world", [TRUSTED], indirect=True)
async def test_behind_a_trusted_proxy_each_forwarded_client_has_its_own_share(world):
    _, head = await world.stranger(forwarded_for="198.51.100.7")
    assert head.startswith(b"HTTP/1.1 101")
    _, head = await world.stranger(forwarded_for="203.0.113.1, 198.51.100.7")  # the proxy appended the same client
    assert head.startswith(b"HTTP/1.1 429")
    _, head = await world.stranger(forwarded_for="198.51.100.8")
    assert head.startswith(b"HTTP/1.1 101")


@pytest.mark.parametrize("world", [{"max_pending_per_source": 1}], indirect=True)
async def test_x_forwarded_for_from_an_untrusted_peer_is_ignored(world):
    await world.stranger(forwarded_for="198.51.100.7")
    reader, _ = await world.stranger(upgrade=False)  # another client named in the header changes nothing
    assert await closed_by_relay(reader)
    assert world.relay.report()["refused_source"] == 1


@pytest.mark.parametrize("world", [{"auth_timeout": 1.0}], indirect=True)
async def test_refusals_reach_the_log_bounded_escaped_and_rate_limited(world, caplog):
    caplog.set_level(logging.INFO, logger="anex_agent.gateway.relay")
    header = "\x9b31m" + "A" * 8000 + "\t\xff"  # a C1 terminal escape, a tab: what HTTP lets through
    readers = [(await world.stranger(forwarded_for=header))[0] for _ in range(6)]
    for reader in readers:
        await closed_by_relay(reader)
    readers = [(await world.stranger(forwarded_for=header))[0] for _ in range(6)]
    for reader in readers:
        await closed_by_relay(reader)
    refusals = [r.getMessage() for r in caplog.records if "refused a connection" in r.getMessage()]
    assert world.relay.report()["refused_timeout"] == 12
    assert len(refusals) == 10  # the budget: the rest are counted, not logged
    for line in refusals:
        assert len(line) < 400 and "\x9b" not in line and "\xff" not in line and "\t" not in line
    assert any("forwarded for \\x9b31mAAA" in line and "(7910 more)" in line for line in refusals), refusals
