"""TCP between two of our stacks over a fake link with an injected clock."""

from __future__ import annotations

import hashlib
import os
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from anex_agent.netstack import ipv4
from anex_agent.netstack.tcp import connection as C
from anex_agent.netstack.tcp import segment as tcpwire
from anex_agent.netstack.tcp.autotune import MemoryBudget
from anex_agent.netstack.tcp.connection import Connection, TcpParams
from anex_agent.netstack.tcp.events import Events
from tests.netstack.link import A, B, Link


def connect(link: Link, port: int = 80):
    link.b.tcp_listen(port)
    client = link.a.tcp_connect(B, port, link.now)
    accepted = []

    def done():
        accepted.extend(link.b.take_accepted())
        return bool(accepted) and client.established

    link.run_until(done, limit=link.now + 60)
    return client, accepted[0][1]


def transfer(link: Link, src, dst, data: bytes, *, limit: float = 600.0, close: bool = True) -> bytes:
    sent = 0
    got = bytearray()
    buf = bytearray(256 * 1024)

    def done():
        nonlocal sent
        if sent < len(data):
            sent += src.write(memoryview(data)[sent:sent + 256 * 1024])
        if sent == len(data) and close:
            src.close()  # idempotent
        while n := dst.readinto(buf):
            got.extend(buf[:n])
        return dst.at_eof if close else len(got) == len(data)

    link.run_until(done, limit=link.now + limit)
    return bytes(got)


def tcp_fields(packet: bytes):
    sport, dport, seq, ack, off, flags, wnd = struct.unpack_from("!HHIIBBH", packet, 20)
    return {"seq": seq, "ack": ack, "flags": flags, "wnd": wnd, "len": len(packet) - 20 - (off >> 4) * 4,
            "options": packet[40:20 + (off >> 4) * 4]}


def test_handshake_transfer_and_close_through_every_state():
    link = Link()
    client, server = connect(link)
    assert client.state_name == server.state_name == "ESTABLISHED"
    data = os.urandom(200_000)
    assert transfer(link, client, server, data) == data
    link.run_until(lambda: client.state_name == "FIN-WAIT-2")  # our FIN's ACK arrives
    assert server.state_name == "CLOSE-WAIT"
    server.close()
    assert server.state_name == "LAST-ACK"
    link.run_until(lambda: client.state_name == "TIME-WAIT" and server.state_name == "CLOSED")
    assert server.error is None
    entered = link.now
    link.run_until(lambda: client.state_name == "CLOSED")
    assert link.now - entered == pytest.approx(TcpParams().time_wait, abs=0.01)  # a short TIME-WAIT
    assert not link.a.conns and not link.b.conns


def test_a_connection_reports_what_happened_in_its_events_and_needs_no_stack():
    a, b = bytes((10, 254, 0, 1)), bytes((10, 254, 0, 2))
    params, budget = TcpParams(), MemoryBudget(TcpParams().buffer_budget)
    ca, cb = Events(), Events()
    client = Connection(ca, budget, (b, 80, 40000), tcpwire.Builder(a, 40000, b, 80), params, 1380, 1000, 0.0)
    server = Connection(cb, budget, (a, 40000, 80), tcpwire.Builder(b, 80, a, 40000), params, 1380, 5000, 0.0)

    def segments(events: Events) -> list[tcpwire.Segment]:
        taken = [tcpwire.parse(ipv4.parse(p)) for p in events.packets]
        events.packets.clear()
        return taken

    client.open_active(0.0)
    (syn,) = segments(ca)
    assert syn.flags == tcpwire.SYN and not ca.established and not ca.closed
    server.open_passive(syn, 0.001)
    (synack,) = segments(cb)
    assert synack.flags == tcpwire.SYN | tcpwire.ACK
    client.segment_arrived(synack, 0.002)
    assert ca.established == [client] and client in ca.dirty and client.state_name == "ESTABLISHED"
    (ack,) = segments(ca)
    server.segment_arrived(ack, 0.003)
    assert cb.established == [server] and server in cb.dirty

    assert client.write(b"hello") == 5 and client in ca.pending
    assert segments(ca) == []  # nothing leaves before the owner's flush calls output()
    client.output(0.004)
    (data,) = segments(ca)
    assert bytes(data.payload) == b"hello"
    cb.dirty.clear()
    server.segment_arrived(data, 0.005)
    assert server in cb.dirty and server.read() == b"hello"

    client.abort()
    (rst,) = segments(ca)
    assert rst.flags & tcpwire.RST and ca.closed == [client] and client.state_name == "CLOSED"
    server.segment_arrived(rst, 0.006)
    assert cb.closed == [server] and server.error == C.RESET


