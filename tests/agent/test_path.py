"""Path choice in this process: a real engine, a real hub and relay, UDP between them through a switchable blocker.

No test here races the clock: a probe that must succeed gets a generous timeout (it returns
as soon as the handshake completes), a probe that must fail gets a short one (a busy machine
only makes it fail more surely), and every wait is for the event itself, with a deadline
(:data:`tests.polling.GENEROUS`) far beyond what an idle machine needs. The watch uses one
setting (``watch_probe_timeout``, then ``confirm_probe_timeout`` for the second try) both for the
probes that find UDP still working and for the ones that find it blocked: :func:`patient_while_open`
gives the former a generous timeout.
"""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from anex_agent.wire import keys
from anex_agent.agent.path import Counters, PathManager, PathSettings, SilenceWatch
from anex_agent.gateway.relay import Relay
from anex_agent.wire.keys import KeyPair
from anex_agent.tasks import Tasks
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.binds.udp_probe import ProbeResult, probe_gateway
from anex_agent.tunnels.engines.userspace import UserspaceEngine
from tests.polling import GENEROUS, wait_until

IP_NODE, IP_HUB = "10.45.0.2", "10.45.0.1"


def ipv4(src: str, dst: str, payload: bytes) -> bytes:
    import ipaddress
    import struct

    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 17, 0,
                       ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed) + payload


class Blocker(asyncio.DatagramProtocol):
    """A UDP forwarder standing in for the network: ``blocked`` drops everything, both ways.

    ``on_drop()`` is called for each datagram dropped; ``to_client`` lists where the hub's
    datagrams were sent (the last address that sent something to the hub, as a NAT would),
    ``from_client`` the ``(address, datagram)`` of each datagram forwarded to the hub."""

    def __init__(self, hub: tuple[str, int]) -> None:
        self.hub = hub
        self.blocked = False
        self.client = None
        self.transport = None
        self.on_drop = lambda: None
        self.to_client: list[tuple[str, int]] = []
        self.from_client: list[tuple[tuple[str, int], bytes]] = []

    def datagram_received(self, data, addr):
        if self.blocked:
            self.on_drop()
            return
        if addr == self.hub:
            if self.client is not None:
                self.to_client.append(self.client)
                self.transport.sendto(data, self.client)
        else:
            self.client = addr
            self.from_client.append((addr, data))
            self.transport.sendto(data, self.hub)

    def sent_by(self, address: tuple[str, int], since: int = 0) -> list[bytes]:
        """The datagrams ``address`` sent to the hub, from the ``since``-th forwarded on."""
        return [data for addr, data in self.from_client[since:] if addr == address]


def is_keepalive(datagram: bytes) -> bool:
    """A WireGuard keepalive: a transport data message (type 4) with nothing inside (whitepaper §5.4.6)."""
    return datagram[0] == 4 and len(datagram) == 32


def test_silence_watch_probes_after_quiet_and_backs_off_while_udp_answers():
    watch = SilenceWatch(after=3, cap=30, wait=3)
    assert not watch.observe(100, 0.0)
    assert not watch.observe(100, 2.9)
    assert watch.observe(100, 3.0)                    # 3 s with nothing from the gateways: probe
    watch.probed_ok(3.0)                              # UDP answered: next probe in 6 s
    assert not watch.observe(100, 8.9) and watch.observe(100, 9.0)
    for now in (9.0, 21.0, 45.0, 93.0):
        watch.probed_ok(now)
    assert watch.wait == 30                           # a quiet node: one probe per half minute at most
    assert not watch.observe(180, 94.0)               # something arrived: back to 3 s
    assert not watch.observe(180, 96.9) and watch.observe(180, 97.0)


@pytest.fixture
async def tasks():
    async with asyncio.TaskGroup() as group:
        yield Tasks(group, role="test", base=0.05, cap=0.2)
        for task in list(group._tasks):
            task.cancel()


