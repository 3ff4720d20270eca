"""Two devices over a fake link: handshakes in both roles (with/without PSK), transport both ways,
cookie replies under load, rejection of malformed/truncated/replayed input, cryptokey routing."""

from __future__ import annotations

import random

import pytest

from anex_agent.wire import keys
from anex_agent.errors import LocalProtocolError
from anex_agent.wg.device import Device
from anex_agent.wg.peer import PeerConfig
from .conftest import ADDR_A, ADDR_B, IP_A, IP_B, Pair, initiations, ipv4_packet


@pytest.mark.parametrize("psk", [False, True], ids=["no-psk", "psk"])
@pytest.mark.parametrize("initiator", ["a", "b"])
def test_handshake_and_transport_both_ways(psk, initiator):
    p = Pair(psk=psk)
    other = "b" if initiator == "a" else "a"
    src, dst = (IP_A, IP_B) if initiator == "a" else (IP_B, IP_A)
    first = ipv4_packet(src, dst, b"first packet, staged during the handshake")
    p.send(initiator, first)
    assert p.kinds(initiator)[:1] == ["handshake-initiated"]
    assert "handshake-responded" in p.kinds(other)
    assert p.kinds(initiator).count("handshake-complete") == 1
    assert p.kinds(other).count("handshake-complete") == 1  # confirmed by the staged packet
    received_by_other = p.received_b if other == "b" else p.received_a
    assert received_by_other == [first]
    back = ipv4_packet(dst, src, b"reply")
    p.send(other, back)
    assert (p.received_a if initiator == "a" else p.received_b) == [back]
    for i in range(20):
        p.send("a", ipv4_packet(IP_A, IP_B, bytes([i]) * i))
        p.send("b", ipv4_packet(IP_B, IP_A, bytes([i]) * (100 + i)))
    assert len(p.received_a) == 21 and len(p.received_b) == 21
    assert p.received_b[-1] == ipv4_packet(IP_A, IP_B, bytes([19]) * 19)  # padding stripped exactly
    assert [k for k in p.kinds("a") + p.kinds("b") if k == "dropped"] == []


def test_transport_is_padded_to_16_bytes():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b""))
    p.send("a", ipv4_packet(IP_A, IP_B, b"x"))  # 21 bytes -> 32
    datagram = [d for w, d, _ in p.wire if w == "a" and d[0] == 4][-1]
    assert len(datagram) == 16 + 32 + 16


def test_psk_mismatch_never_completes():
    p = Pair(psk=True)
    p.b.set_peer(PeerConfig(p.a.public_key, [f"{IP_A}/32"], ADDR_A, bytes(32), None))  # different PSK
    p.send("a", ipv4_packet(IP_A, IP_B))
    p.tick(20)
    assert "handshake-complete" not in p.kinds("a") + p.kinds("b")
    assert "dropped" in p.kinds("a")  # the responses fail to authenticate


def test_unknown_initiator_is_dropped():
    p = Pair()
    stranger = Device(keys.generate_private_key(), wall_time=p.clock.wall_time)
    stranger.set_peer(PeerConfig(p.b.public_key, [f"{IP_B}/32"], ADDR_B))
    out = stranger.send_packet(ipv4_packet("10.7.0.9", IP_B), p.clock.now)
    (data, _), = out.datagrams
    res = p.b.receive_datagram(data, ("192.0.2.9", 1), p.clock.now)
    assert res.datagrams == [] and res.kinds() == ["dropped"] and "unknown public key" in res.events[0].detail


def test_replayed_initiation_and_transport_are_dropped():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"one"))
    init = next(d for w, d, _ in p.wire if w == "a" and d[0] == 1)
    data = next(d for w, d, _ in p.wire if w == "a" and d[0] == 4)
    p.clock.now += 1
    out = p.b.receive_datagram(init, ADDR_A, p.clock.now)
    assert out.kinds() == ["dropped"] and "replayed" in out.events[0].detail and out.datagrams == []
    out = p.b.receive_datagram(data, ADDR_A, p.clock.now)
    assert out.kinds() == ["dropped"] and "replayed" in out.events[0].detail and out.packets == []


