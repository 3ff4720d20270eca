"""Loss recovery of a TCP connection: finding what the network lost and sending it again.

A mixin of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the note in that
module on why the concerns are mixins of one object). It owns the SACK scoreboard
(``_sacked``, :mod:`.scoreboard`), the recovery state (``in_recovery``, ``recover``,
``dupacks``, ``dupthresh``, ``_rexmit_hi``), the D-SACK undo state (``_undo_*``), the tail
loss probe (``tlp_at``, ``_tlp_high``) and the RTO's consequences (the timer itself,
``rto_at``, is armed by whoever sends). It drives :mod:`.rack` and :mod:`.cubic`'s reactions
to loss; every retransmission goes out through the receiver's ``_emit`` and counts in
``stats``. Contract, per input:

* ``_take_sack`` merges an ACK's SACK blocks (RFC 2018) before the ACK is processed; a
  D-SACK (RFC 2883) for every retransmission of the last recovery undoes it (RFC 3708) and
  raises the duplicate-ACK threshold.
* ``_on_dupack``: a duplicate ACK (or one with SACK information). Enough of them, or enough
  SACKed bytes, or a tail probe that came back SACKed, enter fast recovery
  (``_enter_recovery``: RFC 5681 §3.2, RFC 6582; early retransmit for small flights, RFC
  5827); in recovery each one repairs the next hole (RFC 6675's NextSeg, simplified).
* ``_recovery_ack``: new data acknowledged in recovery: a full ACK leaves it (cwnd =
  ssthresh), a partial one repairs the next hole.
* ``_rack_detect`` (RFC 8985 §6.2): what a later delivery shows lost goes again, a lost
  retransmission included; arms ``rack_at`` for the reordering window.
* ``_arm_tlp`` / ``_send_tlp`` (RFC 8985 §7): a probe two SRTTs after the last send, so a
  lost tail costs about two round trips, not an RTO.
* ``_on_rto`` (RFC 6298 §5, RFC 5681 §3.1): back off, collapse cwnd to one segment and go
  back to SND.UNA (skipping what the receiver SACKed, until a second timeout in a row stops
  trusting it); gives up with ``TIMED_OUT`` after ``TcpParams.data_retries`` (or
  ``syn_retries`` for the handshake).

Retransmissions leave at once; new data waits for the flush (these methods mark the connection
``pending`` where it may follow), except after an RTO, whose go-back runs
:meth:`~anex_agent.netstack.tcp.sender.Sender.output` itself.
"""

from __future__ import annotations

from anex_agent.netstack.tcp.segment import ACK, FIN, PSH
from anex_agent.netstack.tcp.states import HALF, M32, SYN_RECEIVED, SYN_SENT, TIMED_OUT

DUPTHRESH = 3  # RFC 5681 §3.2
MAX_DUPTHRESH = 9  # higher thresholds turn real losses into timeouts when windows are small


