"""Per-source rate limit for handshake messages while under load (whitepaper §5.3; see :mod:`anex_agent.wg.budget`).

A token bucket per source address (the IP, not the port): ``RATE`` messages per second with
bursts of ``BURST``, the values wireguard-go uses. Buckets idle for a second are forgotten
when the table is swept, so the table cannot grow without bound.
"""

from __future__ import annotations

RATE = 20.0  # handshake messages per second per source (wireguard-go packetsPerSecond)
BURST = 5  # wireguard-go packetsBurstable
SWEEP_EVERY = 1.0


class RateLimiter:
    __slots__ = ("_buckets", "_last_sweep")

    def __init__(self) -> None:
        self._buckets: dict[bytes, tuple[float, float]] = {}  # source -> (tokens, last update)
        self._last_sweep = float("-inf")

    def allow(self, source: bytes, now: float) -> bool:
        """Take one token for ``source``; False when its bucket is empty."""
        if now - self._last_sweep >= SWEEP_EVERY:
            self._buckets = {k: v for k, v in self._buckets.items() if now - v[1] < SWEEP_EVERY}
            self._last_sweep = now
        tokens, last = self._buckets.get(source, (float(BURST), now))
        tokens = min(float(BURST), tokens + (now - last) * RATE)
        if tokens < 1.0:
            self._buckets[source] = (tokens, now)
            return False
        self._buckets[source] = (tokens - 1.0, now)
        return True

    def __len__(self) -> int:
        return len(self._buckets)
