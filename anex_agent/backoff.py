"""Exponential backoff with full jitter (pure: no clock, no sleep).

``Backoff.next_delay()`` returns how long to wait before the next attempt:
a random value in ``[base * factor**n / 2, base * factor**n]`` capped at ``cap``
("equal jitter"), so a fleet of nodes that lost the coordinator together does not
come back together. ``reset()`` after a success.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field


@dataclass
class Backoff:
    base: float = 1.0
    cap: float = 30.0
    factor: float = 2.0
    rng: random.Random = field(default_factory=random.Random)
    attempts: int = 0

    def next_delay(self) -> float:
        ceiling = min(self.cap, self.base * self.factor ** min(self.attempts, 32))
        self.attempts += 1
        return self.rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
