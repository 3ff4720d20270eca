"""The gateway applies peer changes one by one: a join is one peer set, a removal one remove.

Three levels: the peer book's deltas (pure), the gateway following the real coordinator
(in-process, SQLite) with an engine that models a device and counts what it is asked,
and the wireguard-go engine's UAPI writes against a fake UAPI socket (what reaches the
socket: one small ``set=1`` per change, no ``get=1``, no ``replace_peers``; a snapshot
of 10,000 peers in a bounded number of writes).
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

from anex_agent.client.rest import CoordinatorClient
from anex_agent.gateway.peers import PeerBook, PeerDelta
from anex_agent.gateway.service import Gateway
from anex_agent.gateway.settings import build_settings
from anex_agent.wire.keys import KeyPair, encode_key, generate_private_key
from anex_agent.tunnels.engines import wireguard_go
from anex_agent.tunnels.os import uapi
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.tunnels.engines.peer_plan import plan_peers
from anex_agent.tunnels.engines.status import EngineStatus, Support
from anex_agent.wire.gateways import MeshPeer
from anex_agent.wire.watch import WatchEvent
from tests.polling import wait_until


def mp(node_id: str, key: str, ip: str) -> MeshPeer:
    return MeshPeer(node_id=node_id, name=node_id, public_key=key, allowed_ips=[ip])


def key(i: int) -> str:
    return encode_key(i.to_bytes(4, "big") * 8)


# ---------------------------------------------------------------- the book's deltas (pure)


def test_each_event_yields_only_what_it_changed():
    book = PeerBook()
    a, b = mp("n1", key(1), "10.254.0.2/32"), mp("n2", key(2), "10.254.0.3/32")
    assert book.apply(WatchEvent(type="snapshot", version=1, peers=[a])) == PeerDelta(upsert=(a,))
    assert book.apply(WatchEvent(type="peer_added", version=2, peer=b)) == PeerDelta(upsert=(b,))
    assert book.apply(WatchEvent(type="peer_added", version=3, peer=b)) == PeerDelta()  # nothing new
    rekeyed = mp("n2", key(3), "10.254.0.3/32")
    assert book.apply(WatchEvent(type="peer_added", version=4, peer=rekeyed)) == PeerDelta(upsert=(rekeyed,),
                                                                                         remove=(key(2),))
    assert book.apply(WatchEvent(type="peer_removed", version=5, peer=a)) == PeerDelta(remove=(key(1),))
    assert book.has_key(key(3)) and not book.has_key(key(1)) and not book.has_key(key(2))
    # a snapshot after a gap: the difference only (n2 kept as is, n4 new, nothing stale left)
    c = mp("n4", key(4), "10.254.0.5/32")
    delta = book.apply(WatchEvent(type="snapshot", version=3, peers=[rekeyed, c]))
    assert delta == PeerDelta(upsert=(c,)) and book.version == 3  # a snapshot's version is taken as is
    delta = book.apply(WatchEvent(type="snapshot", version=9, peers=[c]))
    assert delta == PeerDelta(remove=(key(3),)) and set(book.peers) == {"n4"}


def test_key_index_follows_moves_between_node_ids():
    book = PeerBook()
    book.apply(WatchEvent(type="peer_added", version=1, peer=mp("n1", key(1), "10.254.0.2/32")))
    moved = mp("n2", key(1), "10.254.0.3/32")
    assert book.apply(WatchEvent(type="peer_added", version=2, peer=moved)) == PeerDelta(upsert=(moved,))
    assert set(book.peers) == {"n2"} and book.has_key(key(1))
    assert book.apply(WatchEvent(type="peer_removed", version=3, peer=mp("n1", key(1), "10.254.0.2/32"))) \
        == PeerDelta(remove=(key(1),))
    assert book.peers == {} and not book.has_key(key(1))


# ---------------------------------------------------------------- the gateway, with the real coordinator


class DeviceEngine(Engine):
    """A device in memory: apply() diffs into it, update_peers() changes only the peers named."""

    name = "device"

    def __init__(self) -> None:
        self.device: dict[str, PeerConfig] = {}
        self.applies = 0
        self.updates: list[tuple[tuple[str, ...], tuple[str, ...]]] = []

    @classmethod
    def is_supported(cls) -> Support:
        return Support(True, "in memory")

    async def start(self, tasks=None) -> None:
        pass

    async def apply(self, desired: DesiredConfig, workload=None) -> bool:
        self.applies += 1
        plan = plan_peers(tuple(self.device.values()), desired.peers)
        for k in plan.remove:
            del self.device[k]
        for peer in plan.add + plan.update:
            self.device[peer.public_key] = peer
        return not plan.empty

    async def update_peers(self, upsert, remove) -> bool:
        self.updates.append((tuple(p.public_key for p in upsert), tuple(remove)))
        for k in remove:
            self.device.pop(k, None)
        for peer in upsert:
            self.device[peer.public_key] = peer
        return True

    async def status(self) -> EngineStatus:
        return EngineStatus(engine=self.name, interface=None, listen_port=0, running=True)

    async def stop(self) -> None:
        pass

    def dialer(self, resolver=None):
        return None


async def started_gateway(url: str, admin: CoordinatorClient, state: Path) -> tuple[Gateway, DeviceEngine]:
    token = (await admin.create_join_token("gateway", reusable=True)).token
    gateway = Gateway(build_settings(coordinator_url=url, token=token, state_dir=str(state),
                                     endpoint="192.0.2.1:51820", routes=["10.96.0.0/12"]))
    gateway.state.ensure()
    gateway.keypair = gateway.state.keypair()
    gateway.engine = engine = DeviceEngine()
    assert await gateway._initial_registration() is True
    await gateway._apply_peers()
    return gateway, engine


async def join(url: str, token: str, name: str) -> tuple[str, str]:
    pair = KeyPair(generate_private_key())
    async with CoordinatorClient(url) as node:
        joined = await node.join(token, pair, name, "other")
    return joined.node_id, pair.public_b64


async def test_a_join_is_one_peer_set_and_a_removal_one_remove(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token(reusable=True)).token
    first = await join(url, token, "n0")
    gateway, engine = await started_gateway(url, admin, tmp_path / "gw")
    watcher = asyncio.create_task(gateway._watch_loop(), name="test-gateway-watch")
    try:
        await asyncio.sleep(0.3)  # the watch's opening snapshot equals the registration's set: no write
        assert set(engine.device) == {first[1]} and engine.applies == 1 and engine.updates == []
        node_id, node_key = await join(url, token, "n1")
        await wait_until(lambda: node_key in engine.device, what="joined node reaches the hub")
        assert engine.updates == [((node_key,), ())] and engine.applies == 1
        await admin.delete_node(node_id)
        await wait_until(lambda: node_key not in engine.device, what="deleted node leaves the hub")
        assert engine.updates[1:] == [((), (node_key,))] and engine.applies == 1
        # what the metrics tell of it: one change of each kind, timed; the stream open
        text = gateway.metrics.exposition().decode()
        assert 'anex_gateway_changes_total{type="peer_added"} 1.0' in text
        assert 'anex_gateway_changes_total{type="peer_removed"} 1.0' in text
        assert "anex_gateway_apply_seconds_count 2.0" in text and "anex_gateway_watch_connected 1.0" in text
        assert "anex_gateway_peers 1.0" in text
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await gateway.link.close()
    saved = gateway.state.load(url)  # the pending save is done when the watch loop ends
    assert saved is not None and [p.public_key for p in saved[1].peers] == [first[1]]


async def test_resync_after_a_watch_gap_converges_to_the_exact_set(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token(reusable=True)).token
    kept = await join(url, token, "kept")
    gone = await join(url, token, "gone")
    gateway, engine = await started_gateway(url, admin, tmp_path / "gw")
    assert set(engine.device) == {kept[1], gone[1]}
    # while the gateway does not follow: a node leaves, another joins, and the device holds a
    # peer nobody knows (a leftover); the coordinator cannot replay from where the gateway is
    await admin.delete_node(gone[0])
    new = await join(url, token, "new")
    stale = key(77)
    engine.device[stale] = PeerConfig(stale, None, ("10.254.9.9/32",), 0)
    gateway.book.version = 10**9
    watcher = asyncio.create_task(gateway._watch_loop(), name="test-gateway-watch")
    try:
        await wait_until(lambda: set(engine.device) == {kept[1], new[1]}, what="hub converges to the coordinator's set")
        assert gateway.book.version < 10**9  # follows the snapshot's version from now on
        later = await join(url, token, "later")  # and goes on incrementally afterwards
        await wait_until(lambda: later[1] in engine.device, what="next join after the resync")
        assert engine.updates[-1] == ((later[1],), ())
    finally:
        watcher.cancel()
        await asyncio.gather(watcher, return_exceptions=True)
        await gateway.link.close()
    assert set(engine.device) == {kept[1], new[1], later[1]}


# ---------------------------------------------------------------- wireguard-go: what reaches the UAPI socket


class FakeUapi:
    """A UAPI socket that records each request and answers ``errno=0`` (``get=1``: an empty device)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[bytes] = []
        self.server: asyncio.AbstractServer | None = None

    async def __aenter__(self) -> FakeUapi:
        self.server = await asyncio.start_unix_server(self._serve, self.path)
        return self

    async def __aexit__(self, *exc) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request = await reader.readuntil(b"\n\n")
        self.requests.append(request)
        writer.write(b"errno=0\n\n")
        await writer.drain()
        writer.close()


