"""UserspaceEngine end to end on loopback: two engines in this process, real UDP sockets."""

from __future__ import annotations

import asyncio
import socket
import time

import pytest

from anex_agent.wire import keys
from anex_agent.errors import EngineError
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.registry import engine_classes
from anex_agent.tunnels.engines.userspace import UserspaceEngine
from anex_agent.wg.routing import packet_addresses
from tests.polling import GENEROUS, wait_until

IP_A, IP_B = "10.44.0.1", "10.44.0.2"


def ipv4(src: str, dst: str, payload: bytes) -> bytes:
    import ipaddress
    import struct

    return struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(payload), 0, 0, 64, 17, 0,
                       ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed) + payload


def desired(key: bytes, peer_key: bytes, address: str, peer_ip: str, endpoint: str | None, port=None, **kw):
    return DesiredConfig(private_key=key, listen_port=port, address=f"{address}/24", mtu=1420, peers=(
        PeerConfig(public_key=keys.encode_key(keys.public_key(peer_key)), endpoint=endpoint,
                   allowed_ips=(f"{peer_ip}/32",), **kw),))


@pytest.fixture
async def engines(tasks):
    ka, kb = keys.generate_private_key(), keys.generate_private_key()
    a, b = UserspaceEngine(ifname="ignored"), UserspaceEngine(ifname=None)
    await a.start(tasks)
    await b.start(tasks)
    await b.apply(desired(kb, ka, IP_B, IP_A, None))
    port_b = (await b.status()).listen_port
    await a.apply(desired(ka, kb, IP_A, IP_B, f"127.0.0.1:{port_b}"))
    try:
        yield a, b, ka, kb, port_b
    finally:
        await a.stop()
        await b.stop()


async def test_registered_and_always_supported():
    assert engine_classes()["userspace"] is UserspaceEngine
    support = UserspaceEngine.is_supported()
    assert support.ok and "UDP" in support.reason


async def test_serves_the_workload_through_its_stack():
    assert UserspaceEngine.workload_support().ok
    dialer = UserspaceEngine(ifname=None).dialer()
    assert hasattr(dialer, "open_connection")


async def test_packets_flow_both_ways_and_status_reports_the_handshake(engines):
    a, b, ka, kb, port_b = engines
    before = time.time()
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"to b"))
    got = await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)
    assert got == ipv4(IP_A, IP_B, b"to b")
    b.tunnel.send_packet(ipv4(IP_B, IP_A, b"to a"))
    assert await asyncio.wait_for(a.tunnel.receive_packet(), GENEROUS) == ipv4(IP_B, IP_A, b"to a")
    sa, sb = await a.status(), await b.status()
    assert sa.running and sa.engine == "userspace" and sa.interface is None and sa.listen_port > 0
    pa = sa.peer(keys.encode_key(keys.public_key(kb)))
    pb = sb.peer(keys.encode_key(keys.public_key(ka)))
    assert pa.endpoint == f"127.0.0.1:{port_b}" and pb.endpoint == f"127.0.0.1:{sa.listen_port}"  # learnt
    assert before - 1 <= pa.last_handshake <= time.time() + 1
    assert pa.tx_bytes > 0 and pa.rx_bytes > 0 and pa.allowed_ips == (f"{IP_B}/32",)


async def test_apply_is_idempotent_and_keeps_the_session(engines):
    a, b, ka, kb, port_b = engines
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"x"))
    await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)
    device = a.tunnel.device
    same = desired(ka, kb, IP_A, IP_B, f"127.0.0.1:{port_b}")
    await a.apply(same)
    await a.apply(same)
    assert a.tunnel.device is device
    assert a.tunnel.events["handshake-initiated"] == 1
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"y"))
    assert (await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)).endswith(b"y")
    assert a.tunnel.events["handshake-initiated"] == 1  # no new handshake was needed
    await a.apply(DesiredConfig(private_key=ka, listen_port=None, address=f"{IP_A}/24", mtu=1420))
    assert (await a.status()).peers == ()


async def test_persistent_keepalive_peer_handshakes_at_once(engines):
    a, b, ka, kb, port_b = engines
    await a.apply(desired(ka, kb, IP_A, IP_B, f"127.0.0.1:{port_b}", persistent_keepalive=25))
    async def handshaken():
        return (await b.status()).peers[0].last_handshake is not None
    await wait_until(handshaken, what="a handshake with no packet sent")


async def test_stop_releases_the_port_and_is_idempotent(engines):
    a, b, ka, kb, port_b = engines
    await b.stop()
    await b.stop()
    assert not (await b.status()).running
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port_b))  # free again
    sock.close()
    await UserspaceEngine(ifname=None).stop()  # stop before start is fine


