"""The relay's pre-authentication bounds, as a pure core: per source, in all, oldest dropped first."""

from __future__ import annotations

import ipaddress

from anex_agent.gateway.admission import Admission, forwarded_source, is_trusted, source_key

PROXIES = (ipaddress.ip_network("10.0.0.0/8"), ipaddress.ip_network("fd00::/64"))


def test_sources_are_ipv4_addresses_and_ipv6_subnets():
    assert source_key("198.51.100.7") == "198.51.100.7"
    assert source_key("2001:db8:1:2::5") == source_key("2001:db8:1:2:ffff::9") == "2001:db8:1:2::/64"
    assert source_key("2001:db8:1:3::5") != source_key("2001:db8:1:2::5")
    assert source_key("::ffff:198.51.100.7") == "198.51.100.7"
    assert source_key("not an address") is None


def test_a_source_beyond_its_share_is_refused_and_others_are_not():
    gate = Admission(max_pending=10, max_pending_per_source=2)
    assert gate.arrive("a1", "A") == (True, []) and gate.arrive("a2", "A") == (True, [])
    assert gate.arrive("a3", "A") == (False, [])
    assert gate.arrive("b1", "B") == (True, [])
    gate.leave("a1")
    gate.leave("a1")  # idempotent
    assert gate.from_source("A") == 1 and gate.arrive("a4", "A") == (True, [])


def test_when_the_budget_is_full_the_oldest_waiting_connection_is_dropped():
    gate = Admission(max_pending=3, max_pending_per_source=8)
    for name in ("a", "b", "c"):
        gate.arrive(name, name.upper())
    gate.leave("b")  # it authenticated: no longer waits
    assert gate.arrive("d", "D") == (True, [])
    assert gate.arrive("e", "E") == (True, ["a"])
    assert gate.pending == 3 and gate.from_source("A") == 0


def test_a_trusted_proxys_connection_counts_under_the_client_it_forwards_for():
    gate = Admission(max_pending=10, max_pending_per_source=1)
    assert gate.arrive("p1", None) == (True, []) and gate.arrive("p2", None) == (True, [])
    assert gate.forwarded("p1", "198.51.100.7")
    assert not gate.forwarded("p2", "198.51.100.7")  # that client already has its share waiting
    assert gate.pending == 1


def test_x_forwarded_for_names_the_rightmost_untrusted_address():
    assert forwarded_source(["203.0.113.9, 198.51.100.7, 10.1.1.1"], PROXIES) == "198.51.100.7"
    assert forwarded_source(["203.0.113.9", "198.51.100.7"], PROXIES) == "198.51.100.7"
    assert forwarded_source(["10.1.1.1"], PROXIES) is None
    assert forwarded_source(["<script>"], PROXIES) is None
    assert is_trusted("10.2.3.4", PROXIES) and is_trusted("::ffff:10.2.3.4", PROXIES)
    assert not is_trusted("10.2.3.4", ()) and not is_trusted("fd00:0:0:1::1", PROXIES)