class _Running:
    returncode = None


async def test_wireguard_go_update_peers_is_one_small_set(tmp_path):
    engine = wireguard_go.WireguardGoEngine(ifname="anxtest0", socket_dir=str(tmp_path))
    engine._proc = _Running()  # the child "runs": only the socket is used
    added = PeerConfig(key(1), None, ("10.254.0.2/32",), 0)
    async with FakeUapi(engine.socket_path) as fake:
        assert await engine.update_peers([added], []) is True
        assert await engine.update_peers([], [key(2)]) is True
    join_request, remove_request = (r.decode() for r in fake.requests)
    assert len(fake.requests) == 2  # no get=1: the other peers are neither read nor rewritten
    assert join_request.startswith("set=1\n") and join_request.count("public_key=") == 1
    assert "replace_peers" not in join_request and "private_key" not in join_request
    assert f"public_key={added_hex(added)}\n" in join_request
    assert "replace_allowed_ips=true\nallowed_ip=10.254.0.2/32" in join_request
    assert remove_request == f"set=1\npublic_key={added_hex(PeerConfig(key(2), None, (), 0))}\nremove=true\n\n"


def added_hex(peer: PeerConfig) -> str:
    import base64

    return base64.b64decode(peer.public_key).hex()


async def test_wireguard_go_update_peers_defers_to_apply_when_not_running_or_given_a_name(tmp_path):
    engine = wireguard_go.WireguardGoEngine(ifname="anxtest1", socket_dir=str(tmp_path))
    assert await engine.update_peers([PeerConfig(key(1), None, ("10.254.0.2/32",), 0)], []) is False
    engine._proc = _Running()
    named = PeerConfig(key(1), "gw.example.com:51820", ("10.254.0.2/32",), 0)
    assert await engine.update_peers([named], []) is False