def test_a_listener_closed_during_the_handshake_resets_the_connection():
    link = Link()
    link.b.tcp_listen(80)
    client = link.a.tcp_connect(B, 80, link.now)
    link.run_until(lambda: len(link.b.conns) == 1)  # SYN-RECEIVED, the SYN-ACK on its way
    link.b.tcp_unlisten(80)
    link.run_until(lambda: client.state_name == "CLOSED")
    assert client.error == C.RESET
    assert link.b.take_accepted() == [] and not link.b.conns


def test_the_backlog_holds_a_half_open_connection_until_it_is_accepted_or_gives_up():
    link = Link()
    link.b.tcp_listen(80, backlog=1)
    link.filter = lambda sender, packet: sender == "b"  # every SYN-ACK is lost
    first = link.a.tcp_connect(B, 80, link.now)
    link.run_until(lambda: len(link.b.conns) == 1)
    second = link.a.tcp_connect(B, 80, link.now)
    link.run_until(lambda: link.b.drops["listener backlog full"] > 0)  # no room for the second
    link.run_until(lambda: not link.b.conns and first.state_name == second.state_name == "CLOSED")
    assert first.error == second.error == C.TIMED_OUT
    link.filter = None
    accepted = []
    for _ in range(2):  # the slot came back when the half-open one gave up, and again when one is accepted
        client = link.a.tcp_connect(B, 80, link.now)
        link.run_until(lambda: (accepted.extend(link.b.take_accepted()) or len(accepted) > 0) and client.established)
        assert accepted.pop()[1].established


def test_syn_carries_mss_clamped_to_the_mtu_and_window_scale():
    link = Link(mtu=1280)
    link.tapping = True
    client, server = connect(link)
    syn = tcp_fields(link.tap[0][1])
    assert syn["flags"] == C.SYN
    assert syn["options"][:4] == bytes((2, 4)) + (1280 - 40).to_bytes(2, "big")
    assert syn["options"][4:8] == bytes((1, 3, 3, C.OUR_WSCALE))
    assert syn["options"][8:12] == bytes((1, 1, 4, 2))  # SACK-permitted
    assert syn["options"][12:16] == bytes((1, 1, 8, 10)) and len(syn["options"]) == 24  # timestamps
    assert client.sack_ok and server.sack_ok
    assert client.ts is not None and server.ts is not None
    assert client.mss == server.mss == 1240 - 12  # the payload leaves room for the timestamps
    assert client.snd_wscale == server.rcv_wscale == C.OUR_WSCALE
    data = os.urandom(400_000)
    transfer(link, client, server, data, close=False)
    assert max(len(p) for _, p in link.tap) <= 1280
    assert client.max_snd_wnd > 65535  # scaled windows: more than 64 KiB may be in flight


def test_simultaneous_open():
    link = Link()
    a = link.a.tcp_connect(B, 2000, 0.0, sport=1000)
    b = link.b.tcp_connect(A, 1000, 0.0, sport=2000)
    link.run_until(lambda: a.established and b.established)
    assert a.state_name == b.state_name == "ESTABLISHED"
    assert transfer(link, a, b, b"hello") == b"hello"


def test_simultaneous_close_passes_closing():
    link = Link()
    client, server = connect(link)
    seen = set()
    client.close()
    server.close()

    def both_closed():
        seen.update((client.state_name, server.state_name))
        return client.state_name == server.state_name == "CLOSED"

    link.run_until(both_closed)
    assert "CLOSING" in seen and "TIME-WAIT" in seen
    assert client.error is None and server.error is None


def test_connect_to_a_closed_port_is_refused():
    link = Link()
    client = link.a.tcp_connect(B, 81, 0.0)
    link.run_until(lambda: client.state_name == "CLOSED")
    assert client.error == C.REFUSED


