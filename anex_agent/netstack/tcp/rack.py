"""RACK loss detection (RFC 8985 §6), sans-I/O: time is passed in.

Contract: the sender tells :class:`Rack` every segment it transmits (:meth:`Rack.sent`, with
whether it is a retransmission), which segments were delivered (:meth:`Rack.delivered`: the one
ending at the new cumulative ACK and the one ending at the first, newest, SACK block; the
receiver sends that block first, so it is the most recently delivered), the cumulative ACK
(:meth:`Rack.acked`) and each D-SACK (:meth:`Rack.dsack`). :meth:`Rack.detect_loss` then returns
the ranges ``[start, end)`` it deems lost, because a segment sent later was delivered and the
segment's own ACK is overdue by more than RACK.rtt + RACK.reo_wnd (§6.2 step 5), and the time
left until the next segment would be (arm a timer, call again then; None: none pending).
A lost *retransmission* is found the same way, since a retransmission is a new transmission
with its own time: it is repaired after about one RTT, not an RTO.

``is_sacked(start, end)`` is the caller's scoreboard. Segments are kept in transmission order
(a deque of ``[start, end, xmit_ts, retransmitted, live]``; a retransmission marks the old
entry dead and appends a new one), so :meth:`detect_loss` walks only the segments sent before
the newest delivered one and stops at the first that is not overdue yet: amortised O(1) per ACK.
Deviation: the timer is armed for the earliest pending segment (RFC 8985 takes the latest);
an early wake-up only runs the detection again.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

REO_WND_PERSIST = 16  # §6.2 step 4: recoveries before a widened reordering window shrinks back


class Rack:
    __slots__ = ("segs", "by_end", "xmit_ts", "end_seq", "rtt", "min_rtt", "fack", "reordering_seen",
                 "reo_wnd_mult", "reo_wnd_persist", "dsack_round", "stats_lost")

    def __init__(self) -> None:
        self.segs: deque[list] = deque()
        self.by_end: dict[int, list] = {}  # live segments by end sequence number
        self.xmit_ts: float | None = None  # of the most recently sent segment that was delivered
        self.end_seq = 0
        self.rtt = 0.0  # RACK.rtt: the RTT of that segment
        self.min_rtt: float | None = None
        self.fack = 0  # highest delivered end sequence number
        self.reordering_seen = False
        self.reo_wnd_mult = 1
        self.reo_wnd_persist = REO_WND_PERSIST
        self.dsack_round: int | None = None
        self.stats_lost = 0

    def sent(self, start: int, end: int, now: float, retransmitted: bool) -> None:
        old = self.by_end.get(end)
        if old is not None:
            old[4] = False
        seg = [start, end, now, retransmitted, True]
        self.segs.append(seg)
        self.by_end[end] = seg

    def delivered(self, end: int, now: float) -> None:
        """The segment ending at ``end`` was cumulatively ACKed or SACKed now (§6.2 steps 1-3)."""
        seg = self.by_end.get(end)
        if seg is None or not seg[4]:
            return
        rtt = now - seg[2]
        if seg[3] and self.min_rtt is not None and rtt < self.min_rtt:
            return  # §6.2 step 2: the ACK is for the original, not this retransmission
        if self.min_rtt is None or rtt < self.min_rtt:
            self.min_rtt = rtt
        if self.xmit_ts is None or seg[2] > self.xmit_ts or (seg[2] == self.xmit_ts and end > self.end_seq):
            self.xmit_ts, self.end_seq, self.rtt = seg[2], end, rtt
        if end > self.fack:
            self.fack = end
        elif end < self.fack and not seg[3]:
            self.reordering_seen = True  # an original delivered below one delivered before (step 3)

    def acked(self, una: int) -> None:
        """Forget what the cumulative ACK covers (from the head: the oldest transmissions)."""
        segs, by_end = self.segs, self.by_end
        while segs and (segs[0][1] <= una or not segs[0][4]):
            seg = segs.popleft()
            if seg[4] and by_end.get(seg[1]) is seg:
                del by_end[seg[1]]

    def dsack(self, snd_una: int, snd_nxt: int) -> None:
        """A D-SACK arrived: widen the reordering window, once per round trip (§6.2 step 4)."""
        self.reordering_seen = True
        if self.dsack_round is not None and snd_una >= self.dsack_round:
            self.dsack_round = None
        if self.dsack_round is None:
            self.dsack_round = snd_nxt
            self.reo_wnd_mult += 1
            self.reo_wnd_persist = REO_WND_PERSIST

    def recovery_done(self) -> None:
        """A recovery ended (§6.2 step 4): after 16 of them the reordering window shrinks back."""
        self.reo_wnd_persist -= 1
        if self.reo_wnd_persist <= 0:
            self.reo_wnd_mult = 1
            self.reo_wnd_persist = REO_WND_PERSIST

    def reo_wnd(self, in_recovery: bool, sacked_segments: int, srtt: float, dupthresh: int = 3) -> float:
        """RACK.reo_wnd (§6.2 step 4)."""
        if not self.reordering_seen and (in_recovery or sacked_segments >= dupthresh):
            return 0.0
        base = (self.min_rtt or 0.0) / 4 * self.reo_wnd_mult
        return base if base < srtt else srtt

    def detect_loss(self, now: float, reo_wnd: float, is_sacked: Callable[[int, int], bool]
                    ) -> tuple[list[tuple[int, int]], float | None]:
        """Segments deemed lost now (popped: their retransmission is a new :meth:`sent`) and the
        seconds until the next one would be, or None (§6.2 step 5)."""
        lost: list[tuple[int, int]] = []
        if self.xmit_ts is None:
            return lost, None
        segs, by_end = self.segs, self.by_end
        rack_ts, rack_end, window = self.xmit_ts, self.end_seq, self.rtt + reo_wnd
        timeout = None
        # Every entry passed is removed (it is at the head when passed), and the walk stops at
        # the first one not judged yet or not overdue: each entry is walked over once.
        while segs:
            seg = segs[0]
            start, end, ts, _, live = seg
            if not live or is_sacked(start, end):
                if live:  # delivered: never asked again
                    seg[4] = False
                    if by_end.get(end) is seg:
                        del by_end[end]
                segs.popleft()
                continue
            if not (ts < rack_ts or (ts == rack_ts and end < rack_end)):
                break  # sent after the newest delivered segment: not judged yet
            remaining = ts + window - now
            if remaining > 0:
                timeout = remaining
                break
            lost.append((start, end))
            seg[4] = False
            if by_end.get(end) is seg:
                del by_end[end]
            segs.popleft()
        self.stats_lost += len(lost)
        return lost, timeout
