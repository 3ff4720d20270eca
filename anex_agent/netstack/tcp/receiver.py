"""The receive side of a TCP connection: the peer's data into the reader's buffer, in order, and
what every segment we send says about it (ACK, window, SACK blocks, timestamp).

A mixin of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the note in that
module on why the concerns are mixins of one object). It owns ``_rbuf``/``_rlen``/``_eof``
(data for :meth:`Receiver.readinto`), ``_ooo`` (out-of-order data, :mod:`.reassembly`),
``rcv_nxt``/``rcv_adv`` (RFC 9293 §3.3.1) and the delayed-ACK state (``delack_at``,
``_unacked_segs``). Contract:

* :meth:`Receiver.readinto` takes buffered bytes; when the reader freed enough of the window
  (receiver SWS avoidance, RFC 9293 §3.8.6.2.2) it marks the connection ``pending`` so the next
  flush sends a window update.
* ``_receive_text`` takes a segment's payload (and FIN) once the state machine accepted it:
  in-order data is appended and marks the connection ``dirty``; every second segment (or after
  ``TcpParams.delayed_ack``) is acknowledged; out-of-order data is held and acknowledged at
  once with SACK blocks (RFC 2018, RFC 5681 §4.2), except a segment that only extends the
  newest block, which shares the ACK of its burst at the flush.
* ``_emit`` is the one place a segment leaves: it carries ``rcv_nxt``, the window
  (``_window``: the right edge never moves left), the timestamp option and, on a pure ACK
  while out-of-order data is held, SACK blocks; sending any segment cancels a delayed ACK.
"""

from __future__ import annotations

from anex_agent.netstack.tcp import segment as wire
from anex_agent.netstack.tcp.segment import ACK
from anex_agent.netstack.tcp.states import CLOSE_WAIT, RECEIVE_STATES


