"""The data plane treats every engine the same, through the engine contract only.

Two stand-in engines that implement nothing but :class:`anex_agent.tunnels.engines.base.Engine`:
one gives a dialer (the agent's proxy and forwards serve the workload), one serves the
workload itself (its dialer is None). DNS is injected; everything else is real.
"""

from __future__ import annotations

import asyncio
import socket
import sys
from pathlib import Path

import pytest

from anex_agent.agent.dataplane import DataPlane
from anex_agent.agent.settings import AgentSettings, ListenAddress, TunnelSetting
from anex_agent.net.datagram import OSDatagramDialer
from anex_agent.net.dialer import OSDialer
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.tasks import Tasks
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, WorkloadConfig
from anex_agent.tunnels.engines.status import EngineStatus, Support
from anex_agent.wire.nodes import GatewayPeer, NodeConfig, TunnelSpec
from tests.polling import wait_until

GW = KeyPair(generate_private_key()).public_b64


class ContractEngine(Engine):
    """Records what the data plane gives it; no attribute beyond the contract is read by the data plane."""

    name = "contract-dialer"
    gives_dialer = True

    def __init__(self, *, ifname=None, state_dir=None) -> None:
        self.applied: list[tuple[DesiredConfig, WorkloadConfig | None]] = []
        self.resets = 0
        self.started_with = None
        self.keepalives: list[dict[str, str]] = []
        self.handshake_asks: list[frozenset[str]] = []

    @classmethod
    def is_supported(cls) -> Support:
        return Support(True, "in memory")

    async def start(self, tasks) -> None:
        self.started_with = tasks

    async def apply(self, desired, workload=None) -> bool:
        changed = not self.applied or self.applied[-1] != (desired, workload)
        self.applied.append((desired, workload))
        return changed

    async def status(self) -> EngineStatus:
        return EngineStatus(self.name, None, 0, True)

    async def stop(self) -> None:
        pass

    def dialer(self, resolver):
        return OSDialer(resolver) if self.gives_dialer else None

    def datagram_dialer(self, resolver):
        return OSDatagramDialer(resolver) if self.gives_dialer else None

    async def reset_sessions(self, desired, *, within=10.0, every=1.0) -> bool:
        self.resets += 1
        return False

    async def send_keepalive(self, gateways) -> bool:
        self.keepalives.append(set(gateways))
        return True

    async def handshake_now(self, desired, keys) -> bool:
        self.handshake_asks.append(frozenset(keys))
        return True

    def report(self):
        return {} if self.gives_dialer else {"served_forwards": len(self.applied[-1][1].forwards)}

    def endpoints(self) -> list[str | None]:
        return [p.endpoint for p in self.applied[-1][0].peers]


class SelfServingEngine(ContractEngine):
    name = "contract-self"
    gives_dialer = False
    host_address = False  # no OS interface (like wireproxy or the built-in engine)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def config(version=1, address="10.254.0.7", tunnels=(), dns=("10.254.0.1",)) -> NodeConfig:
    return NodeConfig(node_id="n", version=version, address=address, network="10.254.0.0/16", mtu=1380, dns=list(dns),
                      gateways=[GatewayPeer(id="g", public_key=GW, endpoint="gw.example.test:51820",
                                            allowed_ips=["10.254.0.0/16"], mesh_address="10.254.0.1")],
                      tunnels=list(tunnels))


class Dns(dict):
    """Name -> addresses, counting the lookups made."""
    lookups = 0


