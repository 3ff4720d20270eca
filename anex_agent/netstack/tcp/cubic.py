"""CUBIC congestion avoidance (RFC 9438), sans-I/O: the caller passes ``now`` and the RTT.

Contract: :class:`Cubic` owns no cwnd; the connection keeps ``cwnd``/``ssthresh`` in bytes and
asks it at three points:

* :meth:`Cubic.increase` on an ACK in congestion avoidance (cwnd >= ssthresh, not in
  recovery): the new cwnd, from the cubic function W_cubic(t) = C(t-K)^3 + W_max (§4.2) with
  the target W_cubic(t+RTT) clamped to [cwnd, 1.5 cwnd] (§4.4, §4.5) and the Reno-friendly
  estimate W_est (§4.3) as a floor;
* :meth:`Cubic.on_congestion` on a loss detected by ACKs (fast retransmit, RACK): the new
  ssthresh = max(cwnd * beta, 2 segments), beta = 0.7 (§4.6), with fast convergence (§4.7);
  a new epoch starts at the next :meth:`increase`;
* :meth:`Cubic.on_timeout` after an RTO (§4.8): the same reduction, the epoch reset;

and :meth:`Cubic.undo` when the last congestion event was spurious (D-SACK, §4.9): W_max and
the epoch go back to what they were before it. Slow start is the caller's (RFC 5681).
Windows inside are in segments (floats), as in the RFC; the interface is in bytes.
"""

from __future__ import annotations

C = 0.4  # §5.1
BETA = 0.7  # §4.6
ALPHA = 3 * (1 - BETA) / (1 + BETA)  # §4.3: Reno-friendly additive increase (~0.53 segments per RTT)


class Cubic:
    __slots__ = ("mss", "w_max", "w_last_max", "k", "epoch", "cwnd_epoch", "w_est", "_saved")

    def __init__(self, mss: int) -> None:
        self.mss = mss
        self.w_max = 0.0  # segments: cwnd just before the last reduction
        self.w_last_max = 0.0  # W_max before that (fast convergence, §4.7)
        self.k = 0.0  # seconds from the epoch's start until W_cubic is back at W_max
        self.epoch: float | None = None  # start of the current congestion avoidance epoch
        self.cwnd_epoch = 0.0
        self.w_est = 0.0  # segments: the Reno-friendly estimate
        self._saved: tuple | None = None  # state before the last congestion event (undo)

    def w_cubic(self, t: float) -> float:
        """W_cubic(t) in segments, ``t`` seconds after the epoch's start (eq. 1)."""
        return C * (t - self.k) ** 3 + self.w_max

    def increase(self, cwnd: int, acked: int, now: float, rtt: float) -> int:
        """The cwnd (bytes) after ``acked`` bytes were acknowledged in congestion avoidance."""
        mss = self.mss
        w = cwnd / mss
        if self.epoch is None:  # §4.2: a new epoch
            self.epoch = now
            self.cwnd_epoch = w
            self.w_est = w
            if w < self.w_max:
                self.k = ((self.w_max - w) / C) ** (1 / 3)  # eq. 2
            else:
                self.k = 0.0
                self.w_max = w
        segs = acked / mss
        alpha = 1.0 if self.w_est >= self.w_max else ALPHA  # §4.3: Reno's own slope past W_max
        self.w_est += alpha * segs / w
        t = now - self.epoch
        if self.w_cubic(t) < self.w_est:  # the Reno-friendly region (§4.3)
            new = self.w_est
        else:  # concave (§4.4) or convex (§4.5) region
            target = self.w_cubic(t + rtt)
            if target < w:
                target = w
            elif target > 1.5 * w:
                target = 1.5 * w
            new = w + (target - w) / w * segs
        out = int(new * mss)
        return out if out > cwnd else cwnd

    def on_congestion(self, cwnd: int) -> int:
        """A loss detected by ACKs: remember W_max, start a new epoch later; the new ssthresh (bytes)."""
        self._saved = (self.w_max, self.w_last_max, self.k, self.epoch, self.cwnd_epoch, self.w_est)
        w = cwnd / self.mss
        if w < self.w_last_max:  # fast convergence (§4.7): release bandwidth to newer flows
            self.w_last_max = w
            self.w_max = w * (1 + BETA) / 2
        else:
            self.w_last_max = w
            self.w_max = w
        self.epoch = None
        return max(int(cwnd * BETA), 2 * self.mss)

    def on_timeout(self, cwnd: int) -> int:
        """An RTO (§4.8): the same reduction; the caller sets cwnd to one segment."""
        ssthresh = self.on_congestion(cwnd)
        self._saved = None  # a timeout is not undone
        return ssthresh

    def undo(self) -> None:
        """The last congestion event was spurious (§4.9): its state comes back."""
        if self._saved is not None:
            self.w_max, self.w_last_max, self.k, self.epoch, self.cwnd_epoch, self.w_est = self._saved
            self._saved = None
