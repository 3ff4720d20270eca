"""WireGuard over the WebSocket relay, in this process: the gateway's Relay, the agent's binds, real sockets."""

from __future__ import annotations

import asyncio
import socket

import pytest
from websockets.asyncio.client import connect
from websockets.exceptions import ConnectionClosed

from anex_agent.wire import keys
from anex_agent.net import relay_protocol as rp
from anex_agent.gateway.relay import Relay, RelayLimits
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.userspace import UserspaceEngine
from anex_agent.tunnels.binds.relay_client import RelayTarget
from anex_agent.tunnels.binds.ws import LocalRelay, WebSocketBind
from tests.polling import GENEROUS

IP_A, IP_B = "10.44.0.1", "10.44.0.2"


def ipv4(src: str, dst: str, payload: bytes) -> bytes:
    import ipaddress
    import struct

    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 17, 0,
                       ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed) + payload


def desired(key: bytes, peer_key: bytes, address: str, peer_ip: str, endpoint: str | None, **kw):
    return DesiredConfig(private_key=key, listen_port=None, address=f"{address}/24", mtu=1420, peers=(
        PeerConfig(public_key=keys.encode_key(keys.public_key(peer_key)), endpoint=endpoint,
                   allowed_ips=(f"{peer_ip}/32",), **kw),))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Mesh:
    """A userspace hub on UDP loopback, its relay, and the keys of one node."""

    def __init__(self, tasks) -> None:
        self.tasks = tasks
        self.k_hub, self.k_node = keys.generate_private_key(), keys.generate_private_key()
        self.node_pub = keys.encode_key(keys.public_key(self.k_node))
        self.peers = {self.node_pub}
        self.hub = UserspaceEngine(ifname=None, listen_host="127.0.0.1")
        self.relay: Relay | None = None
        self.ws_port = free_port()

    async def start(self) -> None:
        await self.hub.start(self.tasks)
        await self.hub.apply(desired(self.k_hub, self.k_node, IP_B, IP_A, None))
        self.hub_port = (await self.hub.status()).listen_port
        await self.start_relay()

    async def start_relay(self, auth_timeout: float = GENEROUS) -> None:
        """The relay; an honest client's authentication never races ``auth_timeout`` (the test of
        the timeout itself starts one with a short one: silence makes it fire however busy the machine)."""
        self.relay = Relay(host="127.0.0.1", port=self.ws_port, hub=("127.0.0.1", self.hub_port),
                           private_key=self.k_hub, is_peer=lambda pub: pub in self.peers,
                           limits=RelayLimits(auth_timeout=auth_timeout))
        await self.relay.start()

    def target(self) -> RelayTarget:
        return RelayTarget(url=f"ws://127.0.0.1:{self.ws_port}/relay", gateway_public_key=keys.public_key(self.k_hub))

    async def close(self) -> None:
        if self.relay is not None:
            await self.relay.close()
        await self.hub.stop()


@pytest.fixture
async def mesh(tasks):
    m = Mesh(tasks)
    await m.start()
    try:
        yield m
    finally:
        await m.close()


async def node_over_websocket(mesh: Mesh) -> tuple[UserspaceEngine, WebSocketBind]:
    endpoint = ("192.0.2.7", 51820)  # the gateway's UDP endpoint as the config names it; never reached over UDP
    holder: list[WebSocketBind] = []

    async def factory(port):
        bind = WebSocketBind.open({endpoint: mesh.target()}, mesh.tasks, private_key=mesh.k_node,
                                  public_key=mesh.node_pub)
        holder.append(bind)
        return bind

    node = UserspaceEngine(ifname=None, bind_factory=factory)
    await node.start(mesh.tasks)
    await node.apply(desired(mesh.k_node, mesh.k_hub, IP_A, IP_B, "192.0.2.7:51820", persistent_keepalive=1))
    return node, holder[0]


async def exchange(node: UserspaceEngine, hub: UserspaceEngine, text: bytes, timeout: float = GENEROUS) -> None:
    async def attempt():
        while True:
            node.tunnel.send_packet(ipv4(IP_A, IP_B, text))
            try:
                got = await asyncio.wait_for(hub.tunnel.receive_packet(), 0.5)
            except asyncio.TimeoutError:
                continue
            if got.endswith(text):
                return
    await asyncio.wait_for(attempt(), timeout)
    hub.tunnel.send_packet(ipv4(IP_B, IP_A, b"back:" + text))
    while not (await asyncio.wait_for(node.tunnel.receive_packet(), timeout)).endswith(b"back:" + text):
        pass