class Recovery:
    """Loss detection and repair of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the module)."""

    __slots__ = ()

    def _on_dupack(self, now: float) -> None:
        self.dupacks += 1
        mss = self.mss
        # the threshold, lowered when fewer segments are in flight than it needs (early retransmit, RFC 5827)
        flight_segs = (self.snd_max - self.snd_una + mss - 1) // mss
        unsent = self._buf_seq + len(self._sbuf) - self._soff > self.snd_max
        thresh = self.dupthresh if unsent or flight_segs > self.dupthresh else max(1, min(self.dupthresh, flight_segs - 1))
        sacked = self._sacked.total
        # the probe of a lost tail came back SACKed: everything below it that is not SACKed is lost
        tail_lost = self._tlp_high is not None and bool(self._sacked) and self._sacked.highest >= self._tlp_high
        if (self.dupacks >= thresh or sacked >= self.dupthresh * mss or tail_lost) and not self.in_recovery:
            if self.snd_una >= self.recover or self.recover == self.iss or tail_lost:  # RFC 6582 §3.2 step 2
                self._enter_recovery(now)
        elif self.in_recovery:
            if not self._sacked:
                self.cwnd += mss  # NewReno: inflate for each segment that left the network
            self._retransmit_hole(now)  # with SACK: the next known hole, one per arriving ACK
        self.events.pending[self] = None  # SACKed data left the network: new data may go (RFC 3042, 6675)

    def _enter_recovery(self, now: float) -> None:
        """Fast retransmit (RFC 5681 §3.2, RFC 6582): the loss halves ssthresh (CUBIC: x 0.7)."""
        mss = self.mss
        self._tlp_high = None
        flight = self.snd_max - self.snd_una
        self._undo_cwnd, self._undo_ssthresh, self._undo_retrans = self.cwnd, self.ssthresh, 0
        self.ssthresh = self.cc.on_congestion(self.cwnd) if self.cc is not None else max(flight // 2, 2 * mss)
        self.recover = self.snd_max
        self.in_recovery = True
        self.stats["fast_retransmits"] += 1
        if self.rack is None:
            self._rexmit_hi = 0
        # with RACK, what the last recovery retransmitted is not sent again now: RACK sends it
        # again if it is lost again (a new recovery may start while those are on their way)
        if not self._retransmit_hole(now) and (self.rack is None or self.snd_una >= self._rexmit_hi):
            self._retransmit_head(now)
        # SACKed bytes count as gone from the network in output() (RFC 6675's pipe); without
        # SACK, NewReno inflates cwnd by the three segments the duplicate ACKs stand for
        self.cwnd = self.ssthresh if self._sacked else self.ssthresh + 3 * mss
        self.rto_at = now + self.rtt.rto

    def _recovery_ack(self, ack: int, acked: int, now: float) -> None:
        """An acknowledgement of new data while in recovery (``snd_una`` already moved to ``ack``)."""
        if ack >= self.recover:  # full acknowledgement: leave recovery (RFC 6582 §3.2 step 3, option 2:
            self.cwnd = self.ssthresh  # a flight that drained in recovery must not collapse cwnd to 2 segments)
            self.in_recovery = False
            self.dupacks = 0
            if self.rack is not None:
                self.rack.recovery_done()
        else:  # partial acknowledgement: the next hole was lost too (with RACK: when it says so,
            # since a paced flight may still be on its way)
            mss = self.mss
            if not self._retransmit_hole(now) and ack >= self._rexmit_hi and self.rack is None:
                self._retransmit_head(now)
            self.cwnd = max(self.cwnd - acked + mss, mss)
            self.rto_at = now + self.rtt.rto

    def _rack_detect(self, now: float) -> None:
        """RACK (RFC 8985 §6.2 step 5): retransmit what a later delivery shows lost, enter recovery
        for it; a retransmission found lost goes again at once instead of waiting for the RTO."""
        rack = self.rack
        srtt = self.rtt.srtt or 0.0
        sacked = self._sacked
        reo = rack.reo_wnd(self.in_recovery, sacked.total // self.mss, srtt, self.dupthresh)
        lost, timeout = rack.detect_loss(now, reo, sacked.covers)
        self.rack_at = None if timeout is None else now + timeout
        if not lost:
            return
        repaired = self._rexmit_hi if self.in_recovery else 0  # retransmitted up to here before
        if not self.in_recovery:
            self._enter_recovery(now)  # repairs the first hole
        for start, end in lost:
            if start < repaired:  # a retransmission was lost: send it again now
                self._retransmit_range(start, end, now)
            elif end > self._rexmit_hi:  # not repaired yet: the next hole in order
                self._retransmit_hole(now)
        self.events.pending[self] = None

    def _retransmit_range(self, start: int, end: int, now: float) -> None:
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        start = max(start, self.snd_una)
        end = min(end, data_end)
        while start < end:
            n = min(self.mss, end - start)
            off = self._soff + start - self._buf_seq
            self._rtt_seq = None  # Karn
            self.stats["retransmits"] += 1
            self.stats["rack_retransmits"] = self.stats.get("rack_retransmits", 0) + 1
            self._emit(start, ACK, bytes(self._sbuf[off:off + n]))
            self.rack.sent(start, start + n, now, True)
            self._undo_retrans += 1
            start += n
        self.rto_at = now + self.rtt.rto

    def _take_sack(self, blocks, ack: int) -> None:
        """Merge the peer's SACK blocks (wire edges) into the scoreboard; bogus ones are ignored.

        A first block below the cumulative ACK is a D-SACK (RFC 2883): a segment arrived twice.
        When every retransmission of the last fast recovery comes back as one, the recovery was
        caused by reordering: cwnd and ssthresh are restored and the duplicate-ACK threshold
        raised (as RFC 3708 and Linux's reordering metric do)."""
        una, top = self.snd_una, self.snd_max
        first_end = una + ((blocks[0][1] - una + HALF) & M32) - HALF
        if first_end <= ack and self.rack is not None:
            self.rack.dsack(una, self.snd_nxt)
        if first_end <= ack and self._undo_retrans > 0:
            self._undo_retrans -= 1
            if self._undo_retrans == 0 and self._undo_cwnd:
                if self.cc is not None:
                    self.cc.undo()
                self.cwnd = max(self.cwnd, self._undo_cwnd)
                self.ssthresh = max(self.ssthresh, self._undo_ssthresh)
                self.in_recovery = False
                self.dupthresh = min(MAX_DUPTHRESH, self.dupthresh + DUPTHRESH)
                self._undo_cwnd = 0
                self.stats["undone"] = self.stats.get("undone", 0) + 1
        add = self._sacked.add
        for start, end in blocks:
            add(una + ((start - una + HALF) & M32) - HALF, una + ((end - una + HALF) & M32) - HALF, una, top)

    def _retransmit_hole(self, now: float) -> bool:
        """Retransmit up to one MSS of the first hole at or after the last retransmission that lies
        below the highest SACKed byte (RFC 6675's NextSeg, simplified). False when there is none."""
        hole = self._sacked.next_hole(max(self.snd_una, self._rexmit_hi))
        if hole is None:
            return False
        seq, hole_end = hole
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        n = min(self.mss, hole_end - seq, data_end - seq)
        if n <= 0:
            return False
        off = self._soff + seq - self._buf_seq
        self._rtt_seq = None  # Karn
        self.stats["retransmits"] += 1
        self._emit(seq, ACK, bytes(self._sbuf[off:off + n]))
        if self.rack is not None:
            self.rack.sent(seq, seq + n, now, True)
        self._rexmit_hi = seq + n
        self._undo_retrans += 1
        self.rto_at = now + self.rtt.rto
        return True

    def _retransmit_head(self, now: float) -> None:
        """Send the segment at SND.UNA again (fast retransmit, partial ACK)."""
        seq = self.snd_una
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        self._rtt_seq = None  # Karn
        self.stats["retransmits"] += 1
        self._undo_retrans += 1
        if seq < data_end:
            n = min(self.mss, data_end - seq, self.snd_max - seq)
            off = self._soff + seq - self._buf_seq
            flags = ACK
            if self._fin_seq is not None and seq + n == self._fin_seq and self.snd_max > self._fin_seq:
                flags |= FIN
            self._emit(seq, flags, bytes(self._sbuf[off:off + n]))
            if self.rack is not None:
                self.rack.sent(seq, seq + n, now, True)
        elif self._fin_seq is not None and seq == self._fin_seq:
            self._emit(seq, FIN | ACK, b"")

    def _arm_tlp(self, now: float) -> None:
        """PTO = 2 SRTT, plus a delayed ACK's worth when one segment is in flight (RFC 8985 §7.2)."""
        srtt = self.rtt.srtt
        if srtt is None or self.in_recovery or self._tlp_high is not None or self.snd_max <= self.snd_una:
            self.tlp_at = None
            return
        pto = max(2 * srtt, 0.01)
        if self.snd_max - self.snd_una <= self.mss:
            pto += self.params.delayed_ack
        self.tlp_at = now + pto if self.rto_at is None or now + pto < self.rto_at else None

    def _send_tlp(self, now: float) -> None:
        """Send the last segment again, so that its ACK (with SACK) reveals what the tail lost."""
        end = self.snd_max
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        self.stats["tlp"] = self.stats.get("tlp", 0) + 1
        self._tlp_high = end
        self._rtt_seq = None
        if self._fin_seq is not None and end > self._fin_seq and data_end <= self._fin_seq + 1:
            start = max(self.snd_una, self._fin_seq - self.mss)
            off = self._soff + start - self._buf_seq
            self._emit(start, ACK | FIN, bytes(self._sbuf[off:off + self._fin_seq - start]))
        else:
            start = max(self.snd_una, end - self.mss)
            off = self._soff + start - self._buf_seq
            self._emit(start, ACK | PSH, bytes(self._sbuf[off:off + end - start]))
            if self.rack is not None:
                self.rack.sent(start, end, now, True)
        self.rto_at = now + self.rtt.rto

    def _on_rto(self, now: float) -> None:
        self._retries += 1
        self.stats["timeouts"] += 1
        self.tlp_at = self._tlp_high = None
        self.rtt.backoff()
        self._rtt_seq = None
        if self.state in (SYN_SENT, SYN_RECEIVED):
            if self._retries > self.params.syn_retries:
                self.abort_with(TIMED_OUT)
                return
            self._resend_syn(now)
            self.rto_at = now + self.rtt.rto
            return
        if self._retries > self.params.data_retries:
            self.abort_with(TIMED_OUT)
            return
        if self.snd_max > self.snd_una:  # RFC 5681 §3.1 eq. 4, then go back to SND.UNA in slow start
            flight = self.snd_max - self.snd_una
            self.ssthresh = self.cc.on_timeout(flight) if self.cc is not None else max(flight // 2, 2 * self.mss)
            self.cwnd = self.mss
            if self._retries > 1:  # RFC 2018 §8: the receiver may have dropped what it SACKed; a second
                self._sacked.clear()  # timeout in a row stops trusting the scoreboard
            self._undo_cwnd = 0
            self.in_recovery = False
            self.recover = self.snd_max
            self.dupacks = 0
            self.snd_nxt = self.snd_una
            self.rto_at = None
            self.output(now)
            self.rto_at = now + self.rtt.rto
        else:
            self.rto_at = None
