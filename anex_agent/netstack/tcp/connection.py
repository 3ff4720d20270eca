"""One TCP connection (RFC 9293 §3.3.2 state machine), sans-I/O.

Its owner (:class:`anex_agent.netstack.stack.Stack`) feeds it segments
(:meth:`Connection.segment_arrived`) and timer ticks (:meth:`Connection.on_timer`), and the
user's side writes into a bounded send buffer (:meth:`Connection.write`, returns how much it
took: back-pressure) and reads from a bounded receive buffer (:meth:`Connection.readinto`:
the advertised window is what is left of it, so a reader that stops reading closes the
window). The connection never calls its owner: what happened goes into the
:class:`~anex_agent.netstack.tcp.events.Events` object it was made with (packets to send,
``pending`` for the next flush, ``dirty`` for the user's side, ``established`` and
``closed``; see :mod:`.events` for when the owner looks). Buffer growth comes from the
:class:`~anex_agent.netstack.tcp.autotune.MemoryBudget` it was made with, shared with the
owner's other connections, and goes back when it closes.

Split by concern, one object: this module keeps the state machine (opening, the checks of
every arriving segment, closing, timers); :mod:`.sender` the send path, :mod:`.receiver` the
receive path and what every segment says about it, :mod:`.recovery` loss detection and
repair; :mod:`.states` the names they share. Those three are mixins of :class:`Connection`,
not objects of their own: every segment reads and writes state of all three (an ACK moves
``snd_una``, ends a recovery, and carries a window), and one object with ``__slots__`` keeps
each of those an attribute of ``self``, as cheap as before the split; separate objects
would add an attribute hop to each access on the per-packet path.

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

from anex_agent.netstack.tcp import pacing
from anex_agent.netstack.tcp import segment as wire
from anex_agent.netstack.tcp.autotune import MemoryBudget, ReceiveTuner
from anex_agent.netstack.tcp.cubic import Cubic
from anex_agent.netstack.tcp.events import Events
from anex_agent.netstack.tcp.rack import Rack
from anex_agent.netstack.tcp.reassembly import Reassembly
from anex_agent.netstack.tcp.receiver import Receiver
from anex_agent.netstack.tcp.recovery import DUPTHRESH, Recovery
from anex_agent.netstack.tcp.rtt import RttEstimator
from anex_agent.netstack.tcp.scoreboard import Scoreboard
from anex_agent.netstack.tcp.segment import ACK, FIN, RST, SYN
from anex_agent.netstack.tcp.sender import Sender
from anex_agent.netstack.tcp.states import (
    CLOSE_WAIT,
    CLOSED,
    CLOSING,
    ESTABLISHED,
    FIN_WAIT_1,
    FIN_WAIT_2,
    HALF,
    LAST_ACK,
    M32,
    RECEIVE_STATES,
    REFUSED,
    RESET,
    SEND_STATES,
    STATE_NAMES,
    SYN_RECEIVED,
    SYN_SENT,
    TIME_WAIT,
    TIMED_OUT,
)
from anex_agent.netstack.tcp.timestamps import LENGTH as TS_LENGTH
from anex_agent.netstack.tcp.timestamps import Timestamps, expected_samples

OUR_WSCALE = 9  # 512-byte units: windows up to 32 MiB (receive buffers grow to TcpParams.receive_buffer_max)


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


class Connection(Sender, Receiver, Recovery):
    """See the module docstring. ``user`` is free for the adapter (its stream object)."""

    __slots__ = (
        "events", "budget", "key", "params", "out", "state", "error", "user", "passive_port", "_build",
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

    def __init__(self, events: Events, budget: MemoryBudget, key: tuple, builder: wire.Builder, params: TcpParams,
                 local_mss: int, iss: int, now: float) -> None:
        self.events = events
        self.budget = budget  # buffer growth, shared with the owner's other connections
        self.key = key
        self.params = params
        self.out = events.packets  # packets to send (appended to directly: the hot path)
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
        self._sched: float | None = None  # the owner's timer-heap bookkeeping
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

    # ------------------------------------------------------------------ user side (and sender.py, receiver.py)

    @property
    def state_name(self) -> str:
        return STATE_NAMES[self.state]

    @property
    def established(self) -> bool:
        """The handshake completed (at some point: a connection closed since stays established)."""
        return self.connected

    def _grow(self, want: int) -> int:
        """Take up to ``want`` bytes of buffer growth from the stack's budget; how much was granted."""
        got = self.budget.take(want)
        self._grown += got
        return got

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
        self.events.pending[self] = None

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
                    self._send_dsack(seq, plen)
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
        if rack is not None and self._sacked and self.state in SEND_STATES:
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
                    self.events.pending[self] = None
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
        if state in RECEIVE_STATES:
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
            self.events.pending[self] = None
        else:  # simultaneous open (§3.5, figure 7)
            self.state = SYN_RECEIVED
            self._resend_synack()

    def _resend_synack(self) -> None:
        wscale = OUR_WSCALE if self.rcv_wscale else None
        wnd = min(self.rcv_buf, 65535)
        self.out.append(self._build(self.iss, self.rcv_nxt, SYN | ACK, wnd, b"",
                                    wire.syn_options(self.local_mss, wscale, self.sack_ok, self._syn_ts(self._now))))
        self.rcv_adv = max(self.rcv_adv, self.rcv_nxt + wnd)

    def _resend_syn(self, now: float) -> None:
        """Our SYN (SYN-SENT) or SYN-ACK (SYN-RECEIVED) again, after a retransmission timeout."""
        if self.state == SYN_SENT:
            self.out.append(self._build(self.iss, 0, SYN, min(self.rcv_buf, 65535), b"",
                                        wire.syn_options(self.local_mss, OUR_WSCALE, True, self._syn_ts(now))))
        else:
            self._resend_synack()

    def _established(self, now: float) -> None:
        self.state = ESTABLISHED
        self.connected = True
        if not self.cwnd:
            self.cwnd = self.params.initial_window * self.mss
        self.events.dirty[self] = None
        self.events.established.append(self)

    # ------------------------------------------------------------------ closing

    def _fin_arrived(self, now: float) -> None:
        self.rcv_nxt += 1
        self._eof = True
        self.events.dirty[self] = None
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
        self.events.dirty[self] = None

    def _enter_closed(self, error: str | None) -> None:
        self.state = CLOSED
        if error is not None and self.error is None:
            self.error = error
        if error is not None:
            self._eof = True
        self.rto_at = self.delack_at = self.persist_at = self.tw_at = self.tlp_at = self.rack_at = self.pace_at = None
        if self._grown:
            self.budget.give(self._grown)
            self._grown = 0
            self.rcv_buf, self.snd_buf = self.params.receive_buffer, self.params.send_buffer
        self.events.dirty[self] = None
        self.events.closed.append(self)

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
            self.events.pending[self] = None  # the stack's flush after the timers sends on
        if self.rack_at is not None and now >= self.rack_at:
            self.rack_at = None
            if self.state in SEND_STATES and self._sacked:
                self._rack_detect(now)
        if self.tlp_at is not None and now >= self.tlp_at:
            self.tlp_at = None
            if self.state in SEND_STATES and self.snd_max > self.snd_una and not self.in_recovery:
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
