"""Gateway pure parts: the nftables ruleset, the peer book, settings."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError, EngineError
from anex_agent.gateway import nft
from anex_agent.gateway.peers import PeerBook
from anex_agent.gateway.settings import build_settings, interface_for, table_for
from anex_agent.wire.gateways import MeshPeer, PeerSet
from anex_agent.wire.watch import WatchEvent

RULES = nft.GatewayRules(table="anex_gw_t1", mesh_ifname="anxgwt1", mesh_network="10.254.0.0/16",
                         mesh_address="10.254.0.1", routes=("10.96.0.0/12", "192.168.5.0/24", "fd00::/64"))


def test_ruleset_opens_only_mesh_to_routes():
    text = nft.render_ruleset(RULES)
    assert text.startswith("table inet anex_gw_t1\ndelete table inet anex_gw_t1\n")  # atomic replace
    assert 'iifname "anxgwt1" ip saddr 10.254.0.0/16 ip daddr { 10.96.0.0/12, 192.168.5.0/24 } accept' in text
    assert 'oifname "anxgwt1" ip saddr { 10.96.0.0/12, 192.168.5.0/24 } ip daddr 10.254.0.0/16 accept' in text
    assert 'oifname != "anxgwt1" ip saddr 10.254.0.0/16 ip daddr { 10.96.0.0/12, 192.168.5.0/24 } masquerade' in text
    # everything else in or out of the mesh is dropped, after the accepts
    assert text.index('iifname "anxgwt1" drop') > text.index("accept")
    assert "fd00::/64" not in text  # a v6 route cannot be reached from a v4 mesh
    assert "policy drop" not in text  # the host's unrelated traffic is untouched
    assert 'ip daddr 10.254.0.1 meta l4proto { tcp, udp } th dport 53 iifname != { "anxgwt1", "lo" } drop' in text


def test_ruleset_without_routes_or_dns():
    text = nft.render_ruleset(nft.GatewayRules("anex_gw_t2", "anxgwt2", "10.254.0.0/16", "10.254.0.1", (), dns=False))
    assert "masquerade" not in text and "accept\n" in text  # only replies are accepted
    assert "dport 53" not in text  # no DNS served: the port is not opened to the mesh either
    assert 'iifname "anxgwt2" drop' in text


def _chain(text: str, name: str) -> list[str]:
    body = text.split(f"\tchain {name} {{\n", 1)[1].split("\n\t}", 1)[0]
    return [line.strip() for line in body.splitlines()]


def test_input_from_the_mesh_opens_only_dns_echo_and_replies():
    rules = _chain(nft.render_ruleset(RULES), "input")
    assert rules == [
        "type filter hook input priority filter; policy accept;",
        'iifname "anxgwt1" ct state established,related accept',
        'iifname "anxgwt1" ip daddr 10.254.0.1 meta l4proto { tcp, udp } th dport 53 accept',
        'iifname "anxgwt1" ip daddr 10.254.0.1 icmp type echo-request accept',
        'iifname "anxgwt1" drop',  # sshd, a kubelet, anything on 0.0.0.0, the host's other addresses
        'ip daddr 10.254.0.1 meta l4proto { tcp, udp } th dport 53 iifname != { "anxgwt1", "lo" } drop',
    ]
    # no DNS served: nothing but echo and replies
    no_dns = _chain(nft.render_ruleset(nft.GatewayRules("anex_gw_t2", "anxgwt2", "10.254.0.0/16", "10.254.0.1", (),
                                                        dns=False)), "input")
    assert no_dns[1:] == ['iifname "anxgwt2" ct state established,related accept',
                          'iifname "anxgwt2" ip daddr 10.254.0.1 icmp type echo-request accept',
                          'iifname "anxgwt2" drop']


def test_input_on_a_v6_mesh_uses_icmpv6_echo():
    text = nft.render_ruleset(nft.GatewayRules("anex_gw_t6", "anxgwt6", "fd7a::/64", "fd7a::1", ("fd00:1::/64",)))
    assert 'iifname "anxgwt6" ip6 daddr fd7a::1 icmpv6 type echo-request accept' in _chain(text, "input")


def test_mesh_to_mesh_forwarding_dropped_before_any_route_accept():
    # a --route that covers the mesh network must not open node -> node through the hub
    text = nft.render_ruleset(nft.GatewayRules("anex_gw_t4", "anxgwt4", "10.254.0.0/16", "10.254.0.1", ("10.0.0.0/8",)))
    forward = _chain(text, "forward")
    assert forward[1] == 'iifname "anxgwt4" oifname "anxgwt4" drop'
    assert forward.index('iifname "anxgwt4" ip saddr 10.254.0.0/16 ip daddr 10.0.0.0/8 accept') > 1


def test_single_route_is_not_a_set():
    text = nft.render_ruleset(nft.GatewayRules("anex_gw_t3", "anxgwt3", "10.254.0.0/16", "10.254.0.1", ("10.96.0.0/12",)))
    assert "ip daddr 10.96.0.0/12 accept" in text


def test_hostile_interface_name_refused():
    with pytest.raises(EngineError):
        nft.render_ruleset(nft.GatewayRules("anex_gw_x", 'a"; flush ruleset', "10.0.0.0/8", "10.0.0.1", ()))


def mp(node, key_char, addr):
    return MeshPeer(node_id=node, name=node, public_key=key_char * 43 + "=", allowed_ips=[addr])


def test_peer_book_follows_events():
    book = PeerBook.from_peer_set(PeerSet(version=3, peers=[mp("n1", "A", "10.254.0.2/32")]))
    assert not book.apply(WatchEvent(type="config", version=4))  # node-only event: ignored
    assert book.apply(WatchEvent(type="peer_added", version=5, peer=mp("n2", "B", "10.254.0.3/32")))
    assert not book.apply(WatchEvent(type="peer_added", version=6, peer=mp("n2", "B", "10.254.0.3/32")))
    assert [p.allowed_ips for p in book.peer_configs()] == [("10.254.0.2/32",), ("10.254.0.3/32",)]
    assert book.apply(WatchEvent(type="peer_added", version=7, peer=mp("n2", "C", "10.254.0.3/32")))  # re-keyed
    assert [p.public_key[0] for p in book.peer_configs()] == ["A", "C"]
    assert book.apply(WatchEvent(type="peer_removed", version=8, peer=mp("n1", "A", "10.254.0.2/32")))
    assert book.apply(WatchEvent(type="snapshot", version=9, peers=[mp("n9", "D", "10.254.0.9/32")]))
    assert [p.public_key[0] for p in book.peer_configs()] == ["D"]
    assert book.version == 9 and book.to_peer_set().version == 9
    assert all(p.endpoint is None and p.persistent_keepalive == 0 for p in book.peer_configs())


def test_same_key_under_a_new_node_id_keeps_one_peer():
    book = PeerBook()
    book.apply(WatchEvent(type="peer_added", version=1, peer=mp("n1", "A", "10.254.0.2/32")))
    book.apply(WatchEvent(type="peer_added", version=2, peer=mp("n2", "A", "10.254.0.3/32")))
    assert [p.allowed_ips for p in book.peer_configs()] == [("10.254.0.3/32",)]


def test_settings_defaults_and_derivations():
    s = build_settings(coordinator_url="http://127.0.0.1:8700/", token="t", listen_udp="192.168.50.1:51821",
                       routes=["10.96.0.1/12", "10.96.0.0/12"], dns_upstream="10.96.0.10")
    assert s.coordinator_url == "http://127.0.0.1:8700"
    assert s.endpoint == "192.168.50.1:51821" and s.listen_port == 51821
    assert s.routes == ("10.96.0.0/12",)
    assert s.dns_upstream == ("10.96.0.10", 53)
    secret = build_settings(coordinator_url="http://127.0.0.1:8700", token="s3cr3t-token", endpoint="gw.example:51820")
    assert "s3cr3t" not in repr(secret)
    wildcard = build_settings(coordinator_url="http://127.0.0.1:8700", token="t", endpoint="gw.example:51820")
    assert wildcard.endpoint == "gw.example:51820" and wildcard.listen_port == 51820


@pytest.mark.parametrize("listen_udp", ["0.0.0.0:51820", ":51820", "[::]:51820"])
def test_no_endpoint_and_a_wildcard_listen_address_is_refused_not_registered_as_none(listen_udp):
    """Nothing to tell nodes: the coordinator would list the gateway with no endpoint."""
    with pytest.raises(ConfigError) as info:
        build_settings(coordinator_url="http://127.0.0.1:8700", token="t", listen_udp=listen_udp)
    assert info.value.source == "--endpoint"
    assert f"--listen-udp {listen_udp}" in str(info.value) and "--endpoint gw.example.com:51820" in str(info.value)


@pytest.mark.parametrize("route, example", [("10.96.0.0", "10.96.0.0/12"), ("fd00::", "fd00::/128")])
def test_a_route_without_a_prefix_length_is_refused_showing_the_cidr_form(route, example):
    """``--route 10.96.0.0`` would register one address (/32): almost always a forgotten /12."""
    with pytest.raises(ConfigError) as info:
        build_settings(coordinator_url="http://127.0.0.1:8700", token="t", endpoint="gw.example:51820",
                       routes=[route])
    assert info.value.source == "--route" and route in str(info.value) and example in str(info.value)
    one = build_settings(coordinator_url="http://127.0.0.1:8700", token="t", endpoint="gw.example:51820",
                         routes=["10.96.0.10/32"])
    assert one.routes == ("10.96.0.10/32",)


@pytest.mark.parametrize(
    "kwargs, flag",
    [
        ({"coordinator_url": None}, "--coordinator"),
        ({"coordinator_url": "127.0.0.1:8700"}, "--coordinator"),
        ({"listen_udp": "0.0.0.0"}, "--listen-udp"),
        ({"listen_udp": "gw:51820"}, "--listen-udp"),
        ({"endpoint": "nohost"}, "--endpoint"),
        ({"routes": ["10.0.0.0/33"]}, "--route"),
        ({"dns_upstream": "kube-dns"}, "--dns-upstream"),
        ({"engine": "userspace"}, "--engine"),
        ({"interface": "x" * 20}, "interface"),
    ],
)
def test_settings_reject(kwargs, flag):
    args = {"coordinator_url": "http://127.0.0.1:8700", "token": "t", "endpoint": "gw.example:51820", **kwargs}
    with pytest.raises(ConfigError) as info:
        build_settings(**args)
    assert info.value.source == flag


def test_interface_and_table_names_are_stable_and_distinct():
    a, b = interface_for("A" * 43 + "="), interface_for("B" * 43 + "=")
    assert a == interface_for("A" * 43 + "=") and a != b
    assert a.startswith("anxgw") and len(a) <= 15
    assert table_for(a) == "anex_gw_" + a[5:]
