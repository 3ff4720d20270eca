"""The retransmission timeout (RFC 6298): SRTT/RTTVAR smoothing, Karn's rule is the caller's.

The minimum RTO is 200 ms, as Linux uses, instead of RFC 6298 §2.4's 1 s: our paths are
tunnels with known, short round trips, and a 1 s floor would stall every loss recovered by
timeout. The maximum is 60 s (§2.5).
"""

from __future__ import annotations

ALPHA, BETA, K = 1 / 8, 1 / 4, 4  # RFC 6298 §2.3
INITIAL_RTO = 1.0  # §2.1
MIN_RTO = 0.2
MAX_RTO = 60.0
GRANULARITY = 0.001  # G: our clock is the event loop's monotonic float


class RttEstimator:
    __slots__ = ("srtt", "rttvar", "rto")

    def __init__(self) -> None:
        self.srtt: float | None = None
        self.rttvar = 0.0
        self.rto = INITIAL_RTO

    def sample(self, r: float, per_rtt: int = 1) -> None:
        """Take a measurement ``r`` (seconds) of a segment that was not retransmitted (Karn), or
        from a timestamp echo; ``per_rtt``: samples expected per round trip, which divide the
        gains (RFC 7323 Appendix G), so that sampling every ACK smooths over about one RTT."""
        if self.srtt is None:  # §2.2
            self.srtt, self.rttvar = r, r / 2
        else:  # §2.3
            alpha, beta = ALPHA / per_rtt, BETA / per_rtt
            self.rttvar = (1 - beta) * self.rttvar + beta * abs(self.srtt - r)
            self.srtt = (1 - alpha) * self.srtt + alpha * r
        self.rto = min(MAX_RTO, max(MIN_RTO, self.srtt + max(GRANULARITY, K * self.rttvar)))

    def backoff(self) -> None:
        """§5.5: double the RTO after a timeout."""
        self.rto = min(MAX_RTO, self.rto * 2)