def test_initiation_flood_is_limited():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B))
    # a fresh, valid initiation arriving within 20 ms of the last one is refused
    p.a.expire_sessions(p.b.public_key)
    p.clock.now += 0.001
    p.clock.wall += 1  # newer timestamp, so only the rate limit can refuse it
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B), p.clock.now)
    init = next(d for d, _ in out.datagrams if d[0] == 1)
    res = p.b.receive_datagram(init, ADDR_A, p.clock.now)
    assert res.kinds() == ["dropped"] and "too fast" in res.events[0].detail


def test_tampered_truncated_and_garbage_input_is_dropped_not_raised():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"x" * 50))
    init = next(d for w, d, _ in p.wire if w == "a" and d[0] == 1)
    resp = next(d for w, d, _ in p.wire if w == "b" and d[0] == 2)
    data = next(d for w, d, _ in p.wire if w == "a" and d[0] == 4 and len(d) > 32)
    rng = random.Random(5)
    cases = [init[:-1], resp[:50], data[:31], b"", b"\x04", rng.randbytes(200), b"\x01\x00\x00\x00" + bytes(144)]
    for blob in (init, resp, data):
        for _ in range(20):
            i = rng.randrange(len(blob))
            cases.append(blob[:i] + bytes([blob[i] ^ (1 << rng.randrange(8))]) + blob[i + 1:])
    for case in cases:
        for dev in (p.a, p.b):
            out = dev.receive_datagram(case, ("198.51.100.1", 9), p.clock.now)
            assert out.packets == [] and out.kinds() == ["dropped"], case.hex()


def test_bad_mac1_dropped_before_any_work():
    p = Pair()
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B), p.clock.now)
    init = bytearray(out.datagrams[0][0])
    init[-20] ^= 1  # inside mac1
    res = p.b.receive_datagram(bytes(init), ADDR_A, p.clock.now)
    assert res.kinds() == ["dropped"] and "mac1" in res.events[0].detail


def test_cookie_reply_path_end_to_end():
    p = Pair()
    p.b.force_under_load = True
    p.send("a", ipv4_packet(IP_A, IP_B, b"under load"))
    assert "cookie-sent" in p.kinds("b") and "cookie-received" in p.kinds("a")
    assert "handshake-complete" not in p.kinds("a")
    reply = next(d for w, d, _ in p.wire if w == "b")
    assert reply[0] == 3 and len(reply) == 64
    first = next(d for w, d, _ in p.wire if w == "a" and d[0] == 1)
    assert first[-16:] == bytes(16)  # no cookie yet: zero mac2
    p.tick(6)  # retransmission carries mac2 now
    second = [d for w, d, _ in p.wire if w == "a" and d[0] == 1][1]
    assert second[-16:] != bytes(16)
    assert "handshake-complete" in p.kinds("a") and p.received_b[-1].endswith(b"under load")
    # a cookie bound to another address does not pass mac2: answered with a cookie again
    res = p.b.receive_datagram(second, ("203.0.113.5", 4444), p.clock.now)
    assert res.kinds() == ["cookie-sent"]


def test_cookie_reply_for_unknown_index_or_forged_is_dropped():
    p = Pair()
    p.b.force_under_load = True
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B), p.clock.now)
    reply = p.b.receive_datagram(out.datagrams[0][0], ADDR_A, p.clock.now).datagrams[0][0]
    forged = reply[:-1] + bytes([reply[-1] ^ 1])
    assert p.a.receive_datagram(forged, ADDR_B, p.clock.now).kinds() == ["dropped"]
    assert p.a.receive_datagram(b"\x03\0\0\0" + b"\x01\x02\x03\x04" + reply[8:], ADDR_B, p.clock.now).kinds() == ["dropped"]
    assert p.a.receive_datagram(reply, ADDR_B, p.clock.now).kinds() == ["cookie-received"]
    assert p.a.receive_datagram(reply, ADDR_B, p.clock.now).kinds() == ["dropped"]  # one reply per message


def test_under_load_estimate_turns_on_with_many_handshakes():
    p = Pair()
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B), p.clock.now)
    init = out.datagrams[0][0]
    first = p.b.receive_datagram(init, ADDR_A, p.clock.now).kinds()
    # 79 more from as many addresses (a source's own budget is not what this is about)
    kinds = [p.b.receive_datagram(init, (f"198.51.100.{i}", 1), p.clock.now).kinds() for i in range(1, 80)]
    assert first == ["handshake-responded"] and kinds[-1] == ["cookie-sent"]


