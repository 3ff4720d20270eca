"""Token bucket per source for handshakes under load."""

from anex_agent.wg.ratelimit import BURST, RATE, RateLimiter

from .conftest import ADDR_A, IP_A, IP_B, Pair, ipv4_packet


def test_burst_then_rate():
    rl = RateLimiter()
    assert [rl.allow(b"ip1", 0.0) for _ in range(BURST + 2)] == [True] * BURST + [False, False]
    assert rl.allow(b"ip2", 0.0)  # others are not affected
    assert rl.allow(b"ip1", 1.0 / RATE + 1e-9) and not rl.allow(b"ip1", 1.0 / RATE + 2e-9)


def test_idle_sources_are_forgotten():
    rl = RateLimiter()
    for i in range(100):
        rl.allow(bytes([i]), 0.0)
    assert len(rl) == 100
    rl.allow(b"late", 5.0)
    assert len(rl) == 1


def test_under_load_valid_mac2_floods_are_limited():
    p = Pair()
    p.b.force_under_load = True
    p.send("a", ipv4_packet(IP_A, IP_B))  # gets the cookie
    p.tick(6)  # retry with mac2: handshake completes
    init = [d for w, d, _ in p.wire if w == "a" and d[0] == 1][-1]
    kinds = [p.b.receive_datagram(init, ADDR_A, p.clock.now).kinds() for _ in range(10)]
    assert ["dropped"] in kinds
    assert any("rate limit" in e.detail for e in p.b.receive_datagram(init, ADDR_A, p.clock.now).events)
