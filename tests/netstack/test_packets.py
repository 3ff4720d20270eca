"""IPv4, checksums, ICMP echo, UDP, reassembly."""

from __future__ import annotations

import os
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from anex_agent.netstack import checksum, icmp, ipv4, udp
from anex_agent.netstack.stack import Stack, StackError
from anex_agent.netstack.tcp.reassembly import Reassembly

US, THEM = "10.254.0.5", "10.254.0.1"


def reference_checksum(data: bytes) -> int:
    if len(data) % 2:
        data += b"\0"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


@given(st.binary(max_size=3000))
def test_checksum_matches_rfc1071_up_to_the_sign_of_zero(data):
    ours, ref = checksum.checksum(data), reference_checksum(data)
    assert ours == ref or {ours, ref} == {0, 0xFFFF}


def test_ipv4_parse_validates():
    packet = ipv4.build(bytes([10, 254, 0, 1]), bytes([10, 254, 0, 5]), ipv4.PROTO_UDP, b"x" * 10)
    parsed = ipv4.parse(packet + b"trailing padding")
    assert bytes(parsed.payload) == b"x" * 10 and parsed.protocol == ipv4.PROTO_UDP
    broken = bytearray(packet)
    broken[8] ^= 1  # TTL changed, checksum not
    with pytest.raises(ipv4.PacketError, match="checksum"):
        ipv4.parse(bytes(broken))
    with pytest.raises(ipv4.PacketError, match="fragment"):
        fragment = bytearray(packet)
        fragment[6:8] = (ipv4.MF).to_bytes(2, "big")
        fragment[10:12] = b"\0\0"
        fragment[10:12] = checksum.checksum(bytes(fragment[:20])).to_bytes(2, "big")
        ipv4.parse(bytes(fragment))
    with pytest.raises(ipv4.PacketError):
        ipv4.parse(packet[:25])  # shorter than its total length
    with pytest.raises(ipv4.PacketError):
        ipv4.parse(b"\x60" + packet[1:])  # IPv6 version nibble


def test_header_template_builds_valid_headers():
    tpl = ipv4.HeaderTemplate(bytes(4), bytes([1, 2, 3, 4]), ipv4.PROTO_TCP)
    for n in (0, 1, 1380, 8980):
        assert checksum.partial(tpl.build(n)) == 0


def test_ping_is_answered():
    stack = Stack(US)
    body = b"\x08\x00\x00\x00\x12\x34\x00\x01" + os.urandom(56)
    body = body[:2] + checksum.checksum(body).to_bytes(2, "big") + body[4:]
    stack.receive(ipv4.build(bytes([10, 254, 0, 1]), stack.address, ipv4.PROTO_ICMP, body), 0.0)
    [reply] = stack.take_packets()
    parsed = ipv4.parse(reply)
    assert parsed.dst == bytes([10, 254, 0, 1]) and parsed.payload[0] == icmp.ECHO_REPLY
    assert bytes(parsed.payload[4:]) == body[4:] and checksum.partial(parsed.payload) == 0


def test_udp_roundtrip_and_bad_checksum():
    stack = Stack(US)
    port = stack.udp_bind(5353)
    them = bytes([10, 254, 0, 1])
    packet = udp.build(them, 40000, stack.address, 5353, b"query")
    stack.receive(packet, 0.0)
    assert port.queue.popleft().data == b"query"
    bad = bytearray(packet)
    bad[-1] ^= 0xFF
    stack.receive(bytes(bad), 0.0)
    assert not port.queue and stack.drops["bad UDP checksum"] == 1
    stack.udp_send(port, THEM, 53, b"answer")
    [out] = stack.take_packets()
    dgram = udp.parse(ipv4.parse(out))
    assert (dgram.src_port, dgram.dst_port, dgram.data) == (5353, 53, b"answer")
    with pytest.raises(StackError):
        stack.udp_bind(5353)
    with pytest.raises(StackError, match="MTU"):
        stack.udp_send(port, THEM, 53, b"x" * 2000)


def test_packets_for_other_addresses_and_protocols_are_dropped():
    stack = Stack(US)
    stack.receive(ipv4.build(bytes(4), bytes([10, 254, 0, 9]), ipv4.PROTO_UDP, b"12345678"), 0.0)
    stack.receive(ipv4.build(bytes(4), stack.address, 47, b"gre"), 0.0)
    assert stack.drops == {"not addressed to us": 1, "protocol not supported": 1}
    assert stack.take_packets() == []


