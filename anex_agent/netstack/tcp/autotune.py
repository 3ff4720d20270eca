"""Buffers that grow with the bandwidth-delay product, under one memory bound for the whole stack.

Contract (sans-I/O: ``now`` and the RTT are passed in):

* :class:`MemoryBudget` is shared by every connection of a stack: the bytes by which buffers
  may grow above their base sizes, all connections together. :meth:`MemoryBudget.take` grants
  at most what is left, :meth:`MemoryBudget.give` returns it (a connection returns all it took
  when it closes), so the agent's TCP buffers stay under ``base * connections + total``.
* :class:`ReceiveTuner` is the receiver's dynamic right-sizing (as Linux's
  ``tcp_rcv_space_adjust``): once per RTT it compares the bytes the application read during
  that RTT with the buffer; when the reader kept up with more than half of it, the buffer grows
  to twice the bytes per RTT plus :data:`STEP` (so a sender in slow start is not held back the
  next round, and a paced flight that fills a little less than the window still grows it), up
  to ``maximum``. It never shrinks (the advertised window never moves left).
* :func:`send_target` is the sender's: twice the congestion window (a window in flight and one
  being filled), between ``base`` and ``maximum``.

The receiver's buffer is looked at once per RTT, the sender's when cwnd passes half of it: the
budget is not touched per segment.
"""

from __future__ import annotations

STEP = 64 * 1024


class MemoryBudget:
    """Bytes of buffer growth left to all the connections of one stack together."""

    __slots__ = ("total", "used")

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, want: int) -> int:
        """Grant up to ``want`` bytes (0 when the budget is spent); the caller gives them back later."""
        grant = min(want, self.total - self.used)
        if grant <= 0:
            return 0
        self.used += grant
        return grant

    def give(self, n: int) -> None:
        self.used -= n


class ReceiveTuner:
    """Dynamic right-sizing of one connection's receive buffer (see the module docstring)."""

    __slots__ = ("maximum", "copied", "since")

    def __init__(self, maximum: int) -> None:
        self.maximum = maximum
        self.copied = 0  # bytes read since ``since``
        self.since: float | None = None

    def on_read(self, nbytes: int, now: float, rtt: float | None, current: int) -> int:
        """Count ``nbytes`` read at ``now``; the wanted buffer size (``current`` when no change)."""
        if rtt is None:
            return current
        if self.since is None:
            self.since = now
            self.copied = nbytes
            return current
        self.copied += nbytes
        if now - self.since < rtt:
            return current
        copied, self.copied, self.since = self.copied, 0, now
        if 2 * copied <= current:  # the reader used at most half the buffer in an RTT: big enough
            return current
        want = min(self.maximum, 2 * copied + STEP)
        return want if want > current else current


def send_target(cwnd: int, base: int, maximum: int) -> int:
    """The send buffer for a congestion window of ``cwnd`` bytes."""
    want = 2 * cwnd
    if want < base:
        return base
    return want if want < maximum else maximum