async def test_userspace_engine_runs_over_the_relay_with_no_udp_hop(mesh):
    node, bind = await node_over_websocket(mesh)
    try:
        await exchange(node, mesh.hub, b"over websocket")
        assert (await node.status()).listen_port == 0  # no UDP socket on the node
        hub_peer = (await mesh.hub.status()).peers[0]
        assert hub_peer.endpoint.startswith("127.0.0.1:")  # the relay's own socket towards the hub
        assert mesh.relay.report()["accepted"] == 1 and mesh.relay.connections == {mesh.node_pub: 1}
        client = next(iter(bind.clients.values()))
        assert client.connected and client.counters["connects"] == 1
        assert client.subprotocol == rp.SUBPROTOCOL_BATCH  # both sides offer batching: it is chosen
    finally:
        await node.stop()


async def test_relay_restart_is_survived_without_restarting_the_engine(mesh):
    node, bind = await node_over_websocket(mesh)
    try:
        await exchange(node, mesh.hub, b"before")
        await mesh.relay.close()
        await mesh.start_relay()
        await exchange(node, mesh.hub, b"after the relay restarted")
        assert next(iter(bind.clients.values())).counters["connects"] == 2
    finally:
        await node.stop()


async def test_a_node_that_is_not_a_peer_is_refused_before_any_datagram(mesh):
    hub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # stands in for the hub: nothing may arrive
    hub.bind(("127.0.0.1", 0))
    hub.setblocking(False)
    mesh.relay.hub = hub.getsockname()
    stranger = keys.generate_private_key()
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        challenge = rp.parse_challenge(await ws.recv())
        await ws.send(rp.answer_message(private_key=stranger, public_key=keys.encode_key(keys.public_key(stranger)),
                                        gateway_public=keys.public_key(mesh.k_hub), challenge=challenge))
        for _ in range(20):
            try:
                await ws.send(b"\x01" + bytes(147))  # looks like a handshake initiation
            except ConnectionClosed:
                break
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), GENEROUS)
    assert closed.value.rcvd.code == rp.CLOSE_UNAUTHENTICATED
    with pytest.raises(BlockingIOError):
        hub.recv(2048)
    hub.close()
    assert mesh.relay.report()["refused_auth"] == 1 and "accepted" not in mesh.relay.report()


async def test_a_stolen_public_key_without_its_private_key_is_refused(mesh):
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        challenge = rp.parse_challenge(await ws.recv())
        wrong = keys.generate_private_key()  # the node's public key, but a proof made with another key
        await ws.send(rp.answer_message(private_key=wrong, public_key=mesh.node_pub,
                                        gateway_public=keys.public_key(mesh.k_hub), challenge=challenge))
        with pytest.raises(ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), GENEROUS)
    assert closed.value.rcvd.code == rp.CLOSE_UNAUTHENTICATED


async def test_binary_before_authentication_and_silence_are_refused(mesh):
    await mesh.relay.close()
    await mesh.start_relay(auth_timeout=0.5)
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        await ws.recv()
        await ws.send(b"\x01" * 148)
        with pytest.raises(ConnectionClosed):
            await asyncio.wait_for(ws.recv(), GENEROUS)
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        await ws.recv()
        with pytest.raises(ConnectionClosed):  # auth_timeout is 0.5 s here
            await asyncio.wait_for(ws.recv(), GENEROUS)
    report = mesh.relay.report()
    assert report["refused_auth"] == 1 and report["refused_timeout"] == 1


async def test_without_the_subprotocol_the_upgrade_is_refused(mesh):
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        async with connect(mesh.target().url):
            pass
    assert refused.value.response.status_code == 400


async def test_connection_limit_answers_503(mesh):
    mesh.relay.limits = RelayLimits(max_connections=0)
    from websockets.exceptions import InvalidStatus

    with pytest.raises(InvalidStatus) as refused:
        async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]):
            pass
    assert refused.value.response.status_code == 503


async def test_local_relay_carries_an_engine_that_owns_its_udp_socket(mesh):
    """The native engines' shape: the engine's UDP socket, its peer endpoint at 127.0.0.1:<local relay>."""
    local = await LocalRelay.open(mesh.target(), private_key=mesh.k_node, public_key=mesh.node_pub)
    mesh.tasks.spawn("local-relay", local.run)
    node = UserspaceEngine(ifname=None, listen_host="127.0.0.1")
    await node.start(mesh.tasks)
    try:
        await node.apply(desired(mesh.k_node, mesh.k_hub, IP_A, IP_B, local.endpoint, persistent_keepalive=1))
        await exchange(node, mesh.hub, b"through the local relay")
        assert local.client.connected
    finally:
        local.close()
        await node.stop()


def test_the_proof_is_bound_to_the_challenge_and_the_gateway():
    node, gw, other_gw = (keys.generate_private_key() for _ in range(3))
    pub = keys.encode_key(keys.public_key(node))
    text = rp.answer_message(private_key=node, public_key=pub, gateway_public=keys.public_key(gw), challenge="c" * 32)
    answer = rp.parse_answer(text)
    rp.verify_answer(answer, gateway_private=gw, gateway_public=keys.public_key(gw), challenge="c" * 32)
    with pytest.raises(rp.RelayProtocolError):
        rp.verify_answer(answer, gateway_private=gw, gateway_public=keys.public_key(gw), challenge="d" * 32)
    with pytest.raises(rp.RelayProtocolError):
        rp.verify_answer(answer, gateway_private=other_gw, gateway_public=keys.public_key(other_gw),
                         challenge="c" * 32)