def test_rst_checks_of_rfc5961():
    link = Link()
    client, server = connect(link)
    link.tapping = True
    builder = server._build.__self__
    # in the window but not exactly RCV.NXT: a challenge ACK, the connection lives
    link.b.out.append(builder.build(server.snd_nxt + 100, 0, C.RST, 0))
    link.run_until(lambda: any(n == "a" for n, _ in link.tap))
    reply = tcp_fields(link.tap[-1][1])
    assert reply["flags"] == C.ACK and reply["seq"] == client.snd_nxt & 0xFFFFFFFF
    assert client.state_name == "ESTABLISHED"
    # a SYN on an established connection: a challenge ACK too (RFC 5961 §4)
    link.tap.clear()
    link.b.out.append(builder.build(server.snd_nxt + 5, 0, C.SYN, 0))
    link.run_until(lambda: any(n == "a" for n, _ in link.tap))
    assert tcp_fields(link.tap[-1][1])["flags"] == C.ACK and client.state_name == "ESTABLISHED"
    # exactly at RCV.NXT: the reset is taken
    link.b.out.append(builder.build(server.snd_nxt, 0, C.RST, 0))
    link.run_until(lambda: client.state_name == "CLOSED")
    assert client.error == C.RESET


def test_lost_segment_is_recovered_by_timeout_with_backoff():
    link = Link(delay=0.01)
    client, server = connect(link)
    drops = []

    def drop_first_data(sender, packet):
        if sender == "a" and tcp_fields(packet)["len"] and len(drops) < 2:
            drops.append(link.now)
            return True
        return False

    link.filter = drop_first_data
    start = link.now
    assert transfer(link, client, server, b"x" * 100, close=False) == b"x" * 100
    # a lone segment: no duplicate ACKs; the tail loss probe resends it (lost too), then the RTO does
    assert client.stats.get("tlp") == 1 and client.stats["timeouts"] == 1
    assert link.now - start > 0.2  # the RTO floor (RFC 6298 §2.4, ours 200 ms)


def test_one_lost_segment_in_a_stream_is_fast_retransmitted():
    link = Link(delay=0.005)
    client, server = connect(link)
    count = 0

    def drop_tenth(sender, packet):
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return count == 10
        return False

    link.filter = drop_tenth
    data = os.urandom(300_000)
    assert transfer(link, client, server, data) == data
    assert client.stats["fast_retransmits"] == 1 and client.stats["timeouts"] == 0
    assert not client.in_recovery


def test_several_losses_in_one_window_recover_with_partial_acks():
    link = Link(delay=0.005)
    client, server = connect(link)
    count = 0

    def drop_some(sender, packet):
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return count in (20, 23, 27)
        return False

    link.filter = drop_some
    data = os.urandom(400_000)
    assert transfer(link, client, server, data) == data
    assert client.stats["fast_retransmits"] == 1 and client.stats["timeouts"] == 0  # NewReno: one recovery


def test_zero_window_is_probed_and_reopens_when_the_reader_reads():
    link = Link(params=TcpParams(receive_buffer=64 * 1024), delay=0.005)
    client, server = connect(link)
    data = os.urandom(300_000)
    sent = 0

    def window_closed():  # the reader does not read: the window closes
        nonlocal sent
        sent += client.write(memoryview(data)[sent:])
        return client.snd_wnd == 0 and client.snd_una == client.snd_max

    link.run_until(window_closed, limit=10)
    assert server.readable >= 60_000
    link.tapping = True
    probes_from = link.now
    link.run_until(lambda: link.now > probes_from + 3, limit=probes_from + 10)
    probes = [p for n, p in link.tap if n == "a"]
    assert 2 <= len(probes) <= 6  # persist timer with backoff, not a flood
    got = bytearray(server.read(1 << 20))
    while sent < len(data) or len(got) < len(data):
        sent += client.write(memoryview(data)[sent:])
        link.step()
        got += server.read(1 << 20)
    assert bytes(got) == data


def test_writes_are_bounded_by_the_send_buffer():
    link = Link(params=TcpParams(send_buffer=100_000))
    client, server = connect(link)
    assert client.write(b"x" * 300_000) == 100_000
    assert client.write(b"y") == 0


def test_delayed_ack_for_a_lone_segment():
    link = Link(delay=0.001)
    client, server = connect(link)
    link.tapping = True
    client.write(b"ping")
    link.run_until(lambda: any(n == "b" for n, _ in link.tap))
    sent_at = 0.0
    assert link.now >= TcpParams().delayed_ack - 0.002 + sent_at


def test_keepalive_ends_a_connection_whose_peer_vanished():
    params = TcpParams(keepalive_idle=5.0, keepalive_interval=1.0, keepalive_count=3)
    link = Link(params=params)
    client, server = connect(link)
    link.filter = lambda sender, packet: sender == "b"  # the server's answers are lost from now on
    start = link.now
    link.run_until(lambda: client.state_name == "CLOSED", limit=60)
    assert client.error == C.TIMED_OUT
    assert link.now - start == pytest.approx(5.0 + 3 * 1.0, abs=0.1)