def test_cryptokey_routing_both_directions():
    rng = random.Random(3)
    now = 10.0
    kw = dict(wall_time=lambda: 1.7e9 + now, random_bytes=rng.randbytes, jitter=lambda: 0.0)
    hub = Device(keys.generate_private_key(), **kw)
    b = Device(keys.generate_private_key(), **kw)
    c = Device(keys.generate_private_key(), **kw)
    hub.set_peer(PeerConfig(b.public_key, ["10.7.0.2/32"], ("192.0.2.2", 2)))
    hub.set_peer(PeerConfig(c.public_key, ["10.7.0.0/24", "fd00::/64"], ("192.0.2.3", 3)))
    out = hub.send_packet(ipv4_packet("10.7.0.1", "10.7.0.2"), now)
    assert out.datagrams[0][1] == ("192.0.2.2", 2)  # /32 beats /24
    out = hub.send_packet(ipv4_packet("10.7.0.1", "10.7.0.3"), now)
    assert out.datagrams[0][1] == ("192.0.2.3", 3)
    out = hub.send_packet(ipv4_packet("10.7.0.1", "10.9.0.1"), now)
    assert out.datagrams == [] and "no peer" in out.events[0].detail
    with pytest.raises(LocalProtocolError):
        hub.send_packet(b"not an ip packet", now)


def test_incoming_source_outside_allowed_ips_is_dropped():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"ok"))
    p.send("b", ipv4_packet(IP_B, IP_A, b"ok"))
    # b's IP layer sends a packet claiming another source: b routes it by destination to a ...
    p.send("b", ipv4_packet("10.7.0.66", IP_A, b"spoofed"))
    # ... and a refuses it: 10.7.0.66 is not in b's allowed IPs on a.
    assert [pk for pk in p.received_a if pk.endswith(b"spoofed")] == []
    assert any(k == "dropped" for k in p.kinds("a"))


def test_bad_length_field_in_decrypted_packet_is_dropped():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"ok"))
    bad = bytearray(ipv4_packet(IP_A, IP_B, b"abc"))
    bad[2:4] = (500).to_bytes(2, "big")  # claims more than it carries
    p.send("a", bytes(bad))
    assert len(p.received_b) == 1
    assert "dropped" in p.kinds("b")


def test_peer_without_endpoint_cannot_initiate_but_can_respond():
    p = Pair(b_has_endpoint=False)
    out = p.b.send_packet(ipv4_packet(IP_B, IP_A), p.clock.now)
    assert out.datagrams == [] and "no endpoint" in out.events[0].detail
    p.send("a", ipv4_packet(IP_A, IP_B, b"hello"))
    assert "handshake-complete" in p.kinds("b")  # endpoint learnt from the initiation
    p.send("b", ipv4_packet(IP_B, IP_A, b"back"))
    assert p.received_a[-1].endswith(b"back")


def test_roaming_updates_the_endpoint():
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B))
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"moved"), p.clock.now)
    p.b.receive_datagram(out.datagrams[0][0], ("198.51.100.7", 7777), p.clock.now)
    assert p.b.peer(p.a.public_key).endpoint == ("198.51.100.7", 7777)


def test_set_peer_refuses_own_key_and_remove_peer_forgets_sessions():
    p = Pair()
    with pytest.raises(LocalProtocolError):
        p.a.set_peer(PeerConfig(p.a.public_key, []))
    p.send("a", ipv4_packet(IP_A, IP_B))
    data = next(d for w, d, _ in p.wire if w == "a" and d[0] == 4)
    p.b.remove_peer(p.a.public_key)
    assert p.b.receive_datagram(data, ADDR_A, p.clock.now).kinds() == ["dropped"]
    assert p.b.peers() == []


from hypothesis import given, settings, strategies as st  # noqa: E402


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.sampled_from([b"", b"\x01\x00\x00\x00", b"\x02\x00\x00\x00", b"\x03\x00\x00\x00",
                                                 b"\x04\x00\x00\x00"]))
def test_random_datagrams_never_raise_and_are_dropped(body, header):
    p = Pair(seed=7)
    p.send("a", ipv4_packet(IP_A, IP_B, b"session up"))
    data = header + body
    for dev in (p.a, p.b):
        out = dev.receive_datagram(data, ("198.51.100.9", 1), p.clock.now)
        assert out.packets == [] and out.kinds() == ["dropped"]