@pytest.fixture
async def plane(tmp_path):
    """make(engine_cls) -> (DataPlane, dns dict); DNS answers come from the dict."""
    made = []
    dns = Dns({"gw.example.test": ["192.0.2.1"]})

    async def resolve(host: str, port: int) -> list[str]:
        dns.lookups += 1
        if host not in dns:
            raise OSError("no such name")
        return list(dns[host])

    async with asyncio.TaskGroup() as group:
        tasks = Tasks(group, role="agent", base=0.05, cap=0.2)

        async def make(engine_cls, **overrides):
            settings = AgentSettings(coordinator_url="http://c", join_token="", state_dir=Path(tmp_path),
                                     proxy_listen=ListenAddress("127.0.0.1", free_port()),
                                     tunnels=(TunnelSetting("GW_TUNNEL_X", TunnelSpec(listen_port=free_port(),
                                                                                      target="db.local:5432")),),
                                     **overrides)
            dp = DataPlane(settings, KeyPair(generate_private_key()), {}, endpoint_resolve=resolve, resolve_interval=0.05)
            dp.engine_cls = engine_cls  # what choose_engine() would have picked
            await dp.start(config(), tasks)
            made.append(dp)
            return dp, tasks

        yield make, dns
        for dp in made:
            await dp.stop()
        for task in list(group._tasks):
            task.cancel()


@pytest.mark.parametrize("engine_cls", [ContractEngine, SelfServingEngine])
async def test_a_moved_gateway_is_followed_whatever_the_engine(plane, engine_cls):
    make, dns = plane
    dp, tasks = await make(engine_cls)
    engine = dp.engine
    assert engine.started_with is tasks  # the engine's tasks belong to the agent's TaskGroup
    assert engine.endpoints() == ["192.0.2.1:51820"]  # engines get addresses, never names
    seen = dns.lookups
    await wait_until(lambda: dns.lookups >= seen + 3, what="three more lookups of the gateway's name")
    assert engine.endpoints() == ["192.0.2.1:51820"] and len(engine.applied) == 1  # nothing moved: no apply
    dns["gw.example.test"] = ["198.51.100.7"]
    await wait_until(lambda: engine.endpoints() == ["198.51.100.7:51820"], what="the engine to follow the move")
    del dns["gw.example.test"]  # DNS trouble later: the last good address stays
    assert await dp.apply(config(version=2)) is False
    assert engine.endpoints() == ["198.51.100.7:51820"]
    assert (await dp.status_doc())["endpoints"] == {"gw.example.test:51820": "198.51.100.7"}


async def test_an_engine_that_gives_a_dialer_gets_our_proxy_and_forwards(plane):
    make, _ = plane
    dp, _ = await make(ContractEngine)
    assert dp.proxy is not None and dp.forwards is not None
    port = dp.settings.proxy_listen.port
    with socket.create_connection(("127.0.0.1", port), timeout=5):
        pass  # our proxy listens
    pushed = TunnelSpec(listen_port=free_port(), target="redis.local:6379")
    assert await dp.apply(config(version=2, tunnels=[pushed])) is True
    assert dp.tunnels()[pushed.listen_port] == "redis.local:6379"
    assert await dp.apply(config(version=3, tunnels=[pushed])) is False  # same again: nothing changed
    assert "contract-dialer" not in await dp.status_doc()  # no engine report: no key
    assert dp.dialer.inner.resolver is dp.resolver  # the dialer keeps the slot; a DNS change refills it
    assert await dp.apply(config(version=4, tunnels=[pushed], dns=("10.254.0.2",))) is True
    assert [str(s) for s in dp.resolver.current.cluster_dns] == ["10.254.0.2"]


async def test_an_engine_that_serves_the_workload_gets_it_with_every_apply(plane):
    make, _ = plane
    dp, _ = await make(SelfServingEngine)
    assert dp.proxy is None and dp.forwards is None  # the engine serves them
    workload = dp.engine.applied[-1][1]
    assert workload.proxy_address == str(dp.settings.proxy_listen) and workload.gateways == ("10.254.0.1",)
    pushed = TunnelSpec(listen_port=free_port(), target="redis.local:6379")
    assert await dp.apply(config(version=2, tunnels=[pushed])) is True
    assert pushed.listen_port in {f.listen_port for f in dp.engine.applied[-1][1].forwards}
    assert dp.tunnels()[pushed.listen_port] == "redis.local:6379"
    assert (await dp.status_doc())["contract-self"] == {"served_forwards": 2}
    await dp.reset_gateway_sessions()
    assert dp.engine.resets == 1  # the engine decides how to reset its sessions


