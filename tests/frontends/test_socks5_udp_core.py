"""The SOCKS5 UDP relay's rules without a network: the RFC 1928 §7 header, who may send, whose replies pass."""

from __future__ import annotations

import ipaddress

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anex_agent.frontends import socks5_udp_core as udp
from anex_agent.frontends.socks5_core import AddressType, Socks5ProtocolError


def header(host: str, port: int, frag: int = 0, atyp: int | None = None) -> bytes:
    """A client's datagram header as PySocks writes it: an IP literal as IPv4/IPv6, else a name."""
    try:
        address = ipaddress.ip_address(host)
        encoded = bytes([atyp or (1 if address.version == 4 else 4)]) + address.packed
    except ValueError:
        encoded = bytes([atyp or 3, len(host)]) + host.encode()
    return bytes([0, 0, frag]) + encoded + port.to_bytes(2, "big")


@pytest.mark.parametrize("host, atyp", [("10.77.0.2", AddressType.IPV4), ("fd00::53", AddressType.IPV6),
                                        ("kube-dns.kube-system.svc.cluster.local", AddressType.DOMAIN)])
def test_a_client_datagram_names_its_destination_and_carries_the_payload(host, atyp):
    dgram = udp.parse_datagram(header(host, 53) + b"\x12\x34query")
    assert dgram == udp.ClientDatagram(0, host, 53, atyp, b"\x12\x34query")


def test_an_empty_payload_is_a_datagram_and_a_fragment_is_reported_as_such():
    assert udp.parse_datagram(header("10.0.0.1", 9)).payload == b""
    assert udp.parse_datagram(header("10.0.0.1", 9, frag=1) + b"x").frag == 1


@pytest.mark.parametrize("data, field", [
    (b"\x00\x00\x00\x01\x0a\x00", "shorter than the SOCKS5 header"),
    (header("fd00::1", 53)[:-1], "IPv6"),
    (bytes([0, 0, 0, 3, 20]) + b"short" + b"\x00\x35", "domain name"),
    (bytes([0, 0, 0, 3, 0, 0, 53, 0, 0, 0]), "domain name"),
    (header("bad name!", 53), "not a host name"),
    (header("10.0.0.1", 53, atyp=2), "address type 2"),
    (header("10.0.0.1", 0), "port 0"),
])
def test_malformed_datagrams_name_the_field(data, field):
    with pytest.raises(Socks5ProtocolError) as err:
        udp.parse_datagram(data)
    assert field in err.value.reason


@given(st.binary(max_size=80))
def test_any_bytes_parse_or_raise_the_protocol_error(data):
    try:
        udp.parse_datagram(data)
    except Socks5ProtocolError:
        pass


@given(st.ip_addresses(), st.integers(1, 65535), st.binary(max_size=64))
def test_encode_and_parse_are_inverse(address, port, payload):
    dgram = udp.parse_datagram(udp.encode_datagram(str(address), port, payload))
    named = getattr(address, "ipv4_mapped", None) or address  # a mapped address is named as its IPv4 address
    assert (dgram.host, dgram.port, dgram.payload, dgram.frag) == (str(named), port, payload, 0)


def test_a_reply_from_an_ipv4_mapped_source_is_named_as_ipv4():
    assert udp.encode_datagram("::ffff:10.77.0.2", 53, b"a") == header("10.77.0.2", 53) + b"a"


def test_the_client_that_named_its_port_is_the_only_sender():
    source = udp.ClientSource("127.0.0.1", 40000)
    assert source.accepts("127.0.0.1", 40000)
    assert not source.accepts("127.0.0.1", 40001)  # another process on the same host
    assert not source.accepts("127.0.0.2", 40000)
    assert source.accepts("127.0.0.1", 40000)
    assert source.strangers == 2


def test_port_0_in_the_request_means_the_first_port_that_sends():
    source = udp.ClientSource("192.0.2.7", 0)
    assert not source.accepts("192.0.2.8", 5000)  # a stranger first: it does not claim the port
    assert source.accepts("192.0.2.7", 5001)
    assert not source.accepts("192.0.2.7", 5002)
    assert source.accepts("192.0.2.7", 5001)
    assert (source.port, source.strangers) == (5001, 2)


def test_a_dual_stack_relay_sees_the_client_as_an_ipv4_mapped_address():
    source = udp.ClientSource("127.0.0.1", 0)
    assert source.accepts("::ffff:127.0.0.1", 7000)
    assert not source.accepts("not an address", 7000)


def test_replies_pass_only_from_destinations_the_client_sent_to():
    peers = udp.ReplyPeers()
    peers.sent("10.77.0.2", 53)
    assert peers.allows("10.77.0.2", 53)
    assert peers.allows("::ffff:10.77.0.2", 53)
    assert not peers.allows("10.77.0.2", 54)
    assert not peers.allows("10.77.0.3", 53)
    assert peers.strangers == 2


def test_the_reply_filter_is_bounded_and_forgets_the_least_recently_used():
    peers = udp.ReplyPeers(limit=3)
    for port in (1, 2, 3):
        peers.sent("10.0.0.1", port)
    peers.sent("10.0.0.1", 1)  # used again: now the newest
    peers.sent("10.0.0.1", 4)
    assert len(peers) == 3
    assert not peers.allows("10.0.0.1", 2)
    assert all(peers.allows("10.0.0.1", port) for port in (1, 3, 4))
