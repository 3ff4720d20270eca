"""Sliding replay window for transport counters (whitepaper §5.4.6, RFC 6479).

The window remembers the highest counter accepted and, as a bitmap, which of the
``REPLAY_WINDOW - 1`` counters below it were seen. A counter is accepted once:

* above the highest: accepted, the window slides (a jump of a whole window or more
  clears the bitmap);
* within the window and not yet seen: accepted, marked;
* seen before, or older than the window, or >= REJECT_AFTER_MESSAGES: refused.

RFC 6479 keeps the bitmap in a ring of machine words to avoid shifting; a Python int
shifts whole words internally, so one arbitrary-precision integer does the same job.
Call :meth:`check` only AFTER the packet authenticated, so forged counters cannot move
the window.
"""

from __future__ import annotations

from anex_agent.wg.constants import REJECT_AFTER_MESSAGES, REPLAY_WINDOW

_MASK = (1 << REPLAY_WINDOW) - 1


class ReplayWindow:
    __slots__ = ("_highest", "_bitmap")

    def __init__(self) -> None:
        self._highest = -1
        self._bitmap = 0  # bit i set <=> counter (highest - i) was seen

    @property
    def highest(self) -> int:
        return self._highest

    def would_accept(self, counter: int) -> bool:
        """True when ``counter`` is fresh; does not record it."""
        if counter >= REJECT_AFTER_MESSAGES or counter < 0:
            return False
        if counter > self._highest:
            return True
        back = self._highest - counter
        return back < REPLAY_WINDOW and not (self._bitmap >> back) & 1

    def check(self, counter: int) -> bool:
        """Record ``counter`` and return True when it is fresh; return False for a replay or too-old counter."""
        if counter >= REJECT_AFTER_MESSAGES or counter < 0:
            return False
        if counter > self._highest:
            shift = counter - self._highest
            self._bitmap = ((self._bitmap << shift) & _MASK) | 1 if shift < REPLAY_WINDOW else 1
            self._highest = counter
            return True
        back = self._highest - counter
        if back >= REPLAY_WINDOW or (self._bitmap >> back) & 1:
            return False
        self._bitmap |= 1 << back
        return True