class SilentGatewayEngine(ContractEngine):
    """Sends (tx grows at every look) and hears nothing until its sessions are reset."""

    name = "contract-silent"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.rx, self.tx, self.handshake = 1000, 1000, None

    async def status(self) -> EngineStatus:
        from anex_agent.tunnels.engines.status import PeerStatus

        self.tx += 200
        return EngineStatus(self.name, None, 0, True, (PeerStatus(GW, "192.0.2.1:51820", self.handshake, self.rx, self.tx),))

    async def reset_sessions(self, desired, *, within=10.0, every=1.0) -> bool:
        import time

        self.resets += 1
        self.rx += 92
        self.handshake = time.time()
        return True


async def test_a_silent_gateway_gets_a_fresh_handshake_shown_in_status_and_heartbeat(plane, monkeypatch):
    from anex_agent.agent import dataplane as dataplane_module
    from anex_agent.agent.liveness import DeadPeerWatch

    monkeypatch.setattr(dataplane_module, "DeadPeerWatch",
                        lambda after: DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05))
    make, _ = plane
    dp, _ = await make(SilentGatewayEngine)
    await wait_until(lambda: dp.engine.resets >= 1, what="the silent gateway's handshake reset")
    assert dp.engine.resets >= 1  # no coordinator involved: the data plane did it by itself
    doc = await dp.status_doc()
    assert doc["dead_peer"]["detections"] >= 1 and doc["dead_peer"]["events"][0]["recovered_after"] is not None
    transport = await dp.transport_status()  # what the heartbeat sends
    assert "nothing received" in transport.dead_peer and "handshake again" in transport.dead_peer


GW2 = KeyPair(generate_private_key()).public_b64


class OneSilentOfTwoEngine(ContractEngine):
    """Two gateways: GW carries the traffic (tx grows) and never answers; GW2 is a standby that
    handshook recently. Records the desired config of each session reset (there should be none)."""

    name = "contract-two"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.tx = 1000
        self.reset_with: list[DesiredConfig] = []

    async def status(self) -> EngineStatus:
        import time

        from anex_agent.tunnels.engines.status import PeerStatus

        self.tx += 200
        return EngineStatus(self.name, None, 0, True, (
            PeerStatus(GW, "192.0.2.1:51820", time.time() - 5, 1000, self.tx),
            PeerStatus(GW2, "192.0.2.2:51820", time.time() - 5, 700, 700)))

    async def reset_sessions(self, desired, *, within=10.0, every=1.0) -> bool:
        self.resets += 1
        self.reset_with.append(desired)
        return True


async def test_a_silent_gateway_s_traffic_moves_to_the_other_through_the_engine(plane, monkeypatch):
    from anex_agent.agent import dataplane as dataplane_module
    from anex_agent.agent.liveness import DeadPeerWatch

    monkeypatch.setattr(dataplane_module, "DeadPeerWatch",
                        lambda after: DeadPeerWatch(after=0.2, check_every=0.02, retry=0.05))
    two = config()
    two.gateways.append(GatewayPeer(id="g2", public_key=GW2, endpoint="192.0.2.2:51820",
                                    allowed_ips=["10.254.0.0/16"], mesh_address="10.254.0.2"))
    two = two.model_copy(update={"dns": ["10.254.0.1", "10.254.0.2"]})  # each gateway serves DNS on its address
    make, _ = plane
    monkeypatch.setattr(sys.modules[__name__], "config", lambda *a, **k: two)
    dp, _ = await make(OneSilentOfTwoEngine)
    # the watch records the demotion, then steers (an engine apply): wait for the apply itself
    def steered_away() -> bool:
        peers = dp.engine.applied[-1][0].peers
        return bool(dp.liveness.demoted) and len(peers) == 2 and any(
            p.public_key == GW2 and "10.254.0.0/16" in p.allowed_ips for p in peers)

    await wait_until(steered_away, what="the silent gateway demoted and the traffic steered away from it")
    steered = {p.public_key: p.allowed_ips for p in dp.engine.applied[-1][0].peers}
    # the other gateway carries the mesh now; each keeps its own address
    assert steered[GW] == ("10.254.0.1/32",) and steered[GW2] == ("10.254.0.0/16", "10.254.0.2/32")
    # the silent one was dropped and added again (it handshakes anew), the standby kept throughout
    assert [p.public_key for p in dp.engine.applied[-2][0].peers] == [GW2]
    assert dp.engine.reset_with == []
    assert "traffic moved to gateway" in (await dp.status_doc())["dead_peer"]["events"][0]["reason"]
    assert dp.route_changes.moves >= 1  # dials in flight (SYNs lost to the silent gateway) start again
    # and names are asked of the gateway that answers first
    assert [s.address for s in dp.resolver.current.cluster_dns] == ["10.254.0.2", "10.254.0.1"]
    await dp.apply(config(version=2))  # a config push keeps the traffic on the gateway that answers
    assert {p.public_key: p.allowed_ips for p in dp.engine.applied[-1][0].peers}[GW] == ("10.254.0.1/32",)


