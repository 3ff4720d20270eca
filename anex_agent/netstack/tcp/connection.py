"""One TCP connection (RFC 9293 §3.3.2 state machine), sans-I/O.

The owning :class:`anex_agent.netstack.stack.Stack` feeds it segments
(:meth:`Connection.segment_arrived`) and timer ticks (:meth:`Connection.on_timer`), and
the user's side writes into a bounded send buffer (:meth:`Connection.write`, returns how
much it took: back-pressure) and reads from a bounded receive buffer
(:meth:`Connection.readinto`: the advertised window is what is left of it, so a reader
that stops reading closes the window). Packets go to the stack's output list; the
connection marks itself *dirty* in the stack when the user's side should look at it
again (readable, writable, connected, closed).

Sequence numbers are kept as unbounded integers ("absolute") and wrapped to 32 bits on
the wire: every comparison is a plain integer comparison (no modular arithmetic on the
hot path). Received numbers are unwrapped next to ``snd_una`` / ``rcv_nxt``.

What is implemented: active and passive open, simultaneous open and close, a short
TIME_WAIT (:attr:`TcpParams.time_wait`), RFC 5961 checks (RST only at exactly RCV.NXT,
challenge ACKs for in-window RSTs and SYNs, ACK range check), MSS clamped to the link
MTU, window scaling (RFC 7323 §2) and timestamps (RFC 7323 §3-4, :mod:`timestamps`: an RTT
sample from every ACK of new data), RFC 6298 retransmission timer with Karn's rule when there
are no timestamps, slow start (RFC 5681, counting whole stretch ACKs) and CUBIC congestion
avoidance (RFC 9438, :mod:`cubic`), pacing (:mod:`pacing`), fast retransmit and NewReno
recovery (RFC 6582), out-of-order reassembly, zero-window probes, keepalive, delayed ACKs
(every second full segment or after :attr:`TcpParams.delayed_ack`), SACK (RFC 2018: we send
blocks for held out-of-order data; as a sender we keep a scoreboard and, in recovery,
retransmit the holes below the highest SACKed byte one per arriving ACK instead of only the
head, a simplified RFC 6675), RACK (RFC 8985 §6, :mod:`rack`: time-based loss detection, so a
lost retransmission goes again after about an RTT instead of an RTO), D-SACK undo of
recoveries caused by reordering (RFC 2883/3708), early retransmit (RFC 5827), a tail loss probe
(RFC 8985 §7), send and receive buffers that grow with the bandwidth-delay product under the
stack's budget (:mod:`autotune`). Not implemented: PAWS (RFC 7323 §5), urgent data (the URG
flag is ignored), Nagle (writes are coalesced by the adapter instead, like TCP_NODELAY with
corking).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from anex_agent.netstack.tcp import pacing
from anex_agent.netstack.tcp import segment as wire
from anex_agent.netstack.tcp.autotune import ReceiveTuner, send_target
from anex_agent.netstack.tcp.cubic import Cubic
from anex_agent.netstack.tcp.rack import Rack
from anex_agent.netstack.tcp.reassembly import Reassembly
from anex_agent.netstack.tcp.rtt import RttEstimator
from anex_agent.netstack.tcp.scoreboard import Scoreboard
from anex_agent.netstack.tcp.timestamps import LENGTH as TS_LENGTH
from anex_agent.netstack.tcp.timestamps import Timestamps, expected_samples

if TYPE_CHECKING:
    from anex_agent.netstack.stack import Stack

CLOSED, SYN_SENT, SYN_RECEIVED, ESTABLISHED, FIN_WAIT_1, FIN_WAIT_2, CLOSE_WAIT, CLOSING, LAST_ACK, TIME_WAIT = range(10)
STATE_NAMES = ("CLOSED", "SYN-SENT", "SYN-RECEIVED", "ESTABLISHED", "FIN-WAIT-1", "FIN-WAIT-2", "CLOSE-WAIT",
               "CLOSING", "LAST-ACK", "TIME-WAIT")
_SEND_STATES = frozenset((ESTABLISHED, CLOSE_WAIT, FIN_WAIT_1, CLOSING, LAST_ACK))
_RECEIVE_STATES = frozenset((ESTABLISHED, FIN_WAIT_1, FIN_WAIT_2))
FIN, SYN, RST, PSH, ACK = wire.FIN, wire.SYN, wire.RST, wire.PSH, wire.ACK
M32 = 0xFFFFFFFF
HALF = 1 << 31
OUR_WSCALE = 9  # 512-byte units: windows up to 32 MiB (receive buffers grow to TcpParams.receive_buffer_max)
DUPTHRESH = 3  # RFC 5681 §3.2
MAX_DUPTHRESH = 9  # higher thresholds turn real losses into timeouts when windows are small
COMPACT_AT = 64 * 1024  # acknowledged bytes kept at the send buffer's head before it is compacted

# Errors a connection ends with (``Connection.error``); the adapter maps them to exceptions.
REFUSED = "refused"
RESET = "reset"
TIMED_OUT = "timed out"


@dataclass(frozen=True)
class TcpParams:
    """Tunables. Buffers start at ``send_buffer`` and ``receive_buffer`` and grow with the
    bandwidth-delay product (:mod:`autotune`) up to the ``_max`` sizes while the stack's
    ``buffer_budget`` (growth above the base sizes, all connections together) lasts: a
    connection holds at most ``send_buffer_max`` + ``receive_buffer_max``, the stack at most
    the base sizes per connection plus ``buffer_budget``."""

    send_buffer: int = 512 * 1024
    receive_buffer: int = 512 * 1024
    send_buffer_max: int = 16 * 1024 * 1024
    receive_buffer_max: int = 16 * 1024 * 1024
    buffer_budget: int = 64 * 1024 * 1024
    cubic: bool = True  # RFC 9438 congestion avoidance (False: RFC 5681's additive increase)
    rack: bool = True  # RFC 8985 loss detection, with SACK
    timestamps: bool = True  # RFC 7323 §3: offered on SYNs; RTT sampled from every ACK's echo
    pacing: bool = True  # spread each window over the round trip (:mod:`pacing`)
    time_wait: float = 2.0  # short: RFC 9293's 2*MSL is minutes; our ISNs follow RFC 6528 and ports are random
    delayed_ack: float = 0.04  # RFC 9293 §3.8.6.3 allows up to 0.5 s
    syn_retries: int = 6  # 1+2+4+8+16+32 s before a connect gives up
    data_retries: int = 15  # RTO expiries in a row before the connection is reset
    keepalive_idle: float | None = 60.0  # RFC 9293 §3.8.4 (off when None)
    keepalive_interval: float = 10.0
    keepalive_count: int = 6
    initial_window: int = 10  # segments, RFC 6928
    persist_min: float = 0.2
    persist_max: float = 60.0


class Connection:
    """See the module docstring. ``user`` is free for the adapter (its stream object)."""

    __slots__ = (
        "stack", "key", "params", "out", "state", "error", "user", "passive_port", "_build",
        "iss", "snd_una", "snd_nxt", "snd_max", "snd_wnd", "max_snd_wnd", "snd_wl1", "snd_wl2", "snd_wscale",
        "irs", "rcv_nxt", "rcv_adv", "rcv_wscale", "mss", "local_mss",
        "_sbuf", "_soff", "_buf_seq", "_fin_queued", "_fin_seq", "_fin_acked",
        "_rbuf", "_rlen", "_eof", "_ooo",
        "rtt", "_rtt_seq", "_rtt_time", "_retries", "rto_at", "delack_at", "persist_at", "_persist_backoff",
        "tw_at", "_last_rx", "_ka_probes", "_unacked_segs",
        "connected", "cwnd", "ssthresh", "dupacks", "in_recovery", "recover", "_sched", "stats",
        "sack_ok", "_last_ooo", "_sacked", "_rexmit_hi", "tlp_at", "_tlp_high", "dupthresh", "_undo_cwnd", "_undo_ssthresh", "_undo_retrans",
        "rcv_buf", "snd_buf", "_grown", "_rtuner", "cc", "rack", "rack_at", "ts", "_now", "pacer", "pace_at", "_last_ooo_end",
    )

    def __init__(self, stack: Stack, key: tuple, builder: wire.Builder, params: TcpParams, local_mss: int,
                 iss: int, now: float) -> None:
        self.stack = stack
        self.key = key
        self.params = params
        self.out = stack.out  # packets to send (the stack's list)
        self._build = builder.build
        self.state = CLOSED
        self.error: str | None = None
        self.user = None
        self.passive_port: int | None = None
        self.iss = iss
        self.snd_una = self.snd_nxt = self.snd_max = iss
        self.snd_wnd = 0
        self.max_snd_wnd = 0
        self.snd_wl1 = self.snd_wl2 = 0
        self.snd_wscale = 0
        self.irs = 0
        self.rcv_nxt = 0
        self.rcv_adv = 0  # right edge of the window we advertised (never moved left, RFC 9293 §3.8.6.2.2)
        self.rcv_wscale = 0
        self.local_mss = local_mss
        self.mss = min(local_mss, wire.DEFAULT_MSS)
        self._sbuf = bytearray()
        self._soff = 0  # index in _sbuf of the first unacknowledged data byte
        self._buf_seq = iss + 1  # its sequence number
        self._fin_queued = False
        self._fin_seq: int | None = None  # sequence number our FIN occupies (once queued and all data is in)
        self._fin_acked = False
        self._rbuf: list[bytes] = []
        self._rlen = 0
        self._eof = False
        self._ooo = Reassembly()
        self.rtt = RttEstimator()
        self._rtt_seq: int | None = None
        self._rtt_time = 0.0
        self._retries = 0
        self.rto_at: float | None = None
        self.delack_at: float | None = None
        self.persist_at: float | None = None
        self._persist_backoff = params.persist_min
        self.tw_at: float | None = None
        self._last_rx = now
        self._ka_probes = 0
        self._unacked_segs = 0
        self.connected = False
        self.cwnd = 0
        self.ssthresh = 1 << 30
        self.dupacks = 0
        self.in_recovery = False
        self.recover = iss
        self._sched: float | None = None  # the stack's timer-heap bookkeeping
        self.sack_ok = False  # both sides sent SACK-permitted
        self._last_ooo = 0  # start of the most recent out-of-order segment (its block goes first)
        self._last_ooo_end = 0  # and its end
        self._sacked = Scoreboard()  # what the receiver SACKed above SND.UNA
        self._rexmit_hi = 0  # in recovery: retransmitted up to here
        self.tlp_at: float | None = None  # tail loss probe (RFC 8985 §7): a lost tail costs ~2 RTT, not an RTO
        self._tlp_high: int | None = None  # SND.MAX when the probe went out, until it is acknowledged
        self.dupthresh = DUPTHRESH  # raised when D-SACKs show that reordering, not loss, caused a recovery
        self._undo_cwnd = 0  # cwnd/ssthresh before the last fast recovery, and its retransmissions not yet
        self._undo_ssthresh = 0  # reported as duplicates (RFC 2883 D-SACK); at 0 the recovery was spurious
        self._undo_retrans = 0
        self.stats = {"retransmits": 0, "fast_retransmits": 0, "timeouts": 0, "segments_out": 0, "segments_in": 0}
        self.rcv_buf = params.receive_buffer  # the sizes now (autotuned), and the bytes taken for
        self.snd_buf = params.send_buffer  # their growth from the stack's budget
        self._grown = 0
        self._rtuner = ReceiveTuner(params.receive_buffer_max) if params.receive_buffer_max > params.receive_buffer else None
        self.cc = Cubic(self.mss) if params.cubic else None
        self.rack: Rack | None = None  # once both sides agreed on SACK
        self.rack_at: float | None = None  # RACK's reordering timer
        self.ts: Timestamps | None = None  # once both sides sent the TSopt
        self._now = now  # the time of the last input (timer, segment, flush): TSval's clock
        self.pacer = pacing.Pacer() if params.pacing else None
        self.pace_at: float | None = None  # the pacer holds the next segment until then

    def __repr__(self) -> str:
        return f"<tcp {self.key[1]}<->{self.key[2]} {STATE_NAMES[self.state]}>"

    # ------------------------------------------------------------------ user side

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    @property
    def established(self) -> bool:
        """The handshake completed (at some point: a connection closed since stays established)."""
        return self.connected

    @property
    def send_space(self) -> int:
        """Bytes :meth:`write` takes now (0 after :meth:`close` or an error)."""
        if self._fin_queued or self.error is not None or self.state == CLOSED:
            return 0
        return max(0, self.snd_buf - (len(self._sbuf) - self._soff))

    @property
    def unsent_or_unacked(self) -> int:
        return len(self._sbuf) - self._soff

    @property
    def readable(self) -> int:
        """Bytes buffered for :meth:`readinto`."""
        return self._rlen

    @property
    def at_eof(self) -> bool:
        """The peer's FIN arrived and every byte before it was read."""
        return self._eof and self._rlen == 0

    def write(self, data) -> int:
        """Queue as much of ``data`` as the send buffer takes; return how much. Send with the stack's flush."""
        n = min(len(data), self.send_space)
        if n:
            self._sbuf += data[:n] if n < len(data) else data
            self.stack.pending[self] = None
        return n

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
            if self.state in _RECEIVE_STATES:
                free = self.rcv_buf - self._rlen - self._ooo.size
                if self.rcv_nxt + free - self.rcv_adv >= max(2 * self.local_mss, self.rcv_buf // 4):
                    self.delack_at = -1.0  # "now": the flush sends it
                    self.stack.pending[self] = None
        return got

    def _grow(self, want: int) -> int:
        """Take up to ``want`` bytes of buffer growth from the stack's budget; how much was granted."""
        got = self.stack.budget.take(want)
        self._grown += got
        return got

    def read(self, n: int = 65536) -> bytes:
        buf = bytearray(min(n, self._rlen))
        got = self.readinto(buf)
        return bytes(buf[:got])

    def close(self) -> None:
        """Send FIN after the queued data (half-close: reading goes on). Idempotent."""
        if self._fin_queued or self.state == CLOSED:
            return
        self._fin_queued = True
        if self.state in (SYN_SENT,):
            self._enter_closed(None)
            return
        if self.state in (ESTABLISHED, SYN_RECEIVED):
            self.state = FIN_WAIT_1
        elif self.state == CLOSE_WAIT:
            self.state = LAST_ACK
        self.stack.pending[self] = None

    def abort(self) -> None:
        """Send RST and forget the connection (RFC 9293 §3.10.5 ABORT)."""
        if self.state in (SYN_RECEIVED, ESTABLISHED, FIN_WAIT_1, FIN_WAIT_2, CLOSE_WAIT):
            self.out.append(self._build(self.snd_nxt, 0, RST, 0))
        if self.state != CLOSED:
            self._enter_closed(self.error or RESET)

    # ------------------------------------------------------------------ opening

    def open_active(self, now: float) -> None:
        self.state = SYN_SENT
        self._send_syn(now)

    def open_passive(self, seg: wire.Segment, now: float) -> None:
        """A SYN for a listener: answer SYN-ACK (RFC 9293 §3.10.7.2)."""
        self.state = SYN_RECEIVED
        self._take_syn(seg)
        self._send_syn(now)

    def _take_syn(self, seg: wire.Segment) -> None:
        self.irs = seg.seq
        self.rcv_nxt = seg.seq + 1
        self.mss = max(64, min(self.local_mss, seg.mss if seg.mss is not None else wire.DEFAULT_MSS))
        if seg.wscale is not None:  # RFC 7323 §2.2: scale only when both sides offered it
            self.snd_wscale = seg.wscale
            self.rcv_wscale = OUR_WSCALE
        else:
            self.snd_wscale = self.rcv_wscale = 0
        self.sack_ok = seg.sack_ok
        if seg.ts_val is not None and self.params.timestamps:  # RFC 7323 §3.2: both sides sent it
            self.ts = Timestamps(self.iss, seg.ts_val)
            self.mss -= TS_LENGTH  # every segment carries the option: the payload is that much smaller
        if self.cc is not None:
            self.cc.mss = self.mss
        if seg.sack_ok and self.params.rack:
            self.rack = Rack()
        self.snd_wnd = seg.wnd  # the window in a SYN is never scaled (RFC 7323 §2.2)
        self.snd_wl1 = seg.seq
        self.cwnd = self.params.initial_window * self.mss

    def _send_syn(self, now: float) -> None:
        active = self.state == SYN_SENT
        wscale = OUR_WSCALE if active or self.rcv_wscale else None
        opts = wire.syn_options(self.local_mss, wscale, active or self.sack_ok, self._syn_ts(now))
        wnd = min(self.rcv_buf, 65535)
        if active:
            self.out.append(self._build(self.iss, 0, SYN, wnd, b"", opts))
        else:
            self.out.append(self._build(self.iss, self.rcv_nxt, SYN | ACK, wnd, b"", opts))
            self.rcv_adv = self.rcv_nxt + wnd
        self.snd_nxt = self.snd_max = self.iss + 1
        self.rto_at = now + self.rtt.rto
        if self._retries == 0:
            self._rtt_seq, self._rtt_time = self.iss + 1, now

    def _syn_ts(self, now: float) -> bytes:
        """The TSopt for a SYN (ours offered) or SYN-ACK (when the peer's SYN had one)."""
        if self.ts is not None:
            return self.ts.option(now)
        if self.state == SYN_SENT and self.params.timestamps:
            return Timestamps(self.iss, 0).option(now)
        return b""

    # ------------------------------------------------------------------ input

    def segment_arrived(self, seg: wire.Segment, now: float) -> None:
        """Process one segment (RFC 9293 §3.10.7)."""
        self.stats["segments_in"] += 1
        self._now = now
        flags = seg.flags
        if self.state == SYN_SENT:
            self._syn_sent(seg, now)
            return
        if self.state == CLOSED:
            return
        self._last_rx = now
        self._ka_probes = 0
        seq = self.rcv_nxt + ((seg.seq - self.rcv_nxt + HALF) & M32) - HALF
        payload = seg.payload
        plen = len(payload)
        # 1. acceptability (§3.10.7.4 first check), against the window we advertised
        wnd = self.rcv_adv - self.rcv_nxt
        if plen == 0:
            ok = seq == self.rcv_nxt or (self.rcv_nxt <= seq < self.rcv_nxt + wnd)
        else:
            ok = (self.rcv_nxt <= seq < self.rcv_nxt + wnd) or (self.rcv_nxt <= seq + plen - 1 < self.rcv_nxt + wnd)
        if not ok and not (flags & SYN and self.state == SYN_RECEIVED and seg.seq == self.irs):
            if not flags & RST:
                if self.state == TIME_WAIT and flags & FIN:
                    self.tw_at = now + self.params.time_wait
                if plen and self.sack_ok and seq + plen <= self.rcv_nxt:  # a duplicate: say so (RFC 2883 D-SACK)
                    blocks = [(seq, seq + plen)] + (self._sack_blocks()[:3] if self._ooo.size else [])
                    self.out.append(self._build(self.snd_nxt, self.rcv_nxt, ACK, self._window(), b"",
                                                self._ts_option() + wire.sack_option(blocks, self._sack_max())))
                    self._unacked_segs = 0
                    self.delack_at = None
                else:
                    self._send_ack()
            return
        # 2. RST (RFC 5961 §3.2): only at exactly RCV.NXT; elsewhere in the window, a challenge ACK
        if flags & RST:
            if seq == self.rcv_nxt:
                self._enter_closed(None if self.state in (CLOSING, LAST_ACK, TIME_WAIT) else
                                   (REFUSED if self.state == SYN_RECEIVED and self.passive_port is None else RESET))
            else:
                self._send_ack()
            return
        # 4. SYN (RFC 5961 §4): a retransmitted SYN in SYN-RECEIVED gets our SYN-ACK again, others a challenge ACK;
        #    a SYN-ACK in SYN-RECEIVED (simultaneous open, §3.5 figure 7) acknowledges our SYN: go on with its ACK
        if flags & SYN:
            if self.state == SYN_RECEIVED and seg.seq == self.irs:
                if not flags & ACK:
                    self._resend_synack()
                    return
                seq = self.rcv_nxt
            else:
                self._send_ack()
                return
        ts = self.ts
        if ts is not None and seg.ts_val is not None:
            ts.received(seg.ts_val, seq, self.rcv_nxt)
        # 5. ACK
        if not flags & ACK:
            return
        ack = self.snd_una + ((seg.ack - self.snd_una + HALF) & M32) - HALF
        if self.state == SYN_RECEIVED:
            if self.snd_una < ack <= self.snd_max:
                self.snd_una = ack
                self._established(now)
                self.snd_wnd = seg.wnd << self.snd_wscale
                self.max_snd_wnd = max(self.max_snd_wnd, self.snd_wnd)
                self.snd_wl1, self.snd_wl2 = seq, ack
                self._sample_rtt(ack, now)
                if self._fin_queued:
                    self.state = FIN_WAIT_1
                self.rto_at = None
                self._retries = 0
            else:
                self.out.append(self._build(ack, 0, RST, 0))
                return
        if ack > self.snd_max:  # acknowledges something never sent: ACK back, drop (§3.10.7.4)
            self._send_ack()
            return
        if ack < self.snd_una - max(self.max_snd_wnd, 65535):  # RFC 5961 §5.2: too old
            self._send_ack()
            return
        new_wnd = seg.wnd << self.snd_wscale
        rack = self.rack
        if seg.sack is not None and self.sack_ok:
            self._take_sack(seg.sack, ack)
            if rack is not None:  # the newest block first (RFC 2018 §4): the latest delivery
                una = self.snd_una
                rack.delivered(una + ((seg.sack[0][1] - una + HALF) & M32) - HALF, now)
        if ack > self.snd_una:
            if rack is not None:
                rack.delivered(ack, now)
            if ts is not None and seg.ts_val is not None:  # RFC 7323 §4.1: every ACK of new data
                r = ts.rtt(seg.ts_ecr, now)
                if r is not None:
                    self.rtt.sample(r, expected_samples(self.snd_max - self.snd_una, self.mss))
            self._on_ack(ack, now)
        elif ack == self.snd_una and self.snd_max > self.snd_una and (
                (seg.sack is not None and self.sack_ok)  # SACK information counts whatever the window did
                or (plen == 0 and not flags & FIN and new_wnd == self.snd_wnd)):
            self._on_dupack(now)
        if rack is not None and self._sacked and self.state in _SEND_STATES:
            self._rack_detect(now)
        if self.snd_wl1 < seq or (self.snd_wl1 == seq and self.snd_wl2 <= ack):
            opened = new_wnd > self.snd_wnd
            self.snd_wnd = new_wnd
            self.snd_wl1, self.snd_wl2 = seq, ack
            if new_wnd > self.max_snd_wnd:
                self.max_snd_wnd = new_wnd
            if opened or new_wnd:
                self.persist_at = None
                self._persist_backoff = self.params.persist_min
                if opened:
                    self.stack.pending[self] = None
        state = self.state
        if self._fin_acked:
            if state == FIN_WAIT_1:
                self.state = state = FIN_WAIT_2
            elif state == CLOSING:
                self._enter_time_wait(now)
                return
            elif state == LAST_ACK:
                self._enter_closed(None)
                return
        # 7. segment text
        fin = flags & FIN
        if state in _RECEIVE_STATES:
            if plen or fin:
                self._receive_text(seq, payload, plen, fin, now)
        elif state == TIME_WAIT and fin:
            self._send_ack()
            self.tw_at = now + self.params.time_wait

    def _syn_sent(self, seg: wire.Segment, now: float) -> None:
        """§3.10.7.3."""
        flags = seg.flags
        ack = None
        if flags & ACK:
            ack = self.snd_una + ((seg.ack - self.snd_una + HALF) & M32) - HALF
            if ack <= self.iss or ack > self.snd_max:
                if not flags & RST:
                    self.out.append(self._build(ack, 0, RST, 0))
                return
        if flags & RST:
            if ack is not None:  # RFC 5961 §3.2: a RST in SYN-SENT must acknowledge our SYN
                self._enter_closed(REFUSED)
            return
        if not flags & SYN:
            return
        self._take_syn(seg)
        if ack is not None:
            self.snd_una = ack
            self._sample_rtt(ack, now)
            self.rto_at = None
            self._retries = 0
            self.snd_wl2 = ack
            self._established(now)
            self._send_ack()
            if self._fin_queued:
                self.state = FIN_WAIT_1
            self.stack.pending[self] = None
        else:  # simultaneous open (§3.5, figure 7)
            self.state = SYN_RECEIVED
            self._resend_synack()

    def _resend_synack(self) -> None:
        wscale = OUR_WSCALE if self.rcv_wscale else None
        wnd = min(self.rcv_buf, 65535)
        self.out.append(self._build(self.iss, self.rcv_nxt, SYN | ACK, wnd, b"",
                                    wire.syn_options(self.local_mss, wscale, self.sack_ok, self._syn_ts(self._now))))
        self.rcv_adv = max(self.rcv_adv, self.rcv_nxt + wnd)

    def _established(self, now: float) -> None:
        self.state = ESTABLISHED
        self.connected = True
        if not self.cwnd:
            self.cwnd = self.params.initial_window * self.mss
        self.stack.established(self)

    def _sample_rtt(self, ack: int, now: float) -> None:
        """One timed segment per round trip (RFC 6298 with Karn), when there are no timestamps."""
        if self._rtt_seq is not None and ack >= self._rtt_seq and (self.ts is None or self.rtt.srtt is None):
            self.rtt.sample(now - self._rtt_time)
            self._rtt_seq = None

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
            self.stack.dirty[self] = None  # room to write
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
        mss = self.mss
        if self.in_recovery:
            if ack >= self.recover:  # full acknowledgement: leave recovery (RFC 6582 §3.2 step 3, option 2:
                self.cwnd = self.ssthresh  # a flight that drained in recovery must not collapse cwnd to 2 segments)
                self.in_recovery = False
                self.dupacks = 0
                if self.rack is not None:
                    self.rack.recovery_done()
            else:  # partial acknowledgement: the next hole was lost too (with RACK: when it says so,
                # since a paced flight may still be on its way)
                if not self._retransmit_hole(now) and ack >= self._rexmit_hi and self.rack is None:
                    self._retransmit_head(now)
                self.cwnd = max(self.cwnd - acked + mss, mss)
                self.rto_at = now + self.rtt.rto
        else:
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
        self.stack.pending[self] = None

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
        self.stack.pending[self] = None  # SACKed data left the network: new data may go (RFC 3042, 6675)

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
        self.stack.pending[self] = None

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
                self.stack.pending[self] = None
            elif self.delack_at is None:
                self.delack_at = now + self.params.delayed_ack
        else:  # out of order: hold it, and send a duplicate ACK at once (RFC 5681 §4.2); with SACK,
            # a segment that only extends the newest block is acknowledged with the burst at the
            # flush (that ACK's first block says it), one that opens a block at once
            extends = self.sack_ok and seq == self._last_ooo_end and not fin
            if plen:
                self._ooo.add(seq, bytes(payload))
                self._last_ooo = seq
                self._last_ooo_end = seq + plen
            if fin:
                self._ooo.fin_at = seq + plen
            if extends:
                self.delack_at = -1.0
                self.stack.pending[self] = None
            else:
                self._send_ack()

    def _append(self, data: bytes) -> None:
        self._rbuf.append(data)
        self._rlen += len(data)
        self.stack.dirty[self] = None

    def _fin_arrived(self, now: float) -> None:
        self.rcv_nxt += 1
        self._eof = True
        self.stack.dirty[self] = None
        self._send_ack()
        if self.state == ESTABLISHED:
            self.state = CLOSE_WAIT
        elif self.state == FIN_WAIT_1:
            if self._fin_acked:
                self._enter_time_wait(now)
            else:
                self.state = CLOSING  # simultaneous close (§3.6, figure 13)
        elif self.state == FIN_WAIT_2:
            self._enter_time_wait(now)

    def _enter_time_wait(self, now: float) -> None:
        self.state = TIME_WAIT
        self.rto_at = self.delack_at = self.persist_at = self.tlp_at = self.rack_at = self.pace_at = None
        self.tw_at = now + self.params.time_wait
        self.stack.dirty[self] = None

    def _enter_closed(self, error: str | None) -> None:
        self.state = CLOSED
        if error is not None and self.error is None:
            self.error = error
        if error is not None:
            self._eof = True
        self.rto_at = self.delack_at = self.persist_at = self.tw_at = self.tlp_at = self.rack_at = self.pace_at = None
        if self._grown:
            self.stack.budget.give(self._grown)
            self._grown = 0
            self.rcv_buf, self.snd_buf = self.params.receive_buffer, self.params.send_buffer
        self.stack.closed(self)

    # ------------------------------------------------------------------ output

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

    def output(self, now: float) -> None:
        """Send what the windows allow, a due ACK, a FIN (the stack calls this on flush)."""
        self._now = now
        if self.state not in _SEND_STATES:
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

    def _ack_if_due(self) -> None:
        if self.delack_at is not None and self.delack_at < 0:
            self.delack_at = None
            if self.state in _RECEIVE_STATES or self.state == CLOSE_WAIT:
                self._send_ack()

    # ------------------------------------------------------------------ timers

    def deadline(self) -> float | None:
        """The earliest time :meth:`on_timer` has something to do (None: nothing scheduled)."""
        best = None
        for t in (self.rto_at, self.delack_at, self.persist_at, self.tw_at, self.tlp_at, self.rack_at, self.pace_at):
            if t is not None and (best is None or t < best):
                best = t
        ka = self.params.keepalive_idle
        if ka is not None and self.state in (ESTABLISHED, CLOSE_WAIT) and self.snd_max == self.snd_una:
            t = self._last_rx + ka + self._ka_probes * self.params.keepalive_interval
            if best is None or t < best:
                best = t
        return best

    def on_timer(self, now: float) -> None:
        p = self.params
        self._now = now
        if self.tw_at is not None and now >= self.tw_at:
            self._enter_closed(None)
            return
        if self.rto_at is not None and now >= self.rto_at:
            self._on_rto(now)
            if self.state == CLOSED:
                return
        if self.pace_at is not None and now >= self.pace_at:
            self.pace_at = None
            self.stack.pending[self] = None  # the stack's flush after the timers sends on
        if self.rack_at is not None and now >= self.rack_at:
            self.rack_at = None
            if self.state in _SEND_STATES and self._sacked:
                self._rack_detect(now)
        if self.tlp_at is not None and now >= self.tlp_at:
            self.tlp_at = None
            if self.state in _SEND_STATES and self.snd_max > self.snd_una and not self.in_recovery:
                self._send_tlp(now)
        if self.delack_at is not None and now >= self.delack_at:
            self._send_ack()
        if self.persist_at is not None and now >= self.persist_at:
            self.persist_at = None
            if self.snd_wnd == 0 and self.unsent_or_unacked:
                self.out.append(self._build(self.snd_una - 1, self.rcv_nxt, ACK, self._window(), b"",
                                            self._ts_option()))  # elicits an ACK
                self._persist_backoff = min(p.persist_max, self._persist_backoff * 2)
                self.persist_at = now + self._persist_backoff
        if p.keepalive_idle is not None and self.state in (ESTABLISHED, CLOSE_WAIT) and self.snd_max == self.snd_una:
            if now >= self._last_rx + p.keepalive_idle + self._ka_probes * p.keepalive_interval:
                if self._ka_probes >= p.keepalive_count:
                    self.abort_with(TIMED_OUT)
                    return
                self._ka_probes += 1
                self.out.append(self._build(self.snd_una - 1, self.rcv_nxt, ACK, self._window(), b"", self._ts_option()))

    def abort_with(self, error: str) -> None:
        self.error = error
        self.abort()

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
            if self.state == SYN_SENT:
                self.out.append(self._build(self.iss, 0, SYN, min(self.rcv_buf, 65535), b"",
                                            wire.syn_options(self.local_mss, OUR_WSCALE, True, self._syn_ts(now))))
            else:
                self._resend_synack()
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
