"""Two stacks joined by a fake link with an injected clock (and optional loss, duplication, reordering)."""

from __future__ import annotations

import random

from anex_agent.netstack.stack import Stack
from anex_agent.netstack.tcp.connection import TcpParams

A, B = "10.254.0.1", "10.254.0.2"


class Link:
    """Delivers packets between ``a`` and ``b`` after ``delay`` s; ``loss``/``dup``/``reorder`` are probabilities."""

    def __init__(self, *, params: TcpParams | None = None, delay: float = 0.001, loss: float = 0.0, dup: float = 0.0,
                 reorder: float = 0.0, seed: int = 1, mtu: int = 1420) -> None:
        self.rng = random.Random(seed)
        self.a = Stack(A, mtu=mtu, params=params, random_bytes=self.rng.randbytes)
        self.b = Stack(B, mtu=mtu, params=params, random_bytes=self.rng.randbytes)
        self.now = 0.0
        self.delay, self.loss, self.dup, self.reorder = delay, loss, dup, reorder
        self.in_flight: list[tuple[float, int, Stack, bytes]] = []
        self._n = 0
        self.sent = 0
        self.dropped = 0
        self.tap: list[tuple[str, bytes]] = []  # (sender name, packet) when tapping
        self.tapping = False
        self.filter = None  # callable(sender, packet) -> bool (True: drop)
        self.hold = None  # callable(sender, packet) -> extra delay in seconds

    def pump_out(self) -> None:
        for src, dst, name in ((self.a, self.b, "a"), (self.b, self.a, "b")):
            src.flush(self.now)
            for packet in src.take_packets():
                self.sent += 1
                if self.tapping:
                    self.tap.append((name, packet))
                if self.filter is not None and self.filter(name, packet):
                    self.dropped += 1
                    continue
                if self.rng.random() < self.loss:
                    self.dropped += 1
                    continue
                copies = 2 if self.rng.random() < self.dup else 1
                for _ in range(copies):
                    at = self.now + self.delay + (self.hold(name, packet) if self.hold is not None else 0.0)
                    if self.rng.random() < self.reorder:
                        at += self.rng.random() * 4 * self.delay
                    self._n += 1
                    self.in_flight.append((at, self._n, dst, packet))

    def step(self) -> bool:
        """Advance to the next event (a delivery or a timer). False when nothing is left."""
        self.pump_out()
        times = [t for t in (self.a.next_deadline(), self.b.next_deadline()) if t is not None]
        if self.in_flight:
            times.append(min(e[0] for e in self.in_flight))
        if not times:
            return False
        self.now = max(self.now, min(times))
        due = sorted(e for e in self.in_flight if e[0] <= self.now)
        self.in_flight = [e for e in self.in_flight if e[0] > self.now]
        for _, _, dst, packet in due:
            dst.receive(packet, self.now)
        self.a.poll(self.now)
        self.b.poll(self.now)
        self.pump_out()
        return True

    def run_until(self, cond, limit: float = 600.0, max_steps: int = 2_000_000) -> None:
        steps = 0
        while not cond():
            if self.now > limit or steps > max_steps:
                raise AssertionError(f"condition not reached by t={self.now:.3f} after {steps} steps")
            if not self.step():
                raise AssertionError("nothing left to do and the condition is not met")
            steps += 1
