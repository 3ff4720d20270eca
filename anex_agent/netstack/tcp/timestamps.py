"""TCP timestamps (RFC 7323 §3-4), sans-I/O: ``now`` (seconds) is passed in.

Contract: a connection that both sides opened with the TSopt keeps one :class:`Timestamps`.
:meth:`Timestamps.option` is the 12-byte option for every non-RST segment we send (TSval: a
millisecond clock with a per-connection random offset, RFC 7323 §7.1, so it reveals no uptime;
TSecr: TS.Recent). :meth:`Timestamps.received` applies §4.3's rule for TS.Recent (only from a
segment at or below the left edge of the window, so an out-of-order segment cannot move it).
:meth:`Timestamps.rtt` turns the TSecr of an ACK that acknowledged new data into an RTT sample
(§4.1), or None when it is not plausible; :func:`expected_samples` is Appendix G's weight for
the RFC 6298 smoothing when every ACK brings a sample. PAWS (§5) is not done: our sequence
numbers are kept unwrapped, and WireGuard's replay window already discards old duplicates.
"""

from __future__ import annotations

import struct

M32 = 0xFFFFFFFF
HALF = 1 << 31
OPTION = struct.Struct("!BBBBII")  # NOP NOP kind=8 length=10 TSval TSecr
LENGTH = 12
MAX_RTT = 120.0  # seconds: an echo older than this is not a sample


class Timestamps:
    __slots__ = ("offset", "recent")

    def __init__(self, offset: int, recent: int) -> None:
        self.offset = offset & M32
        self.recent = recent  # TS.Recent: the peer's TSval to echo

    def value(self, now: float) -> int:
        return (int(now * 1000) + self.offset) & M32

    def option(self, now: float) -> bytes:
        return OPTION.pack(1, 1, 8, 10, (int(now * 1000) + self.offset) & M32, self.recent)

    def received(self, ts_val: int, seq: int, rcv_nxt: int) -> None:
        """A segment at ``seq`` (unwrapped) carried ``ts_val``: update TS.Recent (§4.3)."""
        if seq <= rcv_nxt and ((ts_val - self.recent) & M32) < HALF:
            self.recent = ts_val

    def rtt(self, ts_ecr: int, now: float) -> float | None:
        """The RTT a TSecr we sent shows (§4.1), in seconds."""
        r = ((int(now * 1000) + self.offset - ts_ecr) & M32) / 1000
        return r if r <= MAX_RTT else None


def expected_samples(flight: int, mss: int) -> int:
    """RFC 7323 Appendix G: samples per RTT (one ACK per two segments in flight), at least 1."""
    return max(1, -(-flight // (2 * mss)))
