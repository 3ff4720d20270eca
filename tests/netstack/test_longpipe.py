"""Long fat pipes and loss: CUBIC (RFC 9438), RACK (RFC 8985), buffer auto-tuning under a budget.

The algorithms alone with injected time (their formulas and the RFCs' scenarios), then our
stack over the fake link with an injected clock."""

from __future__ import annotations

import os

import pytest

from anex_agent.netstack.tcp.autotune import STEP, MemoryBudget, ReceiveTuner, send_target
from anex_agent.netstack.tcp.cubic import ALPHA, BETA, C, Cubic
from anex_agent.netstack.tcp.rack import REO_WND_PERSIST, Rack
from anex_agent.netstack.tcp.connection import TcpParams
from tests.netstack.link import Link
from tests.netstack.test_tcp import connect, tcp_fields, transfer

MSS = 1000

# ---------------------------------------------------------------- CUBIC (RFC 9438)


def cubic_after_loss(w_segments: int) -> tuple[Cubic, int]:
    cc = Cubic(MSS)
    ssthresh = cc.on_congestion(w_segments * MSS)
    return cc, ssthresh


def test_cubic_multiplicative_decrease_is_beta_0_7():
    cc, ssthresh = cubic_after_loss(100)
    assert BETA == 0.7 and C == 0.4
    assert ssthresh == 70 * MSS
    assert cc.w_max == 100
    assert cubic_after_loss(2)[1] == 2 * MSS  # never under two segments


def test_cubic_k_and_the_curve_through_w_max():
    cc, ssthresh = cubic_after_loss(100)
    cc.increase(ssthresh, MSS, 10.0, 0.1)  # the epoch starts at the first ACK after the reduction
    assert cc.k == pytest.approx(((100 - 70) / 0.4) ** (1 / 3))  # eq. 2: cbrt(75) = 4.217 s
    assert cc.w_cubic(0) == pytest.approx(70)  # starts at cwnd_epoch
    assert cc.w_cubic(cc.k) == pytest.approx(100)  # back at W_max after K seconds
    assert cc.w_cubic(2 * cc.k) == pytest.approx(130)  # then convex: probing beyond


