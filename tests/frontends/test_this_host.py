"""Every spelling of loopback and "this host" is recognised, as the OS itself reads them."""

from __future__ import annotations

import ipaddress
import socket

import pytest

from anex_agent.frontends import this_host

NUMERIC_THIS_HOST = [
    "127.0.0.1", "127.1", "127.0.1", "2130706433", "0x7f000001", "0X7F000001", "0177.0.0.1",
    "0x7f.0.0.1", "127.255.255.254", "127.0.0.1.", "0.0.0.0", "0", "0x0",
    "::1", "[::1]", "::ffff:127.0.0.1", "[::ffff:127.0.0.1]", "::ffff:7f00:1", "0:0:0:0:0:0:0:1",
    "::", "[::]", "::ffff:0.0.0.0", "::1%lo", "[::1%25lo]",
]
NAMES_THIS_HOST = [
    "localhost", "LOCALHOST", "localhost.", "LOCALHOST.", "localhost.localdomain", "Localhost.LocalDomain.",
    "ip6-localhost", "ip6-loopback", "localhost6", "api.localhost", "a.b.LOCALHOST.",
]
ELSEWHERE = [
    "10.96.0.10", "192.0.2.1", "0127.0.0.1",  # octal 0127 = 87: 87.0.0.1
    "128.0.0.1", "1.127.0.0", "::2", "fd00::1", "::ffff:10.0.0.1", "::127.0.0.1",
    "example.com", "localhost.example.com", "notlocalhost", "mylocalhost", "web.default.svc.cluster.local",
    "127.0.0.1.example.com", "0x7f000001.example", "1e100", "deadbeef", "",
]


@pytest.mark.parametrize("host", NUMERIC_THIS_HOST + NAMES_THIS_HOST)
def test_every_spelling_of_this_machine_is_recognised(host):
    assert this_host.names_this_host(host)
    assert not this_host.may_reach("10.254.0.9", host)
    assert this_host.may_reach("127.0.0.1", host)  # a local client could connect there directly anyway


@pytest.mark.parametrize("host", ELSEWHERE)
def test_other_hosts_are_not(host):
    assert not this_host.names_this_host(host)
    assert this_host.may_reach("10.254.0.9", host)


@pytest.mark.parametrize(
    "host", [h for h in NUMERIC_THIS_HOST if not h.startswith("[") and "%" not in h and not h.endswith(".")]
)
def test_the_system_resolver_reads_each_numeric_spelling_as_this_machine(host):
    """The guard and the dialer's resolver (getaddrinfo) agree: each spelling really is this machine."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM, flags=socket.AI_NUMERICHOST)
    except socket.gaierror as err:
        pytest.skip(f"this system's resolver does not read {host!r} ({err})")
    for info in infos:
        assert this_host.is_this_host(ipaddress.ip_address(info[4][0].split("%")[0]))
    assert this_host.ip_of(host) is not None


@pytest.mark.parametrize(
    "text, expected",
    [("127.1", "127.0.0.1"), ("2130706433", "127.0.0.1"), ("0177.0.0.1", "127.0.0.1"), ("0x7f000001", "127.0.0.1"),
     ("0", "0.0.0.0"), ("1.2.3.4", "1.2.3.4"), ("[fd00::1]", "fd00::1"), ("::ffff:127.0.0.1", "::ffff:7f00:1")],
)
def test_ip_of_reads_shorthand_like_inet_aton(text, expected):
    assert this_host.ip_of(text) == ipaddress.ip_address(expected)


@pytest.mark.parametrize("text", ["example.com", "1.2.3.4 x", "1.2.3.4.5", "0x", "256.1.1.1.1", "::g", "[]"])
def test_ip_of_is_none_for_names_and_garbage(text):
    assert this_host.ip_of(text) is None


@pytest.mark.parametrize(
    "client, local", [("127.0.0.1", True), ("127.9.9.9", True), ("::1", True), ("::ffff:127.0.0.1", True),
                      ("10.254.0.9", False), ("::ffff:10.0.0.1", False), ("fe80::1%eth0", False)],
)
def test_local_clients(client, local):
    assert this_host.is_local_client(client) is local


@pytest.mark.parametrize("host, many", [
    ("224.0.0.251", True), ("239.255.255.250", True), ("255.255.255.255", True), ("ff02::1", True),
    ("::ffff:224.0.0.1", True), ("10.96.0.10", False), ("10.255.255.255", False), ("::1", False),
    ("cluster.local", False),
])
def test_multicast_and_the_limited_broadcast_fan_out(host, many):
    assert this_host.fans_out(host) is many
