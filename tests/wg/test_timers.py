"""Whitepaper §6 timers with an injected clock (Pair.tick fires every deadline in order)."""

from __future__ import annotations

import pytest

from anex_agent.wg.constants import (
    KEEPALIVE_TIMEOUT,
    MAX_HANDSHAKE_ATTEMPTS,
    REJECT_AFTER_TIME,
    REKEY_AFTER_TIME,
    REKEY_TIMEOUT,
    REKEY_TIMEOUT_JITTER_MAX,
    ZERO_KEY_MATERIAL_AFTER,
)
from .conftest import ADDR_A, IP_A, IP_B, Pair, initiations, ipv4_packet


def established(**kw) -> Pair:
    p = Pair(**kw)
    p.send("a", ipv4_packet(IP_A, IP_B, b"hello"))
    p.send("b", ipv4_packet(IP_B, IP_A, b"hello back"))
    assert p.kinds("a").count("handshake-complete") == 1
    return p


def keepalives(p: Pair, who: str, since: float = float("-inf")) -> list[float]:
    return [t for w, d, t in p.wire if w == who and d[0] == 4 and len(d) == 32 and t >= since]


def test_rekey_after_time_by_the_initiator_keeps_traffic_flowing():
    p = established()
    t0 = p.clock.now
    p.tick(REKEY_AFTER_TIME - 1)
    p.send("a", ipv4_packet(IP_A, IP_B, b"before"))
    assert initiations(p, "a") == [t0]  # not yet
    p.tick(2)
    p.send("a", ipv4_packet(IP_A, IP_B, b"after"))
    assert len(initiations(p, "a")) == 2  # the send after REKEY_AFTER_TIME started a rekey
    assert p.received_b[-1].endswith(b"after")  # sent on the old session, still valid
    assert p.kinds("a").count("handshake-complete") == 2
    p.send("b", ipv4_packet(IP_B, IP_A, b"new session"))
    assert p.received_a[-1].endswith(b"new session")


def test_responder_does_not_rekey_on_time_when_sending():
    p = established()
    p.tick(REKEY_AFTER_TIME + 1)
    p.send("b", ipv4_packet(IP_B, IP_A, b"x"))
    assert initiations(p, "b") == []


def test_initiator_rekeys_when_receiving_near_reject_after_time():
    p = established()
    t0 = p.clock.now
    p.tick(REJECT_AFTER_TIME - KEEPALIVE_TIMEOUT - REKEY_TIMEOUT + 1)
    p.drop_to = set()
    p.send("b", ipv4_packet(IP_B, IP_A, b"late data"))
    assert len(initiations(p, "a")) == 2 and initiations(p, "a")[0] == t0


def test_keepalive_after_keepalive_timeout_when_only_receiving():
    p = established()
    p.tick(KEEPALIVE_TIMEOUT + 1)  # flush the keepalive from establishing
    p.send("a", ipv4_packet(IP_A, IP_B, b"data, no answer from b's IP layer"))
    t = p.clock.now
    p.tick(KEEPALIVE_TIMEOUT - 0.01)
    assert keepalives(p, "b", since=t) == []
    p.tick(0.02)
    assert keepalives(p, "b", since=t) == [pytest.approx(t + KEEPALIVE_TIMEOUT)]
    assert "keepalive-received" in p.kinds("a")


def test_no_keepalive_when_data_went_back():
    p = established()
    p.tick(KEEPALIVE_TIMEOUT + 1)
    t = p.clock.now
    p.send("a", ipv4_packet(IP_A, IP_B, b"ping"))
    p.send("b", ipv4_packet(IP_B, IP_A, b"pong"))
    p.tick(KEEPALIVE_TIMEOUT / 2)
    assert keepalives(p, "b", since=t) == []


def test_persistent_keepalive_interval():
    p = established(keepalive_a=25)
    t = p.clock.now
    p.tick(100)
    times = keepalives(p, "a", since=t + 1)
    assert len(times) == 4
    assert [round(b - a, 6) for a, b in zip(times, times[1:])] == [25.0, 25.0, 25.0]


def test_new_handshake_when_sent_data_gets_no_answer():
    p = established()
    p.tick(KEEPALIVE_TIMEOUT + 1)
    p.drop_to = {"a"}  # b's replies are lost
    t = p.clock.now
    p.send("a", ipv4_packet(IP_A, IP_B, b"anyone?"))
    p.tick(KEEPALIVE_TIMEOUT + REKEY_TIMEOUT - 0.01)
    assert [x for x in initiations(p, "a") if x >= t] == []
    p.tick(0.02)
    assert [x for x in initiations(p, "a") if x >= t] == [pytest.approx(t + KEEPALIVE_TIMEOUT + REKEY_TIMEOUT)]


@pytest.mark.parametrize("jitter", [0.0, 0.5, 0.999])
def test_retry_with_jitter_then_give_up_after_rekey_attempt_time(jitter):
    p = Pair()
    p.jitter = jitter
    p.drop_to = {"b"}
    t = p.clock.now
    p.send("a", ipv4_packet(IP_A, IP_B, b"lost"))
    p.tick(200)
    times = initiations(p, "a")
    assert times[0] == t
    assert len(times) == 1 + MAX_HANDSHAKE_ATTEMPTS
    gaps = {round(b - a, 6) for a, b in zip(times, times[1:])}
    assert gaps == {round(REKEY_TIMEOUT + jitter * REKEY_TIMEOUT_JITTER_MAX, 6)}
    assert p.kinds("a").count("handshake-gave-up") == 1
    assert p.kinds("a").count("handshake-retry") == MAX_HANDSHAKE_ATTEMPTS
    assert times[-1] - t <= 90 + MAX_HANDSHAKE_ATTEMPTS * REKEY_TIMEOUT_JITTER_MAX
    assert len(p.a.peer(p.b.public_key).staged) == 0  # the queued packet was dropped
    p.drop_to = set()
    p.tick(10)
    p.send("a", ipv4_packet(IP_A, IP_B, b"later"))  # a new packet starts afresh
    assert p.received_b[-1].endswith(b"later")