@pytest.mark.parametrize("engine_cls", [ContractEngine, SelfServingEngine])
async def test_the_pull_back_after_a_probe_asks_the_engine_whatever_it_is(plane, engine_cls):
    """After a UDP probe the hub answers the probe's socket until the engine's next datagram:
    the data plane asks the engine to send one to each gateway, with or without an OS interface."""
    make, _ = plane
    dp, _ = await make(engine_cls)
    await dp._nudge()
    assert dp.engine.keepalives == [{GW}]


async def test_the_engine_starts_while_the_path_is_chosen(plane, monkeypatch):
    from anex_agent.agent.path import PathManager

    make, _ = plane
    choosing = asyncio.Event()
    choose_initial = PathManager.choose_initial

    async def choose(self, *args, **kwargs):
        choosing.set()
        return await choose_initial(self, *args, **kwargs)

    monkeypatch.setattr(PathManager, "choose_initial", choose)

    class StartsAlongsideThePathChoice(ContractEngine):
        async def start(self, tasks) -> None:
            await asyncio.wait_for(choosing.wait(), 5)  # one after the other, this would time out
            await super().start(tasks)

    dp, tasks = await make(StartsAlongsideThePathChoice)
    assert dp.engine.started_with is tasks and dp.path == "udp"


async def test_status_says_udp_when_websocket_is_asked_for_and_no_gateway_offers_a_relay(plane):
    make, _ = plane
    dp, _ = await make(ContractEngine, path="websocket")  # the test config's gateway has no ws_url
    doc = await dp.status_doc()
    assert doc["path"] == "udp" and doc["path_choice"]["current"] == "udp"
    assert "ANEX_PATH=websocket, but no gateway offers a WebSocket relay" in doc["path_choice"]["reason"]
    status = await dp.transport_status()
    assert status.path == "udp" and status.path_reason == doc["path_choice"]["reason"]


async def test_an_engine_that_fails_to_start_raises_its_own_error(plane):
    from anex_agent.errors import EngineError

    make, _ = plane

    class Broken(ContractEngine):
        async def start(self, tasks) -> None:
            raise EngineError("no TUN device here")

    with pytest.raises(EngineError, match="no TUN device here"):
        await make(Broken)


class NoYieldEngine(ContractEngine):
    """Its ``status()`` never suspends (as the built-in userspace engine's): a caller that asks it
    again without letting the event loop run in between would starve every other task, which
    this engine refuses loudly. A handshake shows once it was given a gateway peer."""

    name = "contract-no-yield"

    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.loop_ran = True

    def _ran(self) -> None:
        self.loop_ran = True

    async def status(self) -> EngineStatus:
        import time

        from anex_agent.tunnels.engines.status import PeerStatus

        assert self.loop_ran, "status() asked again without the event loop running in between"
        self.loop_ran = False
        asyncio.get_running_loop().call_soon(self._ran)
        peers = self.applied[-1][0].peers if self.applied else ()
        return EngineStatus(self.name, None, 0, True,
                            tuple(PeerStatus(p.public_key, None, time.time(), 1, 1) for p in peers))


