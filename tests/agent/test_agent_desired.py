"""NodeConfig -> DesiredConfig (pure) and tunnel merging."""

from anex_agent.agent.desired import admit_routes, desired_from_config, merge_tunnels
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES
from anex_agent.wire.nodes import GatewayPeer, NodeConfig, TunnelSpec

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
    # and the gateway's own address: what the node sends to it goes to it, whoever carries the mesh
    assert set(peer.allowed_ips) == {"10.254.0.0/16", "10.96.0.0/12", "10.77.0.0/24", "10.254.0.1/32"}
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


def cfg_allowed(gateways, allowed):
    return cfg(gateways).model_copy(update={"gateway_routes": allowed})


def test_routes_inside_the_allowed_networks_are_installed_others_refused():
    config = cfg_allowed([gw(PUB1, ["10.254.0.0/16", "10.96.0.0/12", "10.96.9.0/24", "10.244.0.0/16", "8.8.8.0/24"])],
                         ["10.96.0.0/12"])
    d = desired_from_config(config, bytes(32))
    assert d.routes == ("10.96.0.0/12", "10.96.9.0/24")
    (peer,) = d.peers  # a refused network is not in the peer's allowed IPs either (userspace engines route by them)
    assert peer.allowed_ips == ("10.254.0.0/16", "10.96.0.0/12", "10.96.9.0/24", "10.254.0.1/32")
    _, refused = admit_routes(config)
    assert [(r.network, r.reason.startswith("outside the networks gateways may offer (10.96.0.0/12)")) for r in refused] == [
        ("10.244.0.0/16", True), ("8.8.8.0/24", True)]


def test_default_list_refuses_the_halves_of_the_internet():
    # a coordinator that sends no list: the node applies the default (private networks only)
    config = cfg([gw(PUB1, ["10.254.0.0/16", "0.0.0.0/1", "128.0.0.0/1", "172.20.0.0/16"])])
    assert config.gateway_routes == list(DEFAULT_GATEWAY_ROUTES)
    d = desired_from_config(config, bytes(32))
    assert d.routes == ("172.20.0.0/16",)
    assert d.peers[0].allowed_ips == ("10.254.0.0/16", "172.20.0.0/16", "10.254.0.1/32")


def test_a_route_covering_the_coordinator_is_refused_the_rest_applied():
    config = cfg([gw(PUB1, ["10.254.0.0/16", "10.0.0.0/8", "192.168.10.0/24", "172.16.0.0/12"])])
    d = desired_from_config(config, bytes(32), protected=("10.1.2.3",))
    assert d.routes == ("192.168.10.0/24", "172.16.0.0/12")
    _, refused = admit_routes(config, ("10.1.2.3",))
    assert [str(r) for r in refused] == [
        "gateway g: route 10.0.0.0/8 refused: it covers the coordinator's address 10.1.2.3"]
    # an exact host route to the coordinator is refused too; without protection it is installed
    exact = cfg([gw(PUB1, ["10.1.2.3/32"])])
    assert desired_from_config(exact, bytes(32), protected=("10.1.2.3",)).routes == ()
    assert desired_from_config(exact, bytes(32)).routes == ("10.1.2.3/32",)


def test_a_route_covering_a_gateway_endpoint_is_refused():
    # the WireGuard datagrams to the gateway would be routed into the tunnel itself
    config = cfg([gw(PUB1, ["192.168.0.0/16", "10.96.0.0/12"], endpoint="192.168.1.20:51820"),
                  gw(PUB2, ["10.244.0.0/16"], endpoint="gw2.example.com:51820")])
    d = desired_from_config(config, bytes(32))
    assert d.routes == ("10.96.0.0/12", "10.244.0.0/16")
    _, refused = admit_routes(config)
    assert [(r.network, r.reason) for r in refused] == [
        ("192.168.0.0/16", "it covers gateway g's endpoint 192.168.1.20:51820")]
