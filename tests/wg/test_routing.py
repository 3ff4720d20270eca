"""Allowed-IPs table: longest prefix wins, prefixes move between peers, IPv4 and IPv6."""

import ipaddress

import pytest

from anex_agent.errors import LocalProtocolError
from anex_agent.wg.routing import AllowedIPs, packet_addresses


def a(text):
    return ipaddress.ip_address(text).packed


def test_longest_prefix_match():
    t = AllowedIPs()
    t.insert("0.0.0.0/0", "default")
    t.insert("10.0.0.0/8", "ten")
    t.insert("10.1.0.0/16", "ten-one")
    t.insert("10.1.2.3/32", "host")
    assert t.lookup(a("10.1.2.3")) == "host"
    assert t.lookup(a("10.1.2.4")) == "ten-one"
    assert t.lookup(a("10.2.0.1")) == "ten"
    assert t.lookup(a("192.168.1.1")) == "default"
    assert t.lookup(a("fd00::1")) is None


def test_ipv6_and_host_bits():
    t = AllowedIPs()
    t.insert("fd00:1::5/64", "p")  # host bits cleared like wg does
    assert t.lookup(a("fd00:1::ffff")) == "p"
    assert t.lookup(a("fd00:2::1")) is None
    assert [str(n) for n in t.prefixes_of("p")] == ["fd00:1::/64"]


def test_prefix_moves_to_the_last_peer_and_remove_peer():
    t = AllowedIPs()
    t.insert("10.0.0.0/24", "p1")
    t.insert("10.0.0.0/24", "p2")
    assert t.lookup(a("10.0.0.9")) == "p2" and t.prefixes_of("p1") == []
    t.replace_peer("p2", ["10.0.1.0/24"])
    assert t.lookup(a("10.0.0.9")) is None and t.lookup(a("10.0.1.1")) == "p2"
    t.remove_peer("p2")
    assert t.lookup(a("10.0.1.1")) is None


def test_bad_prefix_is_a_local_error():
    with pytest.raises(LocalProtocolError, match="not an IP prefix"):
        AllowedIPs().insert("10.0.0.300/24", "p")


def test_packet_addresses():
    v4 = bytes([0x45, 0, 0, 28]) + bytes(8) + a("1.2.3.4") + a("5.6.7.8") + bytes(8)
    assert packet_addresses(v4) == (a("1.2.3.4"), a("5.6.7.8"), 28)
    v6 = bytes([0x60, 0, 0, 0, 0, 8, 17, 64]) + a("fd00::1") + a("fd00::2") + bytes(8)
    assert packet_addresses(v6) == (a("fd00::1"), a("fd00::2"), 48)
    assert packet_addresses(b"") is None and packet_addresses(b"\x45" * 10) is None and packet_addresses(b"\x70" * 60) is None


def test_remembered_answers_follow_every_change_of_the_table():
    from anex_agent.wg import routing

    table = routing.AllowedIPs()
    addr = ipaddress.IPv4Address("10.7.1.5").packed
    assert table.lookup(addr) is None
    table.insert("10.7.0.0/16", "wide")
    assert table.lookup(addr) == "wide"
    table.insert("10.7.1.0/24", "narrow")  # a longer prefix added after the answer was remembered
    assert table.lookup(addr) == "narrow"
    table.remove_peer("narrow")
    assert table.lookup(addr) == "wide"
    table.replace_peer("wide", ["10.8.0.0/16"])
    assert table.lookup(addr) is None
    assert table.lookup(memoryview(ipaddress.IPv4Address("10.8.0.1").packed)) == "wide"
    assert table.lookup(bytearray(ipaddress.IPv4Address("10.8.0.2").packed)) == "wide"


def test_remembered_answers_are_bounded():
    from anex_agent.wg import routing

    table = routing.AllowedIPs()
    table.insert("10.0.0.0/8", "peer")
    for i in range(routing.LOOKUP_CACHE * 2 + 3):
        assert table.lookup((0x0A000000 + i).to_bytes(4, "big")) == "peer"
    assert len(table._cache) <= routing.LOOKUP_CACHE