async def test_bad_peer_config_is_an_engine_error(tasks):
    engine = UserspaceEngine(ifname=None)
    await engine.start(tasks)
    key = keys.generate_private_key()
    try:
        with pytest.raises(EngineError):
            await engine.apply(DesiredConfig(private_key=key, listen_port=None, address="10.44.0.1/24", mtu=1420, peers=(
                PeerConfig(public_key=keys.encode_key(keys.public_key(key)), endpoint=None, allowed_ips=()),)))
    finally:
        await engine.stop()


async def test_decrypted_packets_are_trimmed_to_their_ip_length(engines):
    a, b, *_ = engines
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"abc"))
    got = await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)
    assert len(got) == packet_addresses(got)[2] == 23


async def test_a_failing_packet_handler_does_not_stop_the_tunnel(engines):
    a, b, *_ = engines
    calls = []

    def handler(packet: bytes, peer: bytes) -> None:
        calls.append(packet)
        if len(calls) == 1:
            raise RuntimeError("bug in the IP layer")

    b.tunnel.on_packet = handler
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"first"))
    await wait_until(lambda: calls, what="the first packet at the handler")
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"second"))
    await wait_until(lambda: len(calls) == 2, what="the second packet at the handler")
    assert [c[20:] for c in calls] == [b"first", b"second"]
    assert b.tunnel.drop_reasons["packet handler failed"] == 1


async def test_follows_an_endpoint_whose_name_resolves_elsewhere(tasks):
    """The gateway moves (same key, new address): the endpoint policy's re-resolution points the peer at it."""
    from anex_agent.tunnels.engines.endpoints import EndpointPolicy

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    ka, kb = keys.generate_private_key(), keys.generate_private_key()
    old_gw, new_gw = UserspaceEngine(listen_host="127.0.0.1"), UserspaceEngine(listen_host="127.0.0.2")
    dns: dict[str, str] = {}

    async def resolver(host: str, port: int) -> list[str]:  # DNS is the one thing faked here
        if host not in dns:
            raise OSError(f"cannot resolve {host}")
        return [dns[host]]

    node = UserspaceEngine(ifname=None)
    policy = EndpointPolicy(resolver)
    wanted = desired(ka, kb, IP_A, IP_B, f"gw.test:{port}")

    async def reapply():
        await node.apply(await policy.resolve(wanted))

    for engine in (node, old_gw, new_gw):
        await engine.start(tasks)
    try:
        await old_gw.apply(desired(kb, ka, IP_B, IP_A, None, port=port))
        await new_gw.apply(desired(kb, ka, IP_B, IP_A, None, port=port))
        dns["gw.test"] = "127.0.0.1"
        with pytest.raises(EngineError, match="cannot resolve"):
            await node.apply(await policy.resolve(desired(ka, kb, IP_A, IP_B, "nowhere.test:1")))
        await node.apply(await policy.resolve(wanted))
        tasks.spawn("endpoint-follow", lambda: policy.follow(reapply, 0.05))
        node.tunnel.send_packet(ipv4(IP_A, IP_B, b"to the old address"))
        assert (await asyncio.wait_for(old_gw.tunnel.receive_packet(), GENEROUS)).endswith(b"to the old address")
        dns["gw.test"] = "127.0.0.2"  # the gateway moved to another host
        async def moved():
            return (await node.status()).peers[0].endpoint == f"127.0.0.2:{port}"
        await wait_until(moved, what="the endpoint following the name")
        del dns["gw.test"]  # DNS failing later keeps the last good address
        await asyncio.sleep(0.2)
        assert (await node.status()).peers[0].endpoint == f"127.0.0.2:{port}"
        node.tunnel.device.expire_sessions(keys.public_key(kb))  # the new host has no session: rekey
        node.tunnel.send_packet(ipv4(IP_A, IP_B, b"to the new address"))
        assert (await asyncio.wait_for(new_gw.tunnel.receive_packet(), GENEROUS)).endswith(b"to the new address")
    finally:
        for engine in (node, old_gw, new_gw):
            await engine.stop()


