"""anex_agent.parse: ASCII digits only, bounded, one error text saying what is accepted."""

from __future__ import annotations

import ipaddress

import pytest

from anex_agent import parse

WEIRD_DIGITS = ["²", "①", "٣", "３", "߃", "1" * 5000, "-1", "+1", " 1", "1 ", "1_000", "0x10", "", "1.0", "1e3"]


@pytest.mark.parametrize("text", WEIRD_DIGITS)
def test_integer_refuses_everything_but_ascii_digits(text):
    with pytest.raises(ValueError, match="ASCII digits"):
        parse.integer(text)


def test_integer_bounds_and_value():
    assert parse.integer("0") == 0
    assert parse.integer("007") == 7
    assert parse.integer("9223372036854775807") == 2**63 - 1
    with pytest.raises(ValueError, match="from 1 to 10"):
        parse.integer("11", minimum=1, maximum=10)
    with pytest.raises(ValueError, match="from 1 to 10"):
        parse.integer("0", minimum=1, maximum=10)
    with pytest.raises(ValueError, match="at least 5"):
        parse.integer("4", minimum=5)


@pytest.mark.parametrize("text", ["0", "65536", "٣", "３", "²", "80 ", "-80", "1" * 100])
def test_port_refuses(text):
    with pytest.raises(ValueError, match="port from 1 to 65535"):
        parse.port(text)


def test_port_accepts():
    assert parse.port("1") == 1 and parse.port("65535") == 65535


@pytest.mark.parametrize("text, expected", [
    ("gw.example.com:51820", ("gw.example.com", 51820)),
    ("203.0.113.9:80", ("203.0.113.9", 80)),
    ("[2001:db8::1]:443", ("2001:db8::1", 443)),
    ("[fe80::1%eth0]:443", ("fe80::1%eth0", 443)),
    ("my_svc.default.svc.cluster.local:8080", ("my_svc.default.svc.cluster.local", 8080)),
    ("a:1", ("a", 1)),
])
def test_host_port_accepts(text, expected):
    assert parse.host_port(text) == expected


@pytest.mark.parametrize("text", [
    "nonsense", "203.0.113.9", "203.0.113.9:0", "203.0.113.9:70000", ":80", "2001:db8::1:443",
    "[203.0.113.9]:80", "[nothex]:80", "host:٣", "host:３", "host:²", "ho st:80", "hóst:80", "a\x00b:80",
    "host:80\x00", "-bad-.example:80", "x" * 300 + ":80", "[::1]:",
])
def test_host_port_refuses(text):
    with pytest.raises(ValueError, match="HOST:PORT"):
        parse.host_port(text)


def test_cidr():
    assert parse.cidr("10.96.1.2/12") == ipaddress.ip_network("10.96.0.0/12")
    assert str(parse.cidr("fd00::/8")) == "fd00::/8"
    for bad in ("10.0.0.0/٣", "10.0.0.0/３", "10.0.0.0/+8", "10.0.0.0/33", "nope", "10.0.0.0/8" + "0" * 60):
        with pytest.raises(ValueError, match="CIDR"):
            parse.cidr(bad)
    with pytest.raises(ValueError, match="host bits"):
        parse.cidr("10.96.1.2/12", strict=True)


def test_messages_do_not_echo_the_input():
    """The caller names the input; the text says what is accepted, the same for every input."""
    for fn, a, b in ((parse.integer, "²", "x"), (parse.port, "0", "99999"), (parse.host_port, "a", "b:0")):
        with pytest.raises(ValueError) as one:
            fn(a)
        with pytest.raises(ValueError) as two:
            fn(b)
        assert str(one.value) == str(two.value)
