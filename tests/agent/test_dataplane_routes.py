"""The data plane hands the engine only admitted routes: never one covering the coordinator."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

from anex_agent.agent import settings as agent_settings
from anex_agent.agent.dataplane import DataPlane
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.wire.nodes import GatewayPeer, NodeConfig

PUB = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


class FakeEngine:
    frontends = "ours"
    host_address = True
    name = "fake"

    def __init__(self) -> None:
        self.applied = []

    async def apply(self, desired, workload=None) -> bool:
        self.applied.append(desired)
        return True


class FakeForwards:
    active: dict = {}

    async def apply(self, specs) -> None:
        pass


async def test_apply_leaves_out_a_route_covering_the_coordinator(tmp_path):
    parser = argparse.ArgumentParser()
    agent_settings.add_arguments(parser)
    settings = agent_settings.from_args(parser.parse_args([]), {
        "ANEX_COORDINATOR_URL": "http://10.20.30.40:8700", "ANEX_JOIN_TOKEN": "t", "ANEX_STATE_DIR": str(tmp_path)})
    plane = DataPlane(settings, KeyPair(generate_private_key()), {})
    plane.engine_cls, plane.engine = FakeEngine, FakeEngine()
    plane.forwards, plane.dialer = FakeForwards(), SimpleNamespace(resolver=None)
    gw = GatewayPeer(id="g1", public_key=PUB, endpoint="192.0.2.1:51820", mesh_address="10.254.0.1",
                     allowed_ips=["10.254.0.0/16", "10.0.0.0/8", "10.96.0.0/12"])
    await plane.apply(NodeConfig(node_id="n", version=2, address="10.254.0.7", network="10.254.0.0/16", mtu=1420,
                                 dns=["10.254.0.1"], gateways=[gw]))
    (desired,) = plane.engine.applied
    assert desired.routes == ("10.96.0.0/12",)  # 10.0.0.0/8 would carry the coordinator's traffic into the mesh
    assert desired.peers[0].allowed_ips == ("10.254.0.0/16", "10.96.0.0/12", "10.254.0.1/32")