@pytest.fixture
async def world(tasks):
    k_hub, k_node = keys.generate_private_key(), keys.generate_private_key()
    hub_pub, node_pub = (keys.encode_key(keys.public_key(k)) for k in (k_hub, k_node))
    hub = UserspaceEngine(ifname=None, listen_host="127.0.0.1")
    await hub.start(tasks)
    await hub.apply(DesiredConfig(private_key=k_hub, listen_port=None, address=f"{IP_HUB}/24", mtu=1420, peers=(
        PeerConfig(public_key=node_pub, endpoint=None, allowed_ips=(f"{IP_NODE}/32",)),)))
    hub_port = (await hub.status()).listen_port
    loop = asyncio.get_running_loop()
    blocker = Blocker(("127.0.0.1", hub_port))
    transport, _ = await loop.create_datagram_endpoint(lambda: blocker, local_addr=("127.0.0.1", 0))
    blocker.transport = transport
    udp_endpoint = f"127.0.0.1:{transport.get_extra_info('sockname')[1]}"
    relay = Relay(host="127.0.0.1", port=0, hub=("127.0.0.1", hub_port), private_key=k_hub,
                  is_peer=lambda pub: pub == node_pub)
    await relay.start()
    node = UserspaceEngine(ifname=None, listen_host="127.0.0.1")  # owns its UDP socket, like the native engines
    await node.start(tasks)
    desired = DesiredConfig(private_key=k_node, listen_port=None, address=f"{IP_NODE}/24", mtu=1420, peers=(
        PeerConfig(public_key=hub_pub, endpoint=udp_endpoint, allowed_ips=(f"{IP_HUB}/32",), persistent_keepalive=25),))
    config = SimpleNamespace(gateways=[SimpleNamespace(public_key=hub_pub, ws_url=f"ws://127.0.0.1:{relay.bound_port}/")])
    world = SimpleNamespace(hub=hub, node=node, blocker=blocker, relay=relay, desired=desired, config=config,
                            keypair=KeyPair(k_node), tasks=tasks, k_hub=k_hub, udp_endpoint=udp_endpoint)
    try:
        yield world
    finally:
        await node.stop()
        await relay.close()
        transport.close()
        await hub.stop()


def patient_while_open(world, manager: PathManager) -> None:
    """The manager's probes wait :data:`GENEROUS` s when the blocker lets UDP through as they start
    (they must succeed, however busy the machine), and the timeout the manager asked for when it is
    blocked (the watch's short one must fail; a probe with the generous ``probe_timeout`` that spans
    the unblocking completes on one of its retries)."""
    real_probe = manager.probe_udp

    async def probe(timeout=None):
        return await real_probe(timeout if world.blocker.blocked else GENEROUS)
    manager.probe_udp = probe


def wire(world, manager: PathManager):
    async def reapply():
        await world.node.apply(await manager.route(world.desired, world.config))

    async def counters():
        status = await world.node.status()
        peer = status.peers[0]
        return Counters(peer.rx_bytes, peer.tx_bytes,
                        None if peer.last_handshake is None else time.time() - peer.last_handshake)

    async def reset():
        return await world.node.reset_sessions(await manager.route(world.desired, world.config), within=3, every=0.5)

    return reapply, counters, reset


