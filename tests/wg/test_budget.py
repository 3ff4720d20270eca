"""Handshake work under a budget (anex_agent/wg/budget.py): what a valid-mac1 flood can make the device do."""

from __future__ import annotations

from anex_agent.wire import keys
from anex_agent.wg.budget import (
    BACKLOG_MAX_AGE,
    COOKIE_REPLY_BURST,
    HANDSHAKE_BACKLOG,
    HANDSHAKE_WORK_BURST,
    HANDSHAKES_PER_TURN,
    HandshakeBudget,
    TokenBucket,
    source_of,
)
from anex_agent.wg.cookie import CookieGenerator
from anex_agent.wg.device import Device
from anex_agent.wg.peer import PeerConfig
from anex_agent.wg.ratelimit import BURST

from .conftest import ADDR_A, ADDR_B, IP_A, IP_B, Pair, ipv4_packet


def stranger_initiation(victim: Device, clock_now: float) -> bytes:
    """A handshake initiation with a valid mac1 from a random identity (anyone who knows the public key)."""
    stranger = Device(keys.generate_private_key(), wall_time=lambda: 1_700_000_000.0)
    stranger.set_peer(PeerConfig(victim.public_key, ["10.9.0.1/32"], ADDR_B))
    return stranger.initiate_handshake(victim.public_key, clock_now).datagrams[0][0]


def proven_initiations(victim: Device, n: int, now: float) -> list[tuple[bytes, tuple[str, int]]]:
    """``n`` initiations from strangers at ``n`` addresses, each carrying a valid mac2 (the stranger
    answered our cookie reply at that address: what an attacker with real addresses can do)."""
    found = []
    for i in range(n):
        src = (f"198.51.100.{i + 1}", 40000 + i)
        stranger = Device(keys.generate_private_key(), wall_time=lambda: 1_700_000_000.0)
        stranger.set_peer(PeerConfig(victim.public_key, ["10.9.0.1/32"], ADDR_B))
        first = stranger.initiate_handshake(victim.public_key, now - 10).datagrams[0][0]
        reply = victim.receive_datagram(first, src, now - 10).datagrams[0][0]
        assert stranger.receive_datagram(reply, ADDR_B, now - 10).kinds() == ["cookie-received"]
        again = stranger.initiate_handshake(victim.public_key, now - 4).datagrams[0][0]
        assert again[-16:] != bytes(16)
        found.append((again, src))
    return found


def test_token_bucket_and_sources():
    bucket = TokenBucket(10.0, 2)
    assert [bucket.take(0.0) for _ in range(3)] == [True, True, False]
    assert bucket.ready_at() == 0.1
    assert not bucket.take(0.05) and bucket.take(0.1)
    assert source_of(("192.0.2.1", 1)) == source_of(("192.0.2.1", 2)) == "192.0.2.1"
    assert source_of(("2001:db8::1", 1)) == source_of(("2001:db8::ffff", 9)) != source_of(("2001:db8:0:1::1", 1))
    assert source_of("relay-7") == "relay-7"


def test_backlog_is_bounded():
    budget = HandshakeBudget()
    assert all(budget.defer(object(), ("192.0.2.1", 1), 0.0) for _ in range(HANDSHAKE_BACKLOG))
    assert not budget.defer(object(), ("192.0.2.1", 1), 0.0)
    assert budget.due() is not None


def test_a_flood_from_a_few_addresses_gets_few_cookie_replies():
    """Valid-mac1 initiations that never take up their cookie: each address gets its burst of cookie
    replies, then nothing: no Diffie-Hellman work, no reply per message."""
    p = Pair()
    flood = [stranger_initiation(p.b, p.clock.now) for _ in range(4)]
    sources = [(f"203.0.113.{i}", 5000 + i) for i in range(1, 5)]
    kinds: dict[str, int] = {}
    details: set[str] = set()
    for n in range(400):  # 400 messages at one instant, from 4 addresses
        out = p.b.receive_datagram(flood[n % 4], sources[n % 4], p.clock.now)
        for event in out.events:
            kinds[event.kind] = kinds.get(event.kind, 0) + 1
            details.add(event.detail)
    assert kinds.get("handshake-responded", 0) == 0
    assert kinds["cookie-sent"] <= 4 * BURST + 64  # the first second's messages before "under load" count too
    assert "under load: handshake rate limit for this source exceeded" in details


def test_cookie_replies_are_bounded_in_all():
    p = Pair()
    p.b.force_under_load = True
    init = stranger_initiation(p.b, p.clock.now)
    kinds = [p.b.receive_datagram(init, (f"10.{i // 250}.{i % 250}.1", 1), p.clock.now).kinds()
             for i in range(COOKIE_REPLY_BURST + 20)]
    assert kinds.count(["cookie-sent"]) == COOKIE_REPLY_BURST
    assert kinds.count(["dropped"]) == 20


