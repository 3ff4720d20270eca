"""Pacing (as Linux's TCP pacing): a window's segments spread over the round trip, not one burst.

Contract (sans-I/O: ``now`` is passed in): :class:`Pacer` is a token bucket filled at
:func:`rate` bytes per second, that is ``cwnd / srtt`` times 2 in slow start and 1.2 in
congestion avoidance (so pacing never holds the window back, it only smooths it), holding at
most :data:`BURST_TIME` seconds of it (and at least :data:`MIN_BURST` segments). The sender asks
:meth:`Pacer.available` before a flight, takes what it sends with :meth:`Pacer.spend`, and when
the bucket runs dry arms a timer at :meth:`Pacer.ready_at` for the next segment.

Why: a window sent in one burst overflows the first queue on the way (a router, or the
gateway's UDP socket, which a busy machine drains late), and a congestion control that reads
those drops as congestion halves a window the path could carry.
"""

from __future__ import annotations

BURST_TIME = 0.004  # seconds of the pacing rate sent back to back (a timer wake-up per 4 ms at most)
MIN_BURST = 16  # segments
MIN_GAP = 0.0005  # seconds: the shortest wait (timers are not finer, and floats must move on)


def rate(cwnd: int, srtt: float, slow_start: bool) -> float:
    """Bytes per second (``srtt`` > 0)."""
    return (2.0 if slow_start else 1.2) * cwnd / srtt


class Pacer:
    __slots__ = ("tokens", "last")

    def __init__(self) -> None:
        self.tokens: float | None = None  # None: full (nothing sent yet)
        self.last = 0.0

    def available(self, now: float, rate: float, mss: int) -> float:
        """Bytes that may go now."""
        depth = max(MIN_BURST * mss, rate * BURST_TIME)
        if self.tokens is None:
            tokens = depth
        else:
            tokens = self.tokens + (now - self.last) * rate
            if tokens > depth:
                tokens = depth
        self.tokens, self.last = tokens, now
        return tokens

    def spend(self, n: int) -> None:
        self.tokens -= n

    def ready_at(self, now: float, rate: float, need: int) -> float:
        """When ``need`` bytes will be available (at least :data:`MIN_GAP` from now)."""
        wait = (need - self.tokens) / rate
        return now + (wait if wait > MIN_GAP else MIN_GAP)