async def traffic_flows(world, label: bytes, timeout: float = GENEROUS) -> None:
    """Send packets node -> hub (one every 0.25 s) until one arrives; AssertionError after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        world.node.tunnel.send_packet(ipv4(IP_NODE, IP_HUB, label))
        if await packet_arrives(world.hub, label, 0.25):
            return
    raise AssertionError(f"no packet {label!r} from the node reached the hub within {timeout:g} s")


async def test_probe_proves_udp_both_ways(world):
    hub_key = keys.public_key(world.k_hub)
    host, port = world.udp_endpoint.split(":")
    ok = await probe_gateway(world.keypair.private, hub_key, (host, int(port)), timeout=GENEROUS)
    assert ok.ok and ok.rtt is not None
    world.blocker.blocked = True
    blocked = await probe_gateway(world.keypair.private, hub_key, (host, int(port)), timeout=0.5)
    assert not blocked.ok and "within 0.5 s" in blocked.reason


async def test_probe_retries_until_the_hub_answers(world):
    """A hub that answers only a moment after the node joined (it learns the node's key from the
    coordinator's watch stream) or one lost initiation must not make UDP look blocked."""
    hub_key = keys.public_key(world.k_hub)
    host, port = world.udp_endpoint.split(":")
    world.blocker.blocked = True
    dropped = []

    def unblock():  # the first initiation is lost: only a retry can complete the handshake
        dropped.append(1)
        world.blocker.blocked = False
    world.blocker.on_drop = unblock
    result = await probe_gateway(world.keypair.private, hub_key, (host, int(port)), timeout=GENEROUS)
    assert result.ok, result.reason
    assert dropped == [1]


async def test_auto_picks_websocket_when_udp_is_blocked_from_the_start(world):
    world.blocker.blocked = True
    manager = PathManager(PathSettings(probe_timeout=0.5), world.keypair)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "websocket"
    routed = await manager.route(world.desired, world.config)
    assert routed.peers[0].endpoint.startswith("127.0.0.1:") and routed.peers[0].endpoint != world.udp_endpoint
    await world.node.apply(routed)
    await traffic_flows(world, b"over the relay")
    assert manager.report()["current"] == "websocket" and "within 0.5 s" in manager.reason
    await manager.close()


async def test_blocked_mid_session_moves_to_websocket_and_returns_when_unblocked(world):
    # probe_timeout: the probes that must succeed (the first choice, the return); watch_probe_timeout:
    # the one that must fail once UDP is blocked (short, so the switch comes soon)
    manager = PathManager(PathSettings(probe_timeout=GENEROUS, watch_probe_timeout=1, confirm_probe_timeout=1,
                                       probe_interval=1, stall_after=1, check_every=0.2), world.keypair)
    patient_while_open(world, manager)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "udp"
    reapply, counters, reset = wire(world, manager)
    await reapply()
    await traffic_flows(world, b"udp")
    world.tasks.spawn("path-watch", lambda: manager.watch(counters, reapply, reset))

    world.blocker.blocked = True
    await wait_until(lambda: manager.path == "websocket", what="the watch moving to the WebSocket path")
    await traffic_flows(world, b"after the block")
    assert manager.switches[-1]["to"] == "websocket" and "nothing received" in manager.switches[-1]["reason"]

    world.blocker.blocked = False
    await wait_until(lambda: manager.path == "udp", what="the watch returning to UDP")
    assert "UDP works again" in manager.reason
    await traffic_flows(world, b"udp again")
    assert not manager.relays  # the relay connection is closed on return
    blocker_port = world.blocker.transport.get_extra_info("sockname")[1]
    assert (await world.hub.status()).peers[0].endpoint == f"127.0.0.1:{blocker_port}"  # the hub hears UDP again
    await manager.close()


async def patient_manager_on_udp(world):
    """A manager whose probes all wait GENEROUS s (they must decide by what they see, never by the
    clock), on UDP with traffic flowing; and its wiring (reapply, counters, reset)."""
    manager = PathManager(PathSettings(probe_timeout=GENEROUS, watch_probe_timeout=GENEROUS,
                                       confirm_probe_timeout=GENEROUS, stall_after=0.5, check_every=0.1),
                          world.keypair)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "udp"
    wiring = wire(world, manager)
    await wiring[0]()
    await traffic_flows(world, b"udp")
    return manager, wiring


async def test_one_failed_probe_of_a_quiet_node_does_not_move_it_off_udp(world):
    """A busy gateway (or node) that misses the watch's short probe once: the second, longer probe
    completes and the node stays on UDP; only a second failure would move it."""
    manager, (reapply, counters, reset) = await patient_manager_on_udp(world)
    real_probe = manager.probe_udp
    probes: list[float] = []

    async def first_one_missed(timeout=None):
        probes.append(timeout)
        if len(probes) == 1:  # as if the gateway's answer came after the short timeout
            return ProbeResult(False, "no handshake response within 2 s")
        return await real_probe(timeout)
    manager.probe_udp = first_one_missed
    world.tasks.spawn("path-watch", lambda: manager.watch(counters, reapply, reset))
    await wait_until(lambda: len(probes) >= 2 and manager.last_probe is not None and manager.last_probe.ok,
                     what="the second probe completing")
    assert manager.path == "udp" and not manager.switches
    await traffic_flows(world, b"still udp")
    await manager.close()


async def test_datagrams_arriving_while_a_probe_failed_keep_the_node_on_udp(world):
    """The watch's short probe fails, but the gateway's datagrams reached the engine meanwhile:
    UDP works, with no second probe and no switch."""
    manager, (reapply, counters, reset) = await patient_manager_on_udp(world)
    probes: list[float | None] = []
    nudges: list[int] = []

    async def missed_while_the_hub_sends(timeout=None):
        probes.append(timeout)
        await hub_reaches_the_node(world, b"meanwhile")  # the engine receives from the gateway
        return ProbeResult(False, "no handshake response within 2 s")
    manager.probe_udp = missed_while_the_hub_sends

    async def nudge():
        nudges.append(len(probes))
    world.tasks.spawn("path-watch", lambda: manager.watch(counters, reapply, reset, nudge))
    await wait_until(lambda: nudges, what="the watch's verdict after the failed probe")
    assert nudges[0] == 1 and manager.path == "udp" and not manager.switches  # one probe, no confirmation
    await manager.close()


async def test_udp_mode_never_switches_and_websocket_mode_never_probes(world):
    world.blocker.blocked = True
    udp = PathManager(PathSettings(mode="udp", probe_timeout=0.3), world.keypair)
    assert await udp.choose_initial(world.desired, world.config, world.tasks) == "udp" and udp.last_probe is None
    ws = PathManager(PathSettings(mode="websocket", probe_timeout=0.3), world.keypair)
    assert await ws.choose_initial(world.desired, world.config, world.tasks) == "websocket" and ws.last_probe is None
    await ws.close()


async def test_udp_blocked_and_no_relay_offered_is_path_none_with_the_reason(world):
    """No gateway offers a relay: UDP is the only path; blocked, the node has none and says why;
    unblocked, it is on UDP again."""
    world.config = SimpleNamespace(gateways=[SimpleNamespace(public_key=world.config.gateways[0].public_key,
                                                             ws_url=None)])
    # probe_timeout: the probes that must succeed (the first choice, the return); watch_probe_timeout:
    # the one that must fail once UDP is blocked
    manager = PathManager(PathSettings(probe_timeout=GENEROUS, watch_probe_timeout=0.5, confirm_probe_timeout=0.5,
                                       probe_interval=1, stall_after=0.5, check_every=0.1), world.keypair)
    patient_while_open(world, manager)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "udp"
    reapply, counters, reset = wire(world, manager)
    await reapply()
    await traffic_flows(world, b"udp")
    assert manager.current() == "udp"
    world.tasks.spawn("path-watch", lambda: manager.watch(counters, reapply, reset))

    world.blocker.blocked = True
    await wait_until(lambda: manager.current() == "none", what="path none")
    report = manager.report()
    assert report["current"] == "none" and manager.path == "udp"  # nothing to steer to
    assert "no gateway offers a WebSocket relay" in report["reason"] and "within 0.5 s" in report["reason"]
    assert report["switches"][-1]["to"] == "none"

    world.blocker.blocked = False
    await wait_until(lambda: manager.current() == "udp", what="UDP again")
    assert "UDP works again" in manager.report()["reason"] and manager.report()["switches"][-1]["to"] == "udp"
    await traffic_flows(world, b"udp again")
    await manager.close()


async def test_websocket_asked_for_but_no_relay_offered_says_udp(world):
    world.config = SimpleNamespace(gateways=[SimpleNamespace(public_key=world.config.gateways[0].public_key,
                                                             ws_url=None)])
    manager = PathManager(PathSettings(mode="websocket"), world.keypair)
    await manager.choose_initial(world.desired, world.config, world.tasks)
    routed = await manager.route(world.desired, world.config)
    assert routed.peers[0].endpoint == world.udp_endpoint  # what the engine really uses
    assert manager.current() == "udp" and manager.report()["current"] == "udp"
    assert "no gateway offers a WebSocket relay" in manager.report()["reason"]
    await manager.close()


async def test_an_engine_that_takes_a_bind_switches_inside_it_with_no_local_hop(world, tasks):
    """The userspace engine gets the path's SwitchBind: same peer endpoint on both paths, no LocalRelay."""
    world.blocker.blocked = True
    manager = PathManager(PathSettings(probe_timeout=0.5), world.keypair)
    assert await manager.choose_initial(world.desired, world.config, tasks) == "websocket"
    node = UserspaceEngine(ifname=None, listen_host="127.0.0.1", bind_factory=manager.bind_factory(tasks, "127.0.0.1"))
    assert node.takes_bind and not UserspaceEngine.host_address
    await node.start(tasks)
    world.node = node
    try:
        reapply, counters, reset = wire(world, manager)
        routed = await manager.route(world.desired, world.config)
        assert routed == world.desired  # endpoints untouched: the Bind carries the switch
        await reapply()
        await traffic_flows(world, b"websocket inside the bind")
        assert not manager.relays and (await node.status()).listen_port > 0
        (relay,) = manager.report()["relays"].values()
        assert relay["connected"]
        assert (await node.status()).peers[0].endpoint == world.udp_endpoint

        world.blocker.blocked = False
        await manager.switch("udp", "test: back to UDP", reapply, reset)
        await traffic_flows(world, b"udp again inside the bind")
        assert manager.report()["relays"] == {}
    finally:
        await node.stop()
        await manager.close()


async def packet_arrives(engine, label: bytes, timeout: float) -> bool:
    """Whether a packet ending in ``label`` comes out of ``engine``'s tunnel within ``timeout`` s
    (one try of a loop with its own deadline: False is "not yet", never the verdict)."""
    try:
        async def wait():
            while not (await engine.tunnel.receive_packet()).endswith(label):
                pass
        await asyncio.wait_for(wait(), timeout)
        return True
    except asyncio.TimeoutError:
        return False


async def test_a_keepalive_pulls_the_hub_back_after_a_probe_on_an_engine_without_an_interface(world):
    """The probe's handshake comes from another socket, so the hub's replies go there (here: the
    blocker's client address, as a NAT would) until the engine sends again; the userspace engine
    (no OS interface) sends a WireGuard keepalive when asked, through its own Bind (the native
    engines' keepalive: ``integration/test_engines.py``).

    Without it WireGuard's own timers would pull the hub back too, later (the node, having sent
    data and heard nothing, starts a handshake after 15 s, whitepaper §6.5): so the test asserts
    the cause, not the delay: the node's first datagram after the call is that keepalive."""
    manager = PathManager(PathSettings(probe_timeout=GENEROUS), world.keypair)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "udp"
    await world.node.apply(world.desired)
    await traffic_flows(world, b"udp")
    node_address = ("127.0.0.1", (await world.node.status()).listen_port)
    assert world.blocker.to_client[-1] == node_address
    assert (await manager.probe_udp(GENEROUS)).ok
    sent_before = len(world.blocker.to_client)
    world.hub.tunnel.send_packet(ipv4(IP_HUB, IP_NODE, b"to the probe's socket"))
    await wait_until(lambda: len(world.blocker.to_client) > sent_before, what="the hub sending the packet")
    assert world.blocker.to_client[-1] != node_address  # the gap the keepalive closes: it went to the probe's socket

    hub_pub = world.config.gateways[0].public_key
    since = len(world.blocker.from_client)
    assert await world.node.send_keepalive([hub_pub]) is True
    assert await world.node.send_keepalive([keys.encode_key(bytes(32))]) is False  # not a peer: nothing
    first = (await wait_until(lambda: world.blocker.sent_by(node_address, since), what="the node's keepalive"))[0]
    assert is_keepalive(first), f"the node's first datagram was of type {first[0]}, not a keepalive"
    await hub_reaches_the_node(world, b"pulled back")
    assert world.blocker.to_client[-1] == node_address


async def hub_reaches_the_node(world, label: bytes, timeout: float = GENEROUS) -> None:
    """Packets hub -> node, one every 0.3 s, until one arrives; AssertionError after ``timeout`` s.
    (The node's WireGuard timers pull the hub back too, in 15 s: the callers assert the cause.)"""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        world.hub.tunnel.send_packet(ipv4(IP_HUB, IP_NODE, label))
        if await packet_arrives(world.node, label, 0.3):
            return
    raise AssertionError("the hub kept answering the probe's socket")


async def test_the_watch_pulls_the_hub_back_after_a_quiet_probe(world):
    """A quiet node on UDP probes; with the engine's keepalive as the nudge, the hub's next
    packets reach the engine, not the probe's closed socket (the nudge's keepalive is the
    node's first datagram after it, as in the test above)."""
    manager = PathManager(PathSettings(probe_timeout=GENEROUS, watch_probe_timeout=GENEROUS, stall_after=0.5,
                                       check_every=0.1), world.keypair)
    assert await manager.choose_initial(world.desired, world.config, world.tasks) == "udp"
    reapply, counters, reset = wire(world, manager)
    await reapply()
    await traffic_flows(world, b"udp")
    node_address = ("127.0.0.1", (await world.node.status()).listen_port)
    probes = []
    real_probe = manager.probe_udp

    async def counted_probe(timeout=None):
        probes.append(time.monotonic())
        return await real_probe(timeout)
    manager.probe_udp = counted_probe
    hub_pub = world.config.gateways[0].public_key
    nudges: list[int] = []  # how many datagrams the blocker had forwarded at each nudge

    async def nudge():
        nudges.append(len(world.blocker.from_client))
        return await world.node.send_keepalive([hub_pub])
    world.tasks.spawn("path-watch", lambda: manager.watch(counters, reapply, reset, nudge))
    await wait_until(lambda: nudges, what="a probe, done and answered, then the nudge")
    assert probes, "the watch nudged without probing"
    first = (await wait_until(lambda: world.blocker.sent_by(node_address, nudges[0]), what="the node's keepalive"))[0]
    assert is_keepalive(first), f"the node's first datagram after the nudge was of type {first[0]}, not a keepalive"
    await hub_reaches_the_node(world, b"after the probe")
    assert manager.path == "udp"


async def test_the_switch_bind_pushes_both_paths_to_a_receiver(tasks):
    """With a receiver set, UDP batches and relay datagrams go straight to it; no queue in between."""
    from anex_agent.tunnels.binds.udp import UdpBind
    from anex_agent.tunnels.binds.switch import SwitchBind

    key = keys.generate_private_key()
    bind = await SwitchBind.open(0, "127.0.0.1", tasks, private_key=key, public_key=keys.encode_key(keys.public_key(key)))
    peer = await UdpBind.open(0, "127.0.0.1")
    got: list = []
    bind.set_receiver(got.extend)
    try:
        endpoint = ("127.0.0.1", peer.local_port)
        peer.send_batch([(b"one", ("127.0.0.1", bind.local_port)), (b"two", ("127.0.0.1", bind.local_port))])
        await wait_until(lambda: len(got) == 2, what="both UDP datagrams at the receiver")
        assert got == [(b"one", endpoint), (b"two", endpoint)]
        bind._put((b"from a relay", endpoint))  # what a relay client's on_datagram does
        assert got[-1] == (b"from a relay", endpoint) and bind._queue.empty()
        bind.send_batch([(b"back", endpoint), (b"again", endpoint)])
        assert [(await asyncio.wait_for(peer.receive(), GENEROUS))[0] for _ in range(2)] == [b"back", b"again"]
    finally:
        bind.close()
        peer.close()