def grow(cc: Cubic, cwnd: int, start: float, seconds: float, rtt: float) -> int:
    """ACK a whole window every RTT, one segment at a time."""
    now = start
    while now < start + seconds:
        for _ in range(cwnd // MSS):
            cwnd = cc.increase(cwnd, MSS, now, rtt)
        now += rtt
    return cwnd


def test_cubic_plateaus_at_w_max_then_probes_beyond():
    cc, ssthresh = cubic_after_loss(1000)
    cwnd = grow(cc, ssthresh, 0.0, 0.5, 0.1)  # concave: fast at first
    assert 700 * MSS < cwnd < 1000 * MSS
    k = cc.k
    at_k = grow(cc, cwnd, 0.5, k - 0.5, 0.1)
    assert at_k == pytest.approx(1000 * MSS, rel=0.03)  # the plateau around W_max
    later = grow(cc, at_k, k, k, 0.1)
    assert later > 1100 * MSS  # convex: probing for more


def test_cubic_target_is_clamped_to_one_and_a_half_cwnd_per_rtt():
    cc, _ = cubic_after_loss(10)
    cwnd = 7 * MSS
    cc.increase(cwnd, MSS, 0.0, 0.1)
    cwnd = grow(cc, cwnd, 100.0, 0.1, 0.1)  # far past K: W_cubic(t+RTT) is huge
    assert cwnd <= int(7 * 1.5 * MSS) + 2 * MSS  # at most 1.5x per round trip (§4.5)


def test_cubic_reno_friendly_region_on_short_rtts():
    cc, ssthresh = cubic_after_loss(20)
    cwnd = grow(cc, ssthresh, 0.0, 0.010, 0.001)  # 10 round trips of 1 ms
    # W_cubic barely moved (K = cbrt(6/0.4) = 2.47 s); W_est grew by ALPHA segments per RTT (§4.3)
    assert cc.w_cubic(0.01) < 14.1
    assert cwnd / MSS == pytest.approx(14 + 10 * ALPHA, abs=0.6)
    assert ALPHA == pytest.approx(3 * 0.3 / 1.7)


def test_cubic_fast_convergence_and_undo():
    cc, _ = cubic_after_loss(100)
    cc.on_congestion(80 * MSS)  # a loss below the previous W_max: release bandwidth (§4.7)
    assert cc.w_max == pytest.approx(80 * (1 + BETA) / 2)
    cc.undo()  # that loss was spurious (§4.9)
    assert cc.w_max == 100
    cc.on_timeout(50 * MSS)
    cc.undo()  # a timeout is not undone
    assert cc.w_max == pytest.approx(50 * (1 + BETA) / 2)


# ---------------------------------------------------------------- auto-tuning


def test_budget_grants_at_most_what_is_left():
    budget = MemoryBudget(100)
    assert budget.take(60) == 60 and budget.take(60) == 40 and budget.take(1) == 0
    budget.give(60)
    assert budget.take(70) == 60


def test_receive_buffer_grows_to_twice_what_the_reader_takes_per_rtt():
    tuner = ReceiveTuner(4 << 20)
    size = 512 * 1024
    assert tuner.on_read(64 * 1024, 0.0, None, size) == size  # no RTT yet: nothing to measure against
    tuner.on_read(0, 0.0, 0.05, size)
    for i in range(8):  # 400 KiB within the first 50 ms
        size = tuner.on_read(50 * 1024, 0.005 * i, 0.05, size)
    assert size == 512 * 1024
    size = tuner.on_read(50 * 1024, 0.05, 0.05, size)  # an RTT is over: 450 KiB per RTT
    assert size == 900 * 1024 + STEP
    for i in range(20):  # a slow reader (10 KiB per RTT): no growth
        size = tuner.on_read(10 * 1024, 0.1 + 0.05 * i, 0.05, size)
    assert size == 900 * 1024 + STEP
    for i in range(40):  # a fast one: doubling, up to the maximum
        size = tuner.on_read(8 << 20, 2.0 + 0.05 * i, 0.05, size)
    assert size == 4 << 20


def test_send_buffer_follows_twice_the_congestion_window():
    assert send_target(100_000, 512 * 1024, 16 << 20) == 512 * 1024
    assert send_target(1 << 20, 512 * 1024, 16 << 20) == 2 << 20
    assert send_target(64 << 20, 512 * 1024, 16 << 20) == 16 << 20


# ---------------------------------------------------------------- RACK (RFC 8985)


def sacked_by(blocks):
    return lambda s, e: any(bs <= s and e <= be for bs, be in blocks)


def test_rack_a_segment_sent_before_a_delivered_one_is_lost_after_the_reordering_window():
    rack = Rack()
    for i in range(3):  # P1 P2 P3 at t=0 (§3.4's example): P1 is lost, P2 and P3 arrive
        rack.sent(i * MSS, (i + 1) * MSS, 0.0, False)
    rtt = 0.1
    rack.delivered(2 * MSS, rtt)
    rack.delivered(3 * MSS, rtt)
    assert rack.xmit_ts == 0.0 and rack.end_seq == 3 * MSS and rack.rtt == pytest.approx(rtt)
    sacked = sacked_by([(MSS, 3 * MSS)])
    reo = rack.reo_wnd(False, 2, srtt=rtt)
    assert reo == pytest.approx(rtt / 4)  # min_RTT / 4 (§6.2 step 4)
    lost, wait = rack.detect_loss(rtt, reo, sacked)
    assert lost == [] and wait == pytest.approx(reo)  # sent at the same time as P3: wait reo_wnd
    lost, wait = rack.detect_loss(rtt + reo, reo, sacked)
    assert lost == [(0, MSS)] and wait is None
    # with three segments SACKed (DupThresh) and no reordering seen, reo_wnd is 0: at once
    assert rack.reo_wnd(False, 3, srtt=rtt) == 0.0


def test_rack_finds_a_lost_retransmission_one_rtt_later():
    rack = Rack()
    rack.sent(0, MSS, 0.0, False)
    rack.sent(MSS, 2 * MSS, 0.0, False)
    rack.delivered(2 * MSS, 0.1)
    lost, _ = rack.detect_loss(0.2, 0.0, sacked_by([(MSS, 2 * MSS)]))
    assert lost == [(0, MSS)]
    rack.sent(0, MSS, 0.2, True)  # the retransmission (lost again)
    rack.sent(2 * MSS, 3 * MSS, 0.21, False)  # new data after it
    lost, wait = rack.detect_loss(0.25, 0.0, sacked_by([(MSS, 2 * MSS)]))
    assert lost == [] and wait is None  # nothing sent after it was delivered yet
    rack.delivered(3 * MSS, 0.31)  # the later segment arrives: the retransmission is overdue
    lost, _ = rack.detect_loss(0.31, 0.0, sacked_by([(MSS, 3 * MSS)]))
    assert lost == [(0, MSS)]
    assert rack.stats_lost == 2


def test_rack_ignores_an_ack_of_the_original_for_a_retransmission():
    rack = Rack()
    rack.sent(0, MSS, 0.0, False)
    rack.delivered(MSS, 0.1)  # min_RTT 100 ms
    rack.sent(MSS, 2 * MSS, 0.2, False)
    rack.sent(MSS, 2 * MSS, 0.25, True)  # retransmitted (spuriously)
    rack.delivered(2 * MSS, 0.27)  # 20 ms after the retransmission: the original's ACK (step 2)
    assert rack.xmit_ts == 0.0


def test_rack_reordering_and_dsack_widen_the_window_and_it_shrinks_back():
    rack = Rack()
    for i in range(4):
        rack.sent(i * MSS, (i + 1) * MSS, 0.0, False)
    rack.delivered(4 * MSS, 0.1)
    rack.delivered(2 * MSS, 0.1)  # below the highest delivered: reordering (step 3)
    assert rack.reordering_seen
    assert rack.reo_wnd(True, 5, srtt=0.1) == pytest.approx(0.025)  # kept even in recovery
    rack.dsack(0, 4 * MSS)
    rack.dsack(MSS, 4 * MSS)  # the same round trip: counted once
    assert rack.reo_wnd_mult == 2 and rack.reo_wnd(True, 5, srtt=0.1) == pytest.approx(0.05)
    assert rack.reo_wnd(True, 5, srtt=0.04) == pytest.approx(0.04)  # never above SRTT
    for _ in range(REO_WND_PERSIST):
        rack.recovery_done()
    assert rack.reo_wnd_mult == 1


def test_rack_walks_each_sacked_or_dead_segment_once_during_a_recovery():
    """Every segment the loss scan passes (lost, SACKed or retransmitted) leaves the list, so the
    next ACK of the recovery starts where the last scan stopped: O(1) amortised per ACK."""
    rack = Rack()
    for i in range(10):
        rack.sent(i * MSS, (i + 1) * MSS, 0.0, False)
    rack.sent(0, MSS, 0.01, True)  # the first one already retransmitted: its old entry is dead
    for i in range(10, 20):  # sent later, not judged yet
        rack.sent(i * MSS, (i + 1) * MSS, 0.05, False)
    rack.delivered(10 * MSS, 0.1)
    asked: list[tuple[int, int]] = []
    sacked = sacked_by([(2 * MSS, 10 * MSS)])

    def is_sacked(start, end):
        asked.append((start, end))
        return sacked(start, end)

    lost, _ = rack.detect_loss(0.2, 0.0, is_sacked)
    assert lost == [(MSS, 2 * MSS)]
    assert rack.segs[0][:2] == [0, MSS] and rack.segs[0][3]  # stopped at the retransmission
    assert len(rack.segs) == 11  # it and the ten sent later: nothing passed is left
    asked.clear()
    for _ in range(5):  # more ACKs of the recovery, nothing new delivered
        rack.detect_loss(0.2, 0.0, is_sacked)
    assert asked == [(0, MSS)] * 5  # only the segment the scan stops at, never those passed


def test_rack_forgets_what_the_cumulative_ack_covers():
    rack = Rack()
    for i in range(100):
        rack.sent(i * MSS, (i + 1) * MSS, i * 0.001, False)
    rack.acked(60 * MSS)
    assert len(rack.segs) == 40 and min(rack.by_end) == 61 * MSS


# ---------------------------------------------------------------- the stack


def test_buffers_grow_with_the_bandwidth_delay_product_and_go_back_to_the_budget():
    params = TcpParams(receive_buffer=64 * 1024, send_buffer=64 * 1024, receive_buffer_max=1 << 20,
                       send_buffer_max=2 << 20)
    link = Link(params=params, delay=0.05)  # a 100 ms round trip
    client, server = connect(link)
    data = os.urandom(3 << 20)
    start = link.now
    assert transfer(link, client, server, data, close=False) == data
    took = link.now - start
    assert server.rcv_buf > 512 * 1024 and client.snd_buf > 512 * 1024
    assert link.b.budget.used == server.rcv_buf + server.snd_buf - 2 * 64 * 1024
    # 64 KiB per round trip would take 48 round trips; the grown window needs far fewer
    assert took < 0.5 * (len(data) / (64 * 1024)) * 0.1
    client.close()
    server.close()
    link.run_until(lambda: link.a.budget.used == 0 and link.b.budget.used == 0, limit=link.now + 60)


def test_the_budget_bounds_growth_for_the_whole_stack():
    params = TcpParams(receive_buffer=64 * 1024, receive_buffer_max=4 << 20, buffer_budget=256 * 1024)
    link = Link(params=params, delay=0.05)
    client, server = connect(link)
    data = os.urandom(2 << 20)
    assert transfer(link, client, server, data, close=False) == data
    assert server.rcv_buf <= 64 * 1024 + 256 * 1024
    assert link.b.budget.used <= 256 * 1024


def drop_one_segment_twice(link: Link, nth: int):
    """Drop the ``nth`` data segment from a, and the first retransmission of it too."""
    state = {"count": 0, "seq": None, "dropped": 0}

    def lossy(sender, packet):
        fields = tcp_fields(packet)
        if sender != "a" or not fields["len"]:
            return False
        state["count"] += 1
        if state["count"] == nth:
            state["seq"] = fields["seq"]
        if fields["seq"] == state["seq"] and state["dropped"] < 2:
            state["dropped"] += 1
            return True
        return False

    link.filter = lossy
    return state


@pytest.mark.parametrize("rack", [True, False])
def test_a_lost_retransmission_is_repaired_without_a_timeout(rack):
    link = Link(params=TcpParams(rack=rack), delay=0.01)
    client, server = connect(link)
    state = drop_one_segment_twice(link, 20)
    data = os.urandom(600_000)
    assert transfer(link, client, server, data) == data
    assert state["dropped"] == 2
    if rack:
        assert client.stats["timeouts"] == 0 and client.stats.get("rack_retransmits", 0) >= 1
    else:  # the mechanism this test is about: without RACK the second loss waits for the RTO
        assert client.stats["timeouts"] == 1


def test_a_loss_reduces_cwnd_by_cubic_beta():
    link = Link(delay=0.01)
    client, server = connect(link)
    count = 0

    def drop_40th(sender, packet):
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return count == 40
        return False

    link.filter = drop_40th
    data = os.urandom(400_000)
    assert transfer(link, client, server, data) == data
    assert client.stats["fast_retransmits"] == 1
    assert client.cc.w_max == pytest.approx(client._undo_cwnd / client.mss)
    assert client.ssthresh == int(client._undo_cwnd * BETA)


# ---------------------------------------------------------------- timestamps (RFC 7323)


def test_timestamps_clock_echo_and_ts_recent_rule():
    from anex_agent.netstack.tcp.timestamps import Timestamps, expected_samples

    ts = Timestamps(offset=0xFFFFFF00, recent=5)
    val = ts.value(1.5)
    assert val == (1500 + 0xFFFFFF00) & 0xFFFFFFFF  # milliseconds, random offset, wrapping
    assert ts.option(1.5)[:4] == bytes((1, 1, 8, 10))
    assert ts.rtt(val, 1.623) == pytest.approx(0.123)  # the echo of what we sent 123 ms ago
    assert ts.rtt((val + 1000) & 0xFFFFFFFF, 1.5) is None  # from the future: not a sample
    ts.received(9, seq=100, rcv_nxt=100)
    assert ts.recent == 9
    ts.received(12, seq=200, rcv_nxt=100)  # out of order, above the window's left edge: ignored (§4.3)
    assert ts.recent == 9
    ts.received(7, seq=100, rcv_nxt=100)  # older: ignored
    assert ts.recent == 9
    ts.recent = 0xFFFFFFF0
    ts.received(4, seq=100, rcv_nxt=100)  # newer across the wrap
    assert ts.recent == 4
    assert expected_samples(100 * MSS, MSS) == 50 and expected_samples(0, MSS) == 1


def test_every_segment_carries_timestamps_and_every_ack_samples_the_rtt():
    link = Link(delay=0.02)
    link.tapping = True
    client, server = connect(link)
    data = os.urandom(200_000)
    assert transfer(link, client, server, data, close=False) == data
    after_syn = [tcp_fields(p) for _, p in link.tap[2:]]
    assert after_syn and all(f["options"][:4] == bytes((1, 1, 8, 10)) for f in after_syn)
    assert client.rtt.srtt == pytest.approx(0.04, abs=0.003)


def test_no_timestamps_when_one_side_does_not_offer_them():
    link = Link(params=TcpParams(timestamps=False))
    link.b.params = TcpParams()
    client, server = connect(link)
    assert client.ts is None and server.ts is None
    assert client.mss == server.mss == 1380


# ---------------------------------------------------------------- pacing


def test_pacer_spreads_a_window_over_the_round_trip():
    from anex_agent.netstack.tcp import pacing

    r = pacing.rate(100 * MSS, 0.1, slow_start=False)
    assert r == pytest.approx(1.2 * 100 * MSS / 0.1)
    assert pacing.rate(100 * MSS, 0.1, slow_start=True) == pytest.approx(2 * 100 * MSS / 0.1)
    pacer = pacing.Pacer()
    burst = pacer.available(0.0, r, MSS)
    assert burst == max(pacing.MIN_BURST * MSS, r * pacing.BURST_TIME)  # a full bucket to start
    pacer.spend(int(burst))
    assert pacer.available(0.0, r, MSS) < MSS
    at = pacer.ready_at(0.0, r, MSS)
    assert at == pytest.approx(max(MSS / r, pacing.MIN_GAP), rel=0.01)
    assert pacer.available(at, r, MSS) >= MSS - 1
    assert pacer.available(10.0, r, MSS) == burst  # idle time does not pile up beyond one burst


def bursts_of(pacing_on: bool) -> dict[float, int]:
    """Data segments the sender puts on the link per instant of the injected clock, for 2 MB."""
    link = Link(delay=0.02, params=TcpParams(pacing=pacing_on))
    client, server = connect(link)
    assert transfer(link, client, server, os.urandom(100_000), close=False)  # an RTT sample first
    bursts: dict[float, int] = {}

    def count(sender, packet):
        if sender == "a" and tcp_fields(packet)["len"]:
            bursts[link.now] = bursts.get(link.now, 0) + 1
        return False

    link.filter = count
    data = os.urandom(2_000_000)
    assert transfer(link, client, server, data, close=False) == data
    return bursts


def test_a_paced_sender_spreads_its_windows():
    def in_big_bursts(bursts):  # the share of the segments that went 33 or more at once
        return sum(n for n in bursts.values() if n > 32) / sum(bursts.values())

    unpaced, paced = bursts_of(False), bursts_of(True)
    assert in_big_bursts(unpaced) > 0.5  # whole windows at once
    assert in_big_bursts(paced) < 0.2  # at most a bucket after an idle moment
    assert len(paced) > 3 * len(unpaced)  # many more, smaller sends


def test_out_of_order_segments_extending_the_newest_block_share_one_ack():
    link = Link(delay=0.01)
    client, server = connect(link)
    assert transfer(link, client, server, os.urandom(200_000), close=False)  # a wide window first
    link.tapping = True
    link.tap.clear()
    count = 0

    def drop_fifth(sender, packet):
        nonlocal count
        if sender == "a" and tcp_fields(packet)["len"]:
            count += 1
            return count == 5
        return False

    link.filter = drop_fifth
    data = os.urandom(300_000)
    assert transfer(link, client, server, data, close=False) == data
    held = [p for n, p in link.tap if n == "a" and tcp_fields(p)["len"]]
    sack_acks = [p for n, p in link.tap if n == "b" and bytes((1, 1, 5)) in tcp_fields(p)["options"]]
    # every segment after the hole arrived out of order, in bursts: far fewer ACKs than segments
    assert len(held) > 100
    assert 1 <= len(sack_acks) <= 20