def test_real_peer_completes_its_handshake_through_a_flood():
    """The node under a flood answers a real peer's initiation with a cookie reply; its retry carries
    mac2, waits in the backlog and is worked: the session carries data."""
    p = Pair()
    flood = stranger_initiation(p.b, p.clock.now)
    for i in range(200):  # puts b under load
        p.b.receive_datagram(flood, (f"203.0.113.{i % 5}", 1), p.clock.now)
    p.send("a", ipv4_packet(IP_A, IP_B, b"through the flood"))
    assert "cookie-received" in p.kinds("a") and "handshake-complete" not in p.kinds("a")
    for step in range(60):  # the flood goes on while a's retry timer runs
        p.tick(0.1)
        p.b.receive_datagram(flood, (f"203.0.113.{step % 5}", 1), p.clock.now)
    assert "handshake-complete" in p.kinds("a")
    assert p.received_b[-1].endswith(b"through the flood")


def test_under_load_data_comes_before_waiting_initiations():
    """Data of an established session arriving in the same turn as proven initiations is decrypted
    at once; the initiations wait until update_timers, which works a few per call."""
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B, b"hello"))  # a session a -> b
    assert "handshake-complete" in p.kinds("a")
    p.b.force_under_load = True
    now = p.clock.now
    waiting = proven_initiations(p.b, HANDSHAKES_PER_TURN + 3, now)
    for data, src in waiting:
        out = p.b.receive_datagram(data, src, now)
        assert out.datagrams == [] and out.kinds() == []  # no work yet
        assert out.next_deadline is not None and out.next_deadline <= now  # due at once
    data = p.a.send_packet(ipv4_packet(IP_A, IP_B, b"data first"), now).datagrams[0][0]
    out = p.b.receive_datagram(data, ADDR_A, now)
    assert [r.packet for r in out.packets][-1].endswith(b"data first")
    worked = p.b.update_timers(now)
    unknown = [e for e in worked.events if "unknown public key" in e.detail]
    assert len(unknown) == HANDSHAKES_PER_TURN  # a few per turn
    assert worked.next_deadline is not None and worked.next_deadline <= now  # more are waiting
    rest = p.b.update_timers(now)
    assert len([e for e in rest.events if "unknown public key" in e.detail]) == 3
    assert p.b.next_deadline() is None or p.b.next_deadline() > now


def test_work_budget_defers_a_burst_and_drops_stale():
    """Not under load either, no more than the work budget's burst of initiations is worked at
    once; the rest waits for tokens, and one that waited past BACKLOG_MAX_AGE is dropped."""
    p = Pair()
    p.b.force_under_load = False
    now = p.clock.now
    init = stranger_initiation(p.b, now)
    outs = [p.b.receive_datagram(init, ("192.0.2.77", 1), now) for _ in range(HANDSHAKE_WORK_BURST + 2)]
    assert sum(1 for o in outs if o.events) == HANDSHAKE_WORK_BURST  # worked (and dropped: unknown key)
    deadline = p.b.next_deadline()
    assert deadline is not None and deadline > now  # the next token
    late = p.b.update_timers(now + BACKLOG_MAX_AGE + 1)
    assert [e.detail for e in late.events].count("handshake initiation waited too long") == 2


def test_responses_for_unknown_indices_cost_no_cookie():
    """Under load, a response with a valid mac1 but for no initiation of ours is dropped by its
    index, before any cookie reply or Diffie-Hellman work."""
    p = Pair()
    p.send("a", ipv4_packet(IP_A, IP_B))
    resp = next(d for w, d, _ in p.wire if w == "b" and d[0] == 2)
    p.a.force_under_load = True
    forged = CookieGenerator(p.a.public_key).add_macs(resp[:8] + b"\x09\x09\x09\x09" + resp[12:], p.clock.now)
    res = p.a.receive_datagram(forged, ADDR_B, p.clock.now)
    assert res.kinds() == ["dropped"] and "unknown index" in res.events[0].detail and res.datagrams == []


def test_under_load_a_spent_source_is_refused_before_any_parsing():
    p = Pair()
    p.b.force_under_load = True
    init = stranger_initiation(p.b, p.clock.now)
    src = ("203.0.113.9", 1)
    assert [p.b.receive_datagram(init, src, p.clock.now).kinds() for _ in range(BURST)] == [["cookie-sent"]] * BURST
    res = p.b.receive_datagram(b"\x01\0\0\0" + bytes(3), src, p.clock.now)  # not even a whole message
    assert [e.detail for e in res.events] == ["under load: handshake rate limit for this source exceeded"]
    res = p.b.receive_datagram(b"\x01\0\0\0" + bytes(3), ("203.0.113.10", 1), p.clock.now)  # another source
    assert "bytes; it must be exactly" in res.events[0].detail