async def test_a_custom_bind_carries_the_tunnel(tasks):
    """Any object with send/receive/close/local_port works as the path (the WebSocket Bind's seam)."""
    from anex_agent.tunnels.binds.udp import BindClosed

    class QueueBind:
        def __init__(self, name: str) -> None:
            self.name, self.local_port, self.inbox, self.other = name, 0, asyncio.Queue(), None

        def send(self, datagram: bytes, endpoint) -> None:
            self.other.inbox.put_nowait((datagram, ("relay", self.name)))

        async def receive(self):
            item = await self.inbox.get()
            if item is None:
                raise BindClosed()
            return item

        def close(self) -> None:
            self.inbox.put_nowait(None)

    bind_a, bind_b = QueueBind("a"), QueueBind("b")
    bind_a.other, bind_b.other = bind_b, bind_a

    async def factory_for(bind):
        async def factory(port):
            return bind
        return factory

    ka, kb = keys.generate_private_key(), keys.generate_private_key()
    a = UserspaceEngine(ifname=None, bind_factory=await factory_for(bind_a))
    b = UserspaceEngine(ifname=None, bind_factory=await factory_for(bind_b))
    await a.start(tasks)
    await b.start(tasks)
    try:
        await b.apply(desired(kb, ka, IP_B, IP_A, None))
        await a.apply(desired(ka, kb, IP_A, IP_B, "192.0.2.1:51820"))  # the relay ignores the endpoint
        a.tunnel.send_packet(ipv4(IP_A, IP_B, b"over the relay"))
        assert (await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)).endswith(b"over the relay")
    finally:
        await a.stop()
        await b.stop()


async def test_drop_reasons_stay_bounded_under_garbage(engines):
    a, b, *_ = engines
    for i in range(200):
        b.tunnel.handle(b.tunnel.device.receive_datagram(bytes([i % 256]) + bytes(3) + bytes(i), ("192.0.2.1", 1), 0.0))
    assert sum(b.tunnel.drop_reasons.values()) == 200
    assert len(b.tunnel.drop_reasons) < 10


async def test_stopping_a_task_never_swallows_the_caller_s_own_cancellation():
    """The engine's stop waits for its receive task; when the caller (the agent's watch task
    applying a config, a TaskGroup leaving) is cancelled meanwhile, it must end cancelled, not
    carry on as if nothing happened."""
    from anex_agent.tunnels.engines.userspace import _cancelled

    started, inner_cancelled, release = asyncio.Event(), asyncio.Event(), asyncio.Event()

    async def slow_to_end():
        try:
            started.set()
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            inner_cancelled.set()
            await release.wait()  # its own clean-up takes a while
            raise

    carried_on = []

    async def caller(task):
        await _cancelled(task)
        carried_on.append(True)

    inner = asyncio.create_task(slow_to_end(), name="inner")
    await started.wait()
    outer = asyncio.create_task(caller(inner), name="caller")
    await inner_cancelled.wait()
    outer.cancel()
    release.set()
    await asyncio.wait({outer})
    assert outer.cancelled() and carried_on == []
    assert inner.cancelled()


async def test_a_burst_is_received_pushed_in_batches_and_sent_with_one_call_per_batch(engines, monkeypatch):
    """The UDP Bind pushes what one wake-up read (no queue between it and the device), the device
    handles each batch in one call, and a batch of packets leaves with one send_batch."""
    a, b, ka, kb, port_b = engines
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"handshake first"))
    await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)
    batches, sends = [], []
    receive_datagrams = b.tunnel.device.receive_datagrams
    monkeypatch.setattr(b.tunnel.device, "receive_datagrams",
                        lambda batch, now: batches.append(len(batch)) or receive_datagrams(batch, now))
    send_batch = a.tunnel.bind.send_batch
    monkeypatch.setattr(a.tunnel.bind, "send_batch", lambda datagrams: sends.append(len(datagrams)) or send_batch(datagrams))
    packets = [ipv4(IP_A, IP_B, i.to_bytes(2, "big")) for i in range(100)]
    a.tunnel.send_packets(packets)
    got = [await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS) for _ in packets]
    assert got == packets  # all, in order
    assert sends == [100]
    assert sum(batches) == 100 and len(batches) < 100
    assert b.tunnel.bind._queue.empty()


async def test_on_packets_gets_all_that_one_batch_decrypted_in_one_call(engines):
    a, b, ka, kb, port_b = engines
    a.tunnel.send_packet(ipv4(IP_A, IP_B, b"handshake first"))
    await asyncio.wait_for(b.tunnel.receive_packet(), GENEROUS)
    calls: list[list[bytes]] = []
    b.tunnel.on_packets = lambda received: calls.append([r.packet for r in received])
    packets = [ipv4(IP_A, IP_B, i.to_bytes(2, "big")) for i in range(50)]
    a.tunnel.send_packets(packets)
    await wait_until(lambda: sum(map(len, calls)) == 50, what="all packets at on_packets")
    assert [p for call in calls for p in call] == packets and len(calls) < 50
    assert b.tunnel._packets.empty()  # none went the one-by-one way