def test_retransmitted_syn_and_connect_timeout():
    link = Link(params=TcpParams(syn_retries=2))
    link.filter = lambda sender, packet: True
    client = link.a.tcp_connect(B, 80, 0.0)
    link.run_until(lambda: client.state_name == "CLOSED", limit=60)
    assert client.error == C.TIMED_OUT
    assert link.now == pytest.approx(1 + 2 + 4, abs=0.01)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(loss=st.floats(0, 0.15), dup=st.floats(0, 0.1), reorder=st.floats(0, 0.3), size=st.integers(0, 150_000),
       seed=st.integers(0, 2**16))
def test_pairs_over_a_lossy_duplicating_reordering_link(loss, dup, reorder, size, seed):
    link = Link(seed=seed, delay=0.002)
    client, server = connect(link)  # handshake losses are the SYN-retry test's; here the data's
    link.loss, link.dup, link.reorder = loss, dup, reorder
    data = os.urandom(size)
    back = os.urandom(size // 3)
    assert hashlib.sha256(transfer(link, client, server, data, limit=3000)).digest() == hashlib.sha256(data).digest()
    assert transfer(link, server, client, back, limit=3000) == back  # the other way, after a half-close
    link.run_until(lambda: not link.a.conns and not link.b.conns, limit=link.now + 3000)
    assert client.error is None and server.error is None


def test_sack_blocks_name_the_holes_and_the_sender_repairs_exactly_them():
    link = Link(delay=0.005)
    client, server = connect(link)
    count = 0
    lost = (20, 24, 28, 33, 40)

    def drop_some(sender, packet):
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return count in lost
        return False

    link.filter = drop_some
    link.tapping = True
    data = os.urandom(400_000)
    assert transfer(link, client, server, data) == data
    sack_acks = [p for n, p in link.tap if n == "b" and bytes((1, 1, 5)) in tcp_fields(p)["options"]]
    assert sack_acks  # the receiver reported what it holds
    assert client.stats["retransmits"] == len(lost)  # each hole once, nothing SACKed was sent again
    assert client.stats["fast_retransmits"] >= 1 and client.stats["timeouts"] == 0


def test_no_sack_when_the_peer_does_not_offer_it():
    link = Link()
    link.b.tcp_listen(80)
    client = link.a.tcp_connect(B, 80, 0.0)
    syn = link.a.out[0]
    # rewrite our SYN without SACK-permitted (as a peer without SACK would send it)
    link.a.out[0] = client._build(client.iss, 0, C.SYN, 65535, b"", C.wire.syn_options(1380, 7, False))
    assert syn != link.a.out[0]
    acc = []
    link.run_until(lambda: (acc.extend(link.b.take_accepted()) or bool(acc)) and client.established)
    assert not acc[0][1].sack_ok


def test_a_recovery_caused_by_reordering_is_undone_by_dsack_and_the_threshold_rises():
    link = Link(delay=0.005)
    client, server = connect(link)
    count = 0

    def late_tenth(sender, packet):  # overtaken by the next ones: duplicate ACKs, no loss
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return 0.02 if count == 10 else 0.0
        return 0.0

    link.hold = late_tenth
    data = os.urandom(300_000)
    assert transfer(link, client, server, data) == data
    assert client.stats["fast_retransmits"] == 1  # spurious: the original arrived after all
    assert client.stats.get("undone") == 1 and client.dupthresh == 2 * C.DUPTHRESH
    assert client.ssthresh > 1 << 20  # restored (it was never set from a real loss)


def test_a_lost_tail_is_repaired_by_a_probe_not_a_timeout():
    link = Link(delay=0.005)
    client, server = connect(link)
    assert transfer(link, client, server, os.urandom(50_000), close=False)  # an RTT sample first
    sent = []

    def lose_the_tail(sender, packet):  # the last two segments of the next write are lost once
        fields = tcp_fields(packet)
        if sender == "a" and fields["len"]:
            sent.append(fields["seq"])
            return len(sent) in (9, 10)
        return False

    link.filter = lose_the_tail
    start = link.now
    data = os.urandom(10 * client.mss)
    assert transfer(link, client, server, data, close=False) == data
    assert client.stats.get("tlp") == 1 and client.stats["timeouts"] == 0
    assert link.now - start < 0.2  # well under the RTO floor