class Receiver:
    """The receive path of :class:`~anex_agent.netstack.tcp.connection.Connection` (see the module)."""

    __slots__ = ()

    @property
    def readable(self) -> int:
        """Bytes buffered for :meth:`readinto`."""
        return self._rlen

    @property
    def at_eof(self) -> bool:
        """The peer's FIN arrived and every byte before it was read."""
        return self._eof and self._rlen == 0

    def readinto(self, buf) -> int:
        """Move up to ``len(buf)`` received bytes into ``buf``; 0 when none are buffered."""
        want = len(buf)
        got = 0
        rbuf = self._rbuf
        while rbuf and got < want:
            chunk = rbuf[0]
            n = len(chunk)
            if n <= want - got:
                buf[got:got + n] = chunk
                got += n
                rbuf.pop(0)
            else:
                take = want - got
                buf[got:want] = chunk[:take]
                rbuf[0] = chunk[take:]
                got = want
        if got:
            self._rlen -= got
            if self._rtuner is not None:  # reads follow arrivals: the last one's time stands for now
                want = self._rtuner.on_read(got, self._last_rx, self.rtt.srtt, self.rcv_buf)
                if want > self.rcv_buf:
                    self.rcv_buf += self._grow(want - self.rcv_buf)
            # a window update when the reader freed enough (receiver SWS avoidance, RFC 9293 §3.8.6.2.2)
            if self.state in RECEIVE_STATES:
                free = self.rcv_buf - self._rlen - self._ooo.size
                if self.rcv_nxt + free - self.rcv_adv >= max(2 * self.local_mss, self.rcv_buf // 4):
                    self.delack_at = -1.0  # "now": the flush sends it
                    self.events.pending[self] = None
        return got

    def read(self, n: int = 65536) -> bytes:
        buf = bytearray(min(n, self._rlen))
        got = self.readinto(buf)
        return bytes(buf[:got])

    def _receive_text(self, seq: int, payload, plen: int, fin: int, now: float) -> None:
        rcv_nxt = self.rcv_nxt
        if seq < rcv_nxt:  # trim what we already have
            cut = rcv_nxt - seq
            if cut >= plen:
                payload, plen = b"", 0
                if fin and seq + cut > rcv_nxt:  # the FIN itself was seen already
                    fin = 0
            else:
                payload = payload[cut:]
                plen -= cut
            seq = rcv_nxt
        edge = self.rcv_adv
        if seq + plen > edge:  # beyond the window: keep what fits, the FIN comes again later
            plen = max(0, edge - seq)
            payload = payload[:plen]
            fin = 0
        if seq == rcv_nxt:
            if plen:
                self._append(bytes(payload))
                rcv_nxt += plen
                if self._ooo.size:
                    more = self._ooo.pop_ready(rcv_nxt)
                    if more:
                        self._append(more)
                        rcv_nxt += len(more)
                        self._unacked_segs = 2  # a filled hole is acknowledged at once
                self.rcv_nxt = rcv_nxt
                if fin == 0 and self._ooo.fin_at is not None and self._ooo.fin_at == rcv_nxt:
                    fin = 1
            if fin:
                self._fin_arrived(now)
                return
            self._unacked_segs += 1
            if self._unacked_segs >= 2:  # every second segment (RFC 9293 §3.8.6.3), at the flush: one
                self.delack_at = -1.0    # ACK for a whole burst, or none when data goes back anyway
                self.events.pending[self] = None
            elif self.delack_at is None:
                self.delack_at = now + self.params.delayed_ack
        else:  # out of order: hold it, and send a duplicate ACK at once (RFC 5681 §4.2); with SACK,
            # a segment that only extends the newest block is acknowledged with the burst at the
            # flush (that ACK's first block says it), one that opens a block at once
            extends = self.sack_ok and seq == self._last_ooo_end and not fin
            if plen:
                self._ooo.add(seq, payload)  # copied into its run
                self._last_ooo = seq
                self._last_ooo_end = seq + plen
            if fin:
                self._ooo.fin_at = seq + plen
            if extends:
                self.delack_at = -1.0
                self.events.pending[self] = None
            else:
                self._send_ack()

    def _append(self, data: bytes) -> None:
        self._rbuf.append(data)
        self._rlen += len(data)
        self.events.dirty[self] = None

    def _window(self) -> int:
        """The window field to send, moving the advertised right edge (never left)."""
        free = self.rcv_buf - self._rlen - self._ooo.size
        right = self.rcv_nxt + (free if free > 0 else 0)
        ws = self.rcv_wscale
        if right <= self.rcv_adv:  # keep the edge we offered, rounded up to the scale's unit
            wnd = (self.rcv_adv - self.rcv_nxt + (1 << ws) - 1) >> ws
        else:
            wnd = (right - self.rcv_nxt) >> ws
        if wnd > 65535:
            wnd = 65535
        self.rcv_adv = self.rcv_nxt + (wnd << ws)
        return wnd

    def _ts_option(self) -> bytes:
        return b"" if self.ts is None else self.ts.option(self._now)

    def _sack_max(self) -> int:
        return wire.MAX_SACK_BLOCKS if self.ts is None else wire.MAX_SACK_BLOCKS_TS

    def _emit(self, seq: int, flags: int, payload) -> None:
        ts = self.ts
        if not payload and self.sack_ok and self._ooo.size:
            self.out.append(self._build(seq, self.rcv_nxt, flags, self._window(), payload,
                                        self._ts_option() + wire.sack_option(self._sack_blocks(), self._sack_max())))
        elif ts is not None:
            self.out.append(self._build(seq, self.rcv_nxt, flags, self._window(), payload, ts.option(self._now)))
        else:
            self.out.append(self._build(seq, self.rcv_nxt, flags, self._window(), payload))
        self.stats["segments_out"] += 1
        self._unacked_segs = 0
        self.delack_at = None

    def _sack_blocks(self) -> list[tuple[int, int]]:
        """Held blocks, the one with the most recent segment first (RFC 2018 §4)."""
        blocks = self._ooo.blocks()
        last = self._last_ooo
        first = [b for b in blocks if b[0] <= last < b[1]]
        return first + [b for b in blocks if b not in first]

    def _send_ack(self) -> None:
        self._emit(self.snd_nxt, ACK, b"")

    def _send_dsack(self, seq: int, plen: int) -> None:
        """ACK a segment that arrived again, naming it in the first SACK block (RFC 2883 D-SACK)."""
        blocks = [(seq, seq + plen)] + (self._sack_blocks()[:3] if self._ooo.size else [])
        self.out.append(self._build(self.snd_nxt, self.rcv_nxt, ACK, self._window(), b"",
                                    self._ts_option() + wire.sack_option(blocks, self._sack_max())))
        self._unacked_segs = 0
        self.delack_at = None

    def _ack_if_due(self) -> None:
        if self.delack_at is not None and self.delack_at < 0:
            self.delack_at = None
            if self.state in RECEIVE_STATES or self.state == CLOSE_WAIT:
                self._send_ack()
