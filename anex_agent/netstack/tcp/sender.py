"""The send side of a TCP connection: the user's bytes into segments, as the windows allow, and
what an acknowledgement of new data does (the send buffer drains, the congestion window grows).

A mixin of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the note in that
module on why the concerns are mixins of one object). It owns the send buffer (``_sbuf``
from ``_soff`` holds the bytes from ``_buf_seq`` on, unacknowledged or unsent),
``snd_una``/``snd_nxt``/``snd_max`` (RFC 9293 §3.3.1) and the congestion window outside
recovery (slow start, RFC 5681; CUBIC, :mod:`.cubic`). Contract:

* :meth:`Sender.write` takes what the send buffer has room for and returns how much
  (back-pressure); it marks the connection ``pending``: the stack's next flush calls
  :meth:`Sender.output`.
* :meth:`Sender.output` sends what ``min(snd_wnd, cwnd)`` allows (SACKed bytes no longer
  count as in flight, RFC 6675's pipe), at most an MSS per segment, waiting for a fuller
  window rather than sending a small one (sender SWS avoidance, RFC 9293 §3.8.6.2.1), paced
  over the round trip (:mod:`.pacing`: what the pacer holds back waits for ``pace_at``);
  then the FIN once all data is out, then a due ACK nothing carried. It arms the
  retransmission timer, the tail loss probe, or the zero-window probe.
* ``_on_ack`` takes an acknowledgement of new data: frees the buffer (marks the connection
  ``dirty``: room to write), samples the RTT, grows ``cwnd`` (or hands the ACK to the
  recovery, :mod:`.recovery`, while in it) and the send buffer (:mod:`.autotune`), and marks
  the connection ``pending``.

Not implemented: Nagle (writes are coalesced by the adapter instead, like TCP_NODELAY with
corking).
"""

from __future__ import annotations

from anex_agent.netstack.tcp import pacing
from anex_agent.netstack.tcp.autotune import send_target
from anex_agent.netstack.tcp.segment import ACK, FIN, PSH
from anex_agent.netstack.tcp.states import CLOSED, SEND_STATES

COMPACT_AT = 64 * 1024  # acknowledged bytes kept at the send buffer's head before it is compacted