def test_only_ipv4_destinations():
    with pytest.raises(StackError, match="IPv4"):
        Stack(US).tcp_connect("fd00::1", 80, 0.0)


def test_reassembly_merges_overlaps_and_pops_in_order():
    r = Reassembly()
    r.add(110, b"b" * 10)   # 110..120
    r.add(130, b"d" * 10)   # 130..140
    r.add(115, b"c" * 20)   # 115..135: bridges both
    assert r.blocks() == [(110, 140)] and r.size == 30
    assert r.pop_ready(100) is None
    assert r.pop_ready(112) == b"b" * 8 + b"c" * 15 + b"d" * 5
    assert r.size == 0 and len(r) == 0


def test_reassembly_extends_a_run_in_place_and_hands_it_over():
    # behind one hole a long path's window (thousands of segments) extends the same run: each
    # segment must cost its own bytes, not a copy of all the run held (quadratic in the window)
    r = Reassembly()
    r.add(2000, b"\0" * 1000)
    run = r._data[0]
    for k in range(1, 50):
        r.add(2000 + 1000 * k, bytes([k]) * 1000)
    assert r.blocks() == [(2000, 52000)] and r.size == 50000
    assert r._data[0] is run
    held = r.pop_ready(2000)
    assert held is run and held == b"".join(bytes([k]) * 1000 for k in range(50))
    assert r.size == 0 and len(r) == 0


def test_reassembly_copies_what_it_is_given():
    packet = bytearray(b"x" * 10 + b"y" * 10)
    r = Reassembly()
    r.add(100, memoryview(packet)[10:])  # a view into the caller's buffer, which it reuses
    r.add(95, memoryview(packet)[:10])   # extends nothing before it, swallows the run after
    packet[:] = b"z" * 20
    assert r.pop_ready(95) == b"x" * 10 + b"y" * 5  # 95..110
    assert r.size == 0


@given(st.lists(st.tuples(st.integers(0, 200), st.integers(1, 50)), max_size=30))
def test_reassembly_equals_a_byte_map(runs):
    truth = bytes(range(256)) * 2
    r = Reassembly()
    have = set()
    for start, n in runs:
        r.add(1000 + start, truth[start:start + n])
        have.update(range(start, min(start + n, len(truth))))
    covered = set()
    for s, e in r.blocks():
        covered.update(range(s - 1000, e - 1000))
    assert covered == have
    first = min(have) if have else None
    if first is not None:
        data = r.pop_ready(1000 + first)
        assert data == truth[first:first + len(data)]


def test_checksums_are_not_checked_again_on_an_authenticated_link():
    them = bytes([10, 254, 0, 1])
    packet = bytearray(udp.build(them, 40000, bytes([10, 254, 0, 5]), 5353, b"query"))
    packet[-1] ^= 0xFF  # as if corrupted: a link that authenticates packets cannot deliver this
    trusting, checking = Stack(US, verify_checksums=False), Stack(US)
    for stack in (trusting, checking):
        stack.udp_bind(5353)
        stack.receive(bytes(packet), 0.0)
    assert len(trusting.udp_ports[5353].queue) == 1
    assert not checking.udp_ports[5353].queue and checking.drops["bad UDP checksum"] == 1


def test_scoreboard_merges_prunes_and_finds_holes():
    from anex_agent.netstack.tcp.scoreboard import Scoreboard

    board = Scoreboard()
    board.add(120, 130, una=100, top=200)
    board.add(140, 150, una=100, top=200)
    board.add(130, 135, una=100, top=200)   # touches the first: merged
    board.add(90, 99, una=100, top=200)     # below SND.UNA (a D-SACK): not kept
    board.add(150, 260, una=100, top=200)   # beyond what was sent: bogus
    assert board.blocks == [[120, 135], [140, 150]] and board.total == 25 and board.highest == 150
    assert board.next_hole(100) == (100, 120) and board.next_hole(125) == (135, 140) and board.next_hole(150) is None
    assert board.skip(125) == 135 and board.skip(136) == 136 and board.limit(100, 50) == 20
    board.acked(125)
    assert board.blocks == [[125, 135], [140, 150]]
    board.acked(150)
    assert not board
