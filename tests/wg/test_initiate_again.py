"""Device.initiate_again: a new initiation within REKEY_TIMEOUT for a peer without a session (a first contact)."""

from anex_agent.wg.constants import FIRST_CONTACT_MIN_INTERVAL, REKEY_TIMEOUT
from anex_agent.wg.peer import PeerConfig

from .conftest import ADDR_A, IP_A, IP_B, Pair, initiations, ipv4_packet


def test_a_responder_that_learns_of_us_late_answers_the_next_initiation_at_once():
    p = Pair()
    p.b.remove_peer(p.a.public_key)  # b does not know a yet (its coordinator has not told it)
    p.send("a", ipv4_packet(IP_A, IP_B, b"first request"))
    assert "handshake-complete" not in p.kinds("a") and len(initiations(p, "a")) == 1
    p.tick(0.3)
    p.b.set_peer(PeerConfig(p.a.public_key, [f"{IP_A}/32"], ADDR_A))  # now it knows
    p.deliver(p.a.initiate_again(p.b.public_key, p.clock.now), "a")
    assert p.clock.now - initiations(p, "a")[0] < REKEY_TIMEOUT  # did not wait for the retransmission
    assert p.kinds("a").count("handshake-initiated") == 2 and "handshake-retry" not in p.kinds("a")
    assert "handshake-complete" in p.kinds("a")
    assert p.received_b == [ipv4_packet(IP_A, IP_B, b"first request")]  # the staged packet went with the session


def test_nothing_with_a_session_or_too_soon():
    p = Pair()
    p.b.remove_peer(p.a.public_key)
    p.send("a", ipv4_packet(IP_A, IP_B))
    assert p.a.initiate_again(p.b.public_key, p.clock.now + FIRST_CONTACT_MIN_INTERVAL / 2).datagrams == []
    p.b.set_peer(PeerConfig(p.a.public_key, [f"{IP_A}/32"], ADDR_A))
    p.tick(FIRST_CONTACT_MIN_INTERVAL)
    p.deliver(p.a.initiate_again(p.b.public_key, p.clock.now), "a")
    assert "handshake-complete" in p.kinds("a")
    p.tick(1.0)
    assert p.a.initiate_again(p.b.public_key, p.clock.now).datagrams == []  # a session: nothing to do