class Sender:
    """The send path of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the module)."""

    __slots__ = ()

    @property
    def send_space(self) -> int:
        """Bytes :meth:`write` takes now (0 after :meth:`close` or an error)."""
        if self._fin_queued or self.error is not None or self.state == CLOSED:
            return 0
        return max(0, self.snd_buf - (len(self._sbuf) - self._soff))

    @property
    def unsent_or_unacked(self) -> int:
        return len(self._sbuf) - self._soff

    def write(self, data) -> int:
        """Queue as much of ``data`` as the send buffer takes; return how much. Send with the stack's flush."""
        n = min(len(data), self.send_space)
        if n:
            self._sbuf += data[:n] if n < len(data) else data
            self.events.pending[self] = None
        return n

    def output(self, now: float) -> None:
        """Send what the windows allow, a due ACK, a FIN (the stack calls this on flush)."""
        self._now = now
        if self.state not in SEND_STATES:
            self._ack_if_due()
            return
        if self._fin_queued and self._fin_seq is None:
            self._fin_seq = self._buf_seq + len(self._sbuf) - self._soff
        mss = self.mss
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        cwnd = self.cwnd
        if self._sacked:  # what the receiver holds above a hole is no longer in flight
            cwnd += self._sacked.total
        wnd = self.snd_wnd if self.snd_wnd < cwnd else cwnd
        edge = self.snd_una + wnd
        fin_seq = self._fin_seq
        sbuf, soff, buf_seq = self._sbuf, self._soff, self._buf_seq
        sent = False
        s = self.snd_nxt
        sacked = self._sacked if s < self.snd_max else None
        tokens = None
        srtt = self.rtt.srtt
        if self.pacer is not None and srtt and s < data_end:
            pace_rate = pacing.rate(self.cwnd, srtt, self.cwnd < self.ssthresh)
            tokens = self.pacer.available(now, pace_rate, mss)
        while s < data_end:
            if sacked:  # going back after a timeout: skip what the receiver holds
                s = sacked.skip(s)
                if s >= data_end:
                    break
            room = edge - s
            if room <= 0:
                break
            n = data_end - s
            if n > mss:
                n = mss
            if n > room:
                if s > self.snd_una and room < mss:  # sender SWS avoidance (§3.8.6.2.1): wait for a fuller window
                    break
                n = room
            if sacked:
                n = sacked.limit(s, n)
            if tokens is not None:
                if tokens + 1 < n:  # paced: the rest after a timer
                    self.pacer.tokens = tokens
                    self.pace_at = self.pacer.ready_at(now, pace_rate, n)
                    tokens = None
                    break
                tokens -= n
            off = soff + s - buf_seq
            flags = ACK
            end = s + n
            if end == data_end:
                flags = ACK | PSH
                if fin_seq is not None and end == fin_seq:
                    flags = ACK | PSH | FIN
            if self._rtt_seq is None and end > self.snd_max:
                self._rtt_seq, self._rtt_time = end, now
            if s < self.snd_max:
                self.stats["retransmits"] += 1
            self._emit(s, flags, bytes(sbuf[off:off + n]))
            if self.rack is not None:
                self.rack.sent(s, end, now, s < self.snd_max)
            s = end + 1 if flags & FIN else end
            sent = True
        if fin_seq is not None and s == fin_seq and s == data_end:
            self._emit(s, FIN | ACK, b"")
            s += 1
            sent = True
        if tokens is not None:
            self.pacer.tokens = tokens
        self.snd_nxt = s
        if s > self.snd_max:
            self.snd_max = s
        self._ack_if_due()  # nothing carried it
        if sent:
            if self.rto_at is None:
                self.rto_at = now + self.rtt.rto
            self._arm_tlp(now)
        elif self.snd_wnd == 0 and data_end > self.snd_una and self.snd_max == self.snd_una and self.persist_at is None:
            self.persist_at = now + self._persist_backoff  # zero window: probe it (§3.8.6.1)

    def _on_ack(self, ack: int, now: float) -> None:
        acked = ack - self.snd_una
        data_end = self._buf_seq + len(self._sbuf) - self._soff
        done = min(ack, data_end) - self._buf_seq
        if done > 0:
            self._soff += done
            self._buf_seq += done
            if self._soff >= COMPACT_AT and self._soff * 2 >= len(self._sbuf):
                del self._sbuf[:self._soff]
                self._soff = 0
            self.events.dirty[self] = None  # room to write
        if self._fin_seq is not None and ack > self._fin_seq:
            self._fin_acked = True
        self.snd_una = ack
        if self.snd_nxt < ack:
            self.snd_nxt = ack
        if self._sacked:
            self._sacked.acked(ack)
        if self.rack is not None:
            self.rack.acked(ack)
        self._sample_rtt(ack, now)
        self._retries = 0
        if self.in_recovery:
            self._recovery_ack(ack, acked, now)
        else:
            mss = self.mss
            self.dupacks = 0
            if self.cwnd < self.ssthresh:
                # slow start, counting bytes (RFC 3465) without its L = 2*SMSS per ACK: our receiver and
                # Linux's (GRO) acknowledge whole bursts at once, and L would slow start to a crawl on
                # a long pipe (as Linux, up to ssthresh)
                self.cwnd = min(self.cwnd + acked, max(self.ssthresh, self.cwnd + 2 * mss))
            elif self.cc is not None:
                self.cwnd = self.cc.increase(self.cwnd, acked, now, self.rtt.srtt or 0.0)
            else:
                self.cwnd += max(1, mss * mss // self.cwnd) * max(1, acked // mss)
            if 2 * self.cwnd > self.snd_buf and self.snd_buf < self.params.send_buffer_max:
                self.snd_buf += self._grow(send_target(self.cwnd, self.snd_buf, self.params.send_buffer_max) - self.snd_buf)
        self.rto_at = None if self.snd_una >= self.snd_max else now + self.rtt.rto
        if self._tlp_high is not None and ack >= self._tlp_high:
            self._tlp_high = None  # the probe (or what it stood for) arrived
        self._arm_tlp(now)
        self.events.pending[self] = None

    def _sample_rtt(self, ack: int, now: float) -> None:
        """One timed segment per round trip (RFC 6298 with Karn), when there are no timestamps."""
        if self._rtt_seq is not None and ack >= self._rtt_seq and (self.ts is None or self.rtt.srtt is None):
            self.rtt.sample(now - self._rtt_time)
            self._rtt_seq = None
