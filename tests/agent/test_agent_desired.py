"""NodeConfig -> DesiredConfig (pure) and tunnel merging."""

from anex_agent.agent.desired import desired_from_config, merge_tunnels
from anex_agent.wire import GatewayPeer, NodeConfig, TunnelSpec

PUB1 = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="
PUB2 = "AQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQEBAQE="


def gw(pub, allowed, endpoint="192.0.2.1:51820", keepalive=25):
    return GatewayPeer(id="g", public_key=pub, endpoint=endpoint, allowed_ips=allowed, persistent_keepalive=keepalive, mesh_address="10.254.0.1")


def cfg(gateways, tunnels=()):
    return NodeConfig(node_id="n", version=3, address="10.254.0.7", network="10.254.0.0/16", mtu=1380, dns=["10.254.0.1"], gateways=gateways, tunnels=list(tunnels))


def test_address_mtu_peers_and_routes():
    d = desired_from_config(cfg([gw(PUB1, ["10.254.0.0/16", "10.96.0.0/12", "10.77.0.0/24"], keepalive=15)]), bytes(32))
    assert d.address == "10.254.0.7/16" and d.mtu == 1380 and d.listen_port is None
    (peer,) = d.peers
    assert peer.public_key == PUB1 and peer.endpoint == "192.0.2.1:51820" and peer.persistent_keepalive == 15
    assert set(peer.allowed_ips) == {"10.254.0.0/16", "10.96.0.0/12", "10.77.0.0/24"}
    assert d.routes == ("10.96.0.0/12", "10.77.0.0/24")  # the mesh network is the connected route


def test_never_a_default_route_and_ws_only_gateways_skipped():
    d = desired_from_config(cfg([gw(PUB1, ["0.0.0.0/0"]), gw(PUB2, ["10.1.0.0/16"], endpoint=None)]), bytes(32))
    assert [p.public_key for p in d.peers] == [PUB1]
    assert d.routes == ()


def test_routes_deduplicated_across_gateways():
    d = desired_from_config(cfg([gw(PUB1, ["10.96.0.0/12"]), gw(PUB2, ["10.96.0.0/12"], endpoint="192.0.2.2:51820")]), bytes(32))
    assert d.routes == ("10.96.0.0/12",) and len(d.peers) == 2


def test_local_tunnels_win_on_a_port_clash():
    local = [TunnelSpec(listen_port=5000, target="a:1")]
    pushed = [TunnelSpec(listen_port=5000, target="b:2"), TunnelSpec(listen_port=4000, target="c:3")]
    assert merge_tunnels(local, pushed) == [TunnelSpec(listen_port=4000, target="c:3"), TunnelSpec(listen_port=5000, target="a:1")]
