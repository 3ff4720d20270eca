"""RouteGuard: the coordinator's resolved address is protected, refusals are logged once."""

from __future__ import annotations

import logging

from anex_agent.agent.route_guard import RouteGuard
from anex_agent.wire.nodes import GatewayPeer, NodeConfig

PUB = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="


def config(routes, allowed=("127.0.0.0/8", "10.0.0.0/8")):
    gw = GatewayPeer(id="g1", public_key=PUB, endpoint="192.0.2.1:51820", allowed_ips=["10.254.0.0/16", *routes],
                     mesh_address="10.254.0.1")
    return NodeConfig(node_id="n", version=1, address="10.254.0.7", network="10.254.0.0/16", mtu=1420,
                      dns=["10.254.0.1"], gateways=[gw], gateway_routes=list(allowed))


async def test_ip_literal_coordinator_is_protected():
    guard = RouteGuard("https://10.20.30.40:8700")
    d = await guard.desired(config(["10.20.0.0/16", "10.96.0.0/12"]), bytes(32))
    assert guard.protected == ("10.20.30.40",)
    assert d.routes == ("10.96.0.0/12",)


async def test_hostname_is_resolved_and_kept_when_resolution_fails(caplog):
    guard = RouteGuard("http://localhost:8700", resolve_timeout=1.0)
    d = await guard.desired(config(["127.0.0.0/8", "10.96.0.0/12"]), bytes(32))
    assert "127.0.0.1" in guard.protected
    assert d.routes == ("10.96.0.0/12",)
    guard.host = "coordinator.invalid"  # the name stops resolving: the last addresses stay protected
    d = await guard.desired(config(["127.0.0.0/8", "10.96.0.0/12"]), bytes(32))
    assert "127.0.0.1" in guard.protected and d.routes == ("10.96.0.0/12",)


async def test_refusals_logged_once_per_change(caplog):
    guard = RouteGuard("http://10.20.30.40:8700")
    caplog.set_level(logging.WARNING, logger="anex_agent.agent.route_guard")
    for _ in range(3):
        await guard.desired(config(["10.20.0.0/16"]), bytes(32))
    assert [r.getMessage() for r in caplog.records] == [
        "gateway g1: route 10.20.0.0/16 refused: it covers the coordinator's address 10.20.30.40; "
        "the rest of the config is applied"]
    await guard.desired(config(["10.20.0.0/16", "8.8.8.0/24"]), bytes(32))
    assert len(caplog.records) == 3  # the set changed: both refusals logged again