async def test_the_wait_for_the_tunnel_lets_the_loop_run_with_no_gateway_and_ends_when_one_registers(plane):
    from anex_agent.agent.supervisor import Agent

    make, _ = plane
    dp, _ = await make(NoYieldEngine)
    await dp.apply(config(version=2).model_copy(update={"gateways": []}))  # the gateway is gone, or never was
    assert not await dp.wait_handshake(5.0)  # start-up: nothing to wait for, at once
    agent = Agent(dp.settings)
    agent.dataplane = dp
    ready = asyncio.Event()
    agent.on_ready = ready.set
    waiter = asyncio.create_task(agent._when_ready(), name="ready-wait")
    others_ran = asyncio.Event()
    asyncio.get_running_loop().call_soon(others_ran.set)
    await others_ran.wait()  # the loop keeps running other work while no gateway exists
    assert not waiter.done() and not ready.is_set()
    await dp.apply(config(version=3))  # a gateway registers
    readied = asyncio.create_task(ready.wait())
    await asyncio.wait({waiter, readied}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    assert ready.is_set() and waiter.done() and waiter.exception() is None
    readied.cancel()


async def test_the_socks5_proxy_runs_over_the_engines_dialer_only_when_asked(plane):
    make, _ = plane
    dp, _ = await make(ContractEngine)
    assert dp.socks is None and (await dp.status_doc())["socks"] is None  # off by default
    socks = ListenAddress("127.0.0.1", free_port())
    dp, _ = await make(ContractEngine, socks_listen=socks)
    assert dp.socks is not None and dp.socks.dialer is dp.dialer
    # UDP ASSOCIATE goes through the engine's datagram dialer, names through the dialer's resolver
    assert isinstance(dp.socks.datagrams, OSDatagramDialer) and dp.socks.datagrams.resolver is dp.resolver
    assert (await dp.status_doc())["socks"] == str(socks) and f"socks={socks}" in dp.summary()
    reader, writer = await asyncio.open_connection("127.0.0.1", socks.port)
    writer.write(bytes([5, 1, 0]))  # RFC 1928 greeting: no authentication
    assert await asyncio.wait_for(reader.readexactly(2), 10) == bytes([5, 0])
    writer.close()


async def test_an_engine_that_serves_the_workload_is_told_where_the_socks5_proxy_goes(plane):
    make, _ = plane
    socks = ListenAddress("127.0.0.1", free_port())
    dp, _ = await make(SelfServingEngine, socks_listen=socks)
    assert dp.socks is None  # the engine serves it
    assert dp.engine.applied[-1][1].socks_address == str(socks)


class LateGatewayEngine(ContractEngine):
    """A gateway that learns of the node late: no handshake until the engine was asked for a second new initiation."""

    name = "contract-late"

    async def status(self) -> EngineStatus:
        import time

        from anex_agent.tunnels.engines.status import PeerStatus

        handshake = time.time() if len(self.handshake_asks) >= 2 else None
        return EngineStatus(self.name, None, 0, True, (PeerStatus(GW, "192.0.2.1:51820", handshake, 1, 1),))


async def test_a_gateway_that_learns_of_the_node_late_is_asked_again_until_it_answers(plane):
    """The first handshake does not wait for WireGuard's 5 s retry: the data plane asks the engine
    for new initiations (with a back-off) until the gateway answers, then stops asking."""
    make, _ = plane
    dp, _ = await make(LateGatewayEngine)
    assert await dp.wait_handshake(30.0)
    await dp._first_contact_task  # it ends once every gateway answered
    assert dp.engine.handshake_asks == [frozenset({GW})] * 2
    assert dp.first_contact.asked == {GW: 2} and GW in dp.first_contact.answered
    await dp.apply(config(version=2))  # the same gateway again: no new asking
    assert dp._first_contact_task.done() and len(dp.engine.handshake_asks) == 2
