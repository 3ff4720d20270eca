"""The one retry delay of anex-agent: exponential backoff with equal jitter (pure: no clock, no sleep).

Every place that waits before trying again (a reconnect, a restarted task, a provider call, a
watch stream, a kubelet certificate request) takes its delay from a :class:`Backoff`; no other
module draws random delays of its own.

The policy, stated once: attempt ``n`` (0-based) has the ceiling
``d = min(cap, base * factor**n)``, and its delay is a random value in ``[d/2, d]``
("equal jitter"), so a fleet of nodes that lost the coordinator together does not come back
together, and no retry comes back at once (the delay is at least half the ceiling).
``jitter=False`` makes the delay ``d`` itself, for the waits a protocol fixes (the kubelet's
``CrashLoopBackOff``: 10 s, doubling up to 5 minutes).

``next_delay()`` returns the delay before the next attempt and counts it; ``reset()`` after a
success starts over from ``base``; ``delay(n)`` is the delay of attempt ``n`` without counting
(for callers that keep the count themselves, e.g. in a database row).

Waits a wire protocol defines with its own rules are not retries and stay with their protocol
core: TCP's retransmission and persist timers (RFC 6298, RFC 9293) and WireGuard's handshake
retransmission jitter (whitepaper §6.1).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    """Delays before attempts ``0, 1, 2, ...``: see the module docstring for the policy.

    ``rng`` draws the jitter (a seeded :class:`random.Random` makes it repeatable in tests;
    ``None``: a fresh one). ``attempts`` is how many delays :meth:`next_delay` has handed out
    since the last :meth:`reset`.
    """

    base: float = 1.0
    cap: float = 30.0
    factor: float = 2.0
    rng: random.Random | None = None
    attempts: int = 0
    jitter: bool = True
    _rng: random.Random = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1:
            raise ValueError(f"backoff needs base >= 0, cap >= 0 and factor >= 1, not "
                             f"base={self.base!r}, cap={self.cap!r}, factor={self.factor!r}")
        self._rng = self.rng if self.rng is not None else random.Random()

    def ceiling(self, attempt: int) -> float:
        """The longest delay of attempt ``attempt``: ``min(cap, base * factor**attempt)``."""
        return min(self.cap, self.base * self.factor ** min(max(attempt, 0), 32))

    def delay(self, attempt: int) -> float:
        """The delay before attempt ``attempt`` (0-based), in ``[ceiling/2, ceiling]`` (``ceiling`` without jitter)."""
        ceiling = self.ceiling(attempt)
        return self._rng.uniform(ceiling / 2, ceiling) if self.jitter else ceiling

    def next_delay(self) -> float:
        """The delay before the next attempt; counts it."""
        delay = self.delay(self.attempts)
        self.attempts += 1
        return delay

    def reset(self) -> None:
        """A success: the next delay is the first one again."""
        self.attempts = 0