def test_reject_after_time_stops_using_a_session():
    p = established()
    p.drop_to = {"b"}
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"old"), p.clock.now)
    stale = out.datagrams[0][0]
    p.tick(REJECT_AFTER_TIME + 1)
    res = p.b.receive_datagram(stale, ADDR_A, p.clock.now)
    assert res.kinds() == ["dropped"] and "expired" in res.events[0].detail
    n = len(initiations(p, "a"))
    p.drop_to = set()
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"fresh"), p.clock.now)
    assert [d[0] for d, _ in out.datagrams] == [1]  # a handshake, not data on the dead session
    p.deliver(out, "a")
    assert len(initiations(p, "a")) == n + 1 and p.received_b[-1].endswith(b"fresh")


def test_zeroing_of_key_material_after_three_reject_after_times():
    p = established()
    stale = next(d for w, d, _ in p.wire if w == "a" and d[0] == 4)
    p.tick(ZERO_KEY_MATERIAL_AFTER - 1)
    assert "keys-zeroed" not in p.kinds("a") + p.kinds("b")
    p.tick(2)
    assert p.kinds("a").count("keys-zeroed") == 1 and p.kinds("b").count("keys-zeroed") == 1
    peer = p.a.peer(p.b.public_key)
    assert peer.keypairs.all() == [] and peer.handshake.chaining_key == b""
    res = p.b.receive_datagram(stale, ADDR_A, p.clock.now)
    assert res.kinds() == ["dropped"] and "unknown index" in res.events[0].detail
    assert p.a.next_deadline() is None and p.b.next_deadline() is None  # idle: nothing left to do


def test_keypair_rotation_previous_session_still_decrypts_during_rekey():
    p = established()
    p.drop_to = {"b"}
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"in flight on the old session"), p.clock.now)
    late = out.datagrams[0][0]
    p.drop_to = set()
    p.clock.now += 1
    p.a.expire_sessions(p.b.public_key)
    for kp in p.b.peer(p.a.public_key).keypairs.all():
        kp.created = p.clock.now - 2  # b still considers the old session valid
    p.send("a", ipv4_packet(IP_A, IP_B, b"triggers rekey"))
    assert p.kinds("b").count("handshake-complete") == 2
    kps = p.b.peer(p.a.public_key).keypairs
    assert kps.previous is not None and kps.current is not None and kps.next is None
    res = p.b.receive_datagram(late, ADDR_A, p.clock.now)
    assert [x.packet for x in res.packets][0].endswith(b"in flight on the old session")


def test_next_deadline_is_reported():
    p = Pair()
    out = p.a.send_packet(ipv4_packet(IP_A, IP_B), p.clock.now)
    assert out.next_deadline == pytest.approx(p.clock.now + REKEY_TIMEOUT + 0.5 * REKEY_TIMEOUT_JITTER_MAX)


def test_timer_index_matches_a_scan_of_every_peer():
    """next_deadline()/update_timers() use a heap; check them against the obvious scan under random traffic."""
    import random as _random

    from anex_agent.wire import keys
    from anex_agent.wg.device import Device
    from anex_agent.wg.peer import PeerConfig

    rng = _random.Random(11)
    clock = [100.0]
    kw = dict(wall_time=lambda: 1.7e9 + clock[0], random_bytes=rng.randbytes, jitter=rng.random)
    hub = Device(keys.generate_private_key(), **kw)
    spokes = []
    for i in range(30):
        dev = Device(keys.generate_private_key(), **kw)
        ka = rng.choice([None, 25, 7])
        hub.set_peer(PeerConfig(dev.public_key, [f"10.9.{i}.0/24"], ("192.0.2.1", 1000 + i), persistent_keepalive=ka))
        dev.set_peer(PeerConfig(hub.public_key, ["10.9.0.0/16"], ("192.0.2.254", 1)))
        spokes.append(dev)
    by_port = {1000 + i: d for i, d in enumerate(spokes)}

    def deliver(out, sender_port=None):
        for data, endpoint in out.datagrams:
            if sender_port is None:  # hub -> spoke
                if rng.random() < 0.8:
                    deliver(by_port[endpoint[1]].receive_datagram(data, ("192.0.2.254", 1), clock[0]), endpoint[1])
            elif rng.random() < 0.8:
                deliver(hub.receive_datagram(data, ("192.0.2.1", sender_port), clock[0]))

    def scan():
        return min((d for p in hub.peers() if (d := p.timers.next_deadline()) is not None), default=None)

    for _ in range(600):
        step = rng.random()
        if step < 0.4:
            i = rng.randrange(30)
            deliver(hub.send_packet(ipv4_packet("10.9.255.1", f"10.9.{i}.5"), clock[0]))
        elif step < 0.6:
            i = rng.randrange(30)
            deliver(spokes[i].send_packet(ipv4_packet(f"10.9.{i}.5", "10.9.255.1"), clock[0]), 1000 + i)
        else:
            clock[0] += rng.choice([0.1, 1, 5, 11, 40, 200])
            deliver(hub.update_timers(clock[0]))
            for i, dev in enumerate(spokes):
                deliver(dev.update_timers(clock[0]), 1000 + i)
        assert hub.next_deadline() == scan()
        assert scan() is None or scan() > clock[0] or step < 0.6  # nothing overdue right after update_timers
    assert len(hub._heap) <= 4 * len(hub.peers())  # no unbounded growth
