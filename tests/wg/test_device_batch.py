"""The device's batch entry points (receive_datagrams, send_packets): the same results as one
call per datagram or packet, one Output for the whole batch, bad input dropped, never raised."""

from __future__ import annotations

import itertools
import random

from anex_agent.wire import keys
from .conftest import ADDR_A, ADDR_B, IP_A, IP_B, Pair, ipv4_packet


def established() -> Pair:
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"hello"))
    assert p.kinds("b").count("handshake-complete") == 1
    return p


def test_send_packets_encrypts_every_packet_in_order_in_one_output():
    p = established()
    packets = [ipv4_packet(IP_A, IP_B, bytes([i]) * (10 + i)) for i in range(50)]
    out = p.a.send_packets(packets, p.clock.now)
    assert len(out.datagrams) == 50 and all(ep == ADDR_B for _, ep in out.datagrams)
    counters = [int.from_bytes(d[8:16], "little") for d, _ in out.datagrams]
    assert counters == sorted(counters) and len(set(counters)) == 50
    back = p.b.receive_datagrams([(d, ADDR_A) for d, _ in out.datagrams], p.clock.now)
    assert [r.packet for r in back.packets] == packets
    assert back.kinds() == []


def test_send_packets_drops_what_it_cannot_route_and_keeps_the_rest():
    p = established()
    good = ipv4_packet(IP_A, IP_B, b"good")
    out = p.a.send_packets([b"\x00not ip", ipv4_packet(IP_A, "10.99.0.1", b"nobody"), good], p.clock.now)
    assert out.kinds() == ["dropped", "dropped"]
    assert "not an IPv4 or IPv6 packet" in out.events[0].detail
    assert "allowed IPs" in out.events[1].detail
    (datagram, _), = out.datagrams
    assert [r.packet for r in p.b.receive_datagram(datagram, ADDR_A, p.clock.now).packets] == [good]


def test_send_packets_without_a_session_stages_them_and_handshakes_once():
    p = Pair()
    packets = [ipv4_packet(IP_A, IP_B, bytes([i])) for i in range(5)]
    out = p.a.send_packets(packets, p.clock.now)
    assert out.kinds() == ["handshake-initiated"] and len(out.datagrams) == 1
    p.deliver(out, "a")
    assert p.received_b == packets  # sent once the handshake completed, in order


def twins(monkeypatch) -> tuple[Pair, Pair]:
    """Two pairs built alike (same keys, same seeded randomness): their sessions are identical,
    so one's datagrams are accepted by the other's receiver, which starts in the same state."""
    fixed = itertools.cycle([keys.generate_private_key(), keys.generate_private_key()])
    monkeypatch.setattr(keys, "generate_private_key", lambda: next(fixed))
    return established(), established()


def test_receive_datagrams_equals_one_call_per_datagram(monkeypatch):
    """The same datagrams (transport, replays, garbage, a keepalive) through both entry points."""
    rng = random.Random(7)
    p, q = twins(monkeypatch)
    sent = p.a.send_packets([ipv4_packet(IP_A, IP_B, rng.randbytes(rng.randrange(0, 1400))) for _ in range(40)],
                            p.clock.now).datagrams
    keepalive = p.a.send_keepalive(p.b.public_key, p.clock.now).datagrams
    stream = [d for d, _ in sent + keepalive]
    stream += [stream[3], stream[0], b"\x04\x00\x00\x00" + bytes(28), b"\x04\x01\x00\x00" + bytes(40), b"", b"\x09"]
    (extra, _), = p.a.send_packets([ipv4_packet(IP_A, IP_B, b"never delivered intact")], p.clock.now).datagrams
    tampered = bytearray(extra)
    tampered[-1] ^= 1
    stream.append(bytes(tampered))
    rng.shuffle(stream)

    one_by_one, kinds_one = [], []
    for data in stream:
        out = q.b.receive_datagram(data, ADDR_A, q.clock.now)
        one_by_one += [r.packet for r in out.packets]
        kinds_one += [(e.kind, e.detail) for e in out.events]
    batch = p.b.receive_datagrams([(data, ADDR_A) for data in stream], p.clock.now)
    assert one_by_one and [r.packet for r in batch.packets] == one_by_one
    assert [(e.kind, e.detail) for e in batch.events] == kinds_one
    assert ("keepalive-received", "") in kinds_one
    details = " ".join(d for k, d in kinds_one if k == "dropped")
    assert "replayed" in details and "authentication" in details and "reserved" in details
    assert batch.next_deadline == q.b.next_deadline() is not None


def test_receive_datagrams_handles_a_handshake_inside_a_batch():
    """An initiation and the transport data behind it in the same batch (a new session mid-burst)."""
    p = Pair()
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"first"), p.clock.now)
    (init, _), = out.datagrams
    response = p.b.receive_datagrams([(init, ADDR_A)], p.clock.now)
    assert response.kinds() == ["handshake-responded"]
    (resp, _), = response.datagrams
    confirm = p.a.receive_datagram(resp, ADDR_B, p.clock.now)  # A: complete, sends the staged packet
    more = p.a.send_packets([ipv4_packet(IP_A, IP_B, b"second")], p.clock.now)
    batch = [(d, ADDR_A) for d, _ in confirm.datagrams + more.datagrams]
    got = p.b.receive_datagrams(batch, p.clock.now)
    assert [r.packet[20:] for r in got.packets] == [b"first", b"second"]
    assert got.kinds() == ["handshake-complete"]