async def test_the_one_datagram_per_message_baseline_still_relays(mesh):
    """A client that offers only anex-wg.v1 is served: each binary message is one datagram to the hub."""
    hub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hub.bind(("127.0.0.1", 0))
    hub.settimeout(GENEROUS)
    mesh.relay.hub = hub.getsockname()
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        assert ws.subprotocol == rp.SUBPROTOCOL
        challenge = rp.parse_challenge(await ws.recv())
        await ws.send(rp.answer_message(private_key=mesh.k_node, public_key=mesh.node_pub,
                                        gateway_public=keys.public_key(mesh.k_hub), challenge=challenge))
        rp.parse_ok(await ws.recv())
        await ws.send(b"first")
        await ws.send(b"second")
        got = [await asyncio.to_thread(hub.recvfrom, 2048) for _ in range(2)]
        assert [data for data, _ in got] == [b"first", b"second"]
        hub.sendto(b"back", got[0][1])
        assert await asyncio.wait_for(ws.recv(), GENEROUS) == b"back"
    hub.close()


def test_batched_framing_round_trips_and_refuses_a_truncated_message():
    datagrams = [b"a" * 1400, b"", b"b" * 40000, b"c" * 30000, b"d"]
    messages = rp.pack(datagrams)
    assert len(messages) == 2 and all(len(m) <= rp.MAX_BATCH for m in messages)
    assert [d for m in messages for d in rp.unpack(m)] == datagrams
    with pytest.raises(rp.RelayProtocolError):
        rp.unpack(messages[0][:-1])
    with pytest.raises(rp.RelayProtocolError):
        rp.unpack(b"\x05")


async def test_the_relay_serves_tls_itself_and_the_client_verifies_it(mesh, tmp_path):
    """--tls-cert/--tls-key: the relay terminates TLS; a client trusting the CA connects, one that does not is refused."""
    import ssl

    from anex_agent.gateway.relay import tls_context
    from anex_agent.client.transport import client_ssl_context
    from anex_agent.tunnels.binds.relay_client import check_relay
    from tests.tls_certs import make_certs

    certs = make_certs(tmp_path, dns_names=())
    await mesh.relay.close()
    mesh.relay = Relay(host="127.0.0.1", port=mesh.ws_port, hub=("127.0.0.1", mesh.hub_port), private_key=mesh.k_hub,
                       is_peer=lambda pub: pub in mesh.peers,
                       ssl_context=tls_context(str(certs.cert), str(certs.key)))
    await mesh.relay.start()
    url = f"wss://127.0.0.1:{mesh.ws_port}/relay"
    trusted = RelayTarget(url=url, gateway_public_key=keys.public_key(mesh.k_hub),
                          ssl_context=client_ssl_context(certs.ca))
    ok, why = await check_relay(trusted, private_key=mesh.k_node, public_key=mesh.node_pub, timeout=GENEROUS)
    assert ok, why
    untrusted = RelayTarget(url=url, gateway_public_key=keys.public_key(mesh.k_hub), ssl_context=ssl.create_default_context())
    ok, why = await check_relay(untrusted, private_key=mesh.k_node, public_key=mesh.node_pub, timeout=GENEROUS)
    assert not ok and "certificate" in why.lower()


async def test_a_node_s_handshake_messages_reach_the_hub_within_its_relay_budget(mesh):
    """Every relayed node reaches the hub from one address: a node sending initiations beyond its
    budget has them dropped at the relay (counted); its other datagrams still go through."""
    from anex_agent.gateway.relay import RelayLimits

    burst = RelayLimits().handshake_burst
    hub = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    hub.bind(("127.0.0.1", 0))
    hub.settimeout(5)
    mesh.relay.hub = hub.getsockname()
    initiation, transport = b"\x01\0\0\0" + bytes(144), b"\x04\0\0\0" + bytes(28)
    async with connect(mesh.target().url, subprotocols=[rp.SUBPROTOCOL]) as ws:
        challenge = rp.parse_challenge(await ws.recv())
        await ws.send(rp.answer_message(private_key=mesh.k_node, public_key=mesh.node_pub,
                                        gateway_public=keys.public_key(mesh.k_hub), challenge=challenge))
        rp.parse_ok(await ws.recv())
        for _ in range(3 * burst):
            await ws.send(initiation)
        await ws.send(transport)
        got = []
        while not got or got[-1] != transport:
            got.append((await asyncio.to_thread(hub.recvfrom, 2048))[0])
    hub.close()
    assert burst <= got.count(initiation) < 2 * burst  # the burst, and what the budget refilled meanwhile
    assert mesh.relay.counters["dropped_handshake_to_hub"] == 3 * burst - got.count(initiation)