def test_a_snapshot_of_10000_peers_goes_in_a_bounded_number_of_writes():
    peers = tuple(PeerConfig(key(i), None, (f"10.{i >> 16 & 255}.{i >> 8 & 255}.{i & 255}/32",), 0)
                  for i in range(1, 10_001))
    desired = DesiredConfig(private_key=bytes(range(32)), listen_port=51820, address="10.254.0.1/16", mtu=1420,
                            peers=peers)
    requests = wireguard_go.apply_requests(uapi.UapiDevice(), desired)
    assert len(requests) == math.ceil(10_000 / wireguard_go.SET_CHUNK)
    text = [r.decode() for r in requests]
    assert "private_key=" in text[0] and all("private_key=" not in t for t in text[1:])
    assert all("replace_peers" not in t for t in text)
    sent = [line.split("=", 1)[1] for t in text for line in t.splitlines() if line.startswith("public_key=")]
    assert sorted(sent) == sorted(added_hex(p) for p in peers)  # every peer once, nothing else


async def test_kernel_update_peers_is_one_set_of_only_those_peers(monkeypatch):
    from anex_agent.tunnels.engines import kernel

    calls = []
    monkeypatch.setattr(kernel, "_wg_set", lambda ifname, device, peers: calls.append((ifname, device, peers)))
    engine = kernel.KernelEngine(ifname="anxtest2")
    assert await engine.update_peers([PeerConfig(key(1), None, ("10.254.0.2/32",), 0)], []) is False  # not started
    engine._started = True
    assert await engine.update_peers([PeerConfig(key(1), None, ("10.254.0.2/32",), 0)], [key(2)]) is True
    [(ifname, device, peers)] = calls
    assert ifname == "anxtest2" and device == {}  # no private key, no port: the device is not rewritten
    assert peers[0] == {"public_key": key(2), "remove": True}
    assert peers[1]["public_key"] == key(1) and peers[1]["replace_allowed_ips"] is True
    assert peers[1]["allowed_ips"] == ["10.254.0.2/32"] and peers[1]["preshared_key"] == kernel.ZERO_KEY_B64
