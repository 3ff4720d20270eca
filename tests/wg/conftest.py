"""Shared helpers for the WireGuard core tests: two devices joined by a fake link."""

from __future__ import annotations

import ipaddress
import random
import struct

import pytest

from anex_agent.wire import keys
from anex_agent.wg.device import Device, Output
from anex_agent.wg.peer import PeerConfig

ADDR_A = ("192.0.2.1", 51820)
ADDR_B = ("192.0.2.2", 51821)
IP_A = "10.7.0.1"
IP_B = "10.7.0.2"


def ipv4_packet(src: str, dst: str, payload: bytes = b"hello", proto: int = 17) -> bytes:
    """A minimal IPv4 packet (checksum left zero: the WireGuard core does not check it)."""
    total = 20 + len(payload)
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, total, 0, 0, 64, proto, 0,
                         ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed)
    return header + payload


class Clock:
    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.wall = 1_700_000_000.0

    def wall_time(self) -> float:
        return self.wall + self.now


class Pair:
    """Device A and B, each the other's peer. ``deliver`` moves datagrams between them until quiet."""

    def __init__(self, *, psk: bool = False, seed: int = 1, keepalive_a: float | None = None,
                 keepalive_b: float | None = None, b_has_endpoint: bool = True) -> None:
        rng = random.Random(seed)
        self.clock = Clock()
        self.key_a = keys.generate_private_key()
        self.key_b = keys.generate_private_key()
        self.psk = rng.randbytes(32) if psk else None
        self.jitter = 0.5
        kw = dict(wall_time=self.clock.wall_time, random_bytes=rng.randbytes, jitter=lambda: self.jitter)
        self.a = Device(self.key_a, **kw)
        self.b = Device(self.key_b, **kw)
        self.a.set_peer(PeerConfig(self.b.public_key, [f"{IP_B}/32"], ADDR_B, self.psk, keepalive_a))
        self.b.set_peer(PeerConfig(self.a.public_key, [f"{IP_A}/32"], ADDR_A if b_has_endpoint else None,
                                   self.psk, keepalive_b))
        self.received_a: list[bytes] = []
        self.received_b: list[bytes] = []
        self.events: list[tuple[str, str]] = []
        self.wire: list[tuple[str, bytes, float]] = []  # every datagram sent: sender, bytes, time
        self.drop_to: set[str] = set()

    def deliver(self, out: Output, sender: str) -> None:
        """Deliver ``out`` (from ``sender``) and everything it provokes, recording packets and events."""
        queue = [(sender, out)]
        while queue:
            who, o = queue.pop(0)
            self.events += [(who, e.kind) for e in o.events]
            (self.received_a if who == "a" else self.received_b).extend(p.packet for p in o.packets)
            for data, _endpoint in o.datagrams:
                self.wire.append((who, data, self.clock.now))
                target = "b" if who == "a" else "a"
                if target in self.drop_to:
                    continue
                dev = self.b if target == "b" else self.a
                src = ADDR_A if who == "a" else ADDR_B
                queue.append((target, dev.receive_datagram(data, src, self.clock.now)))

    def send(self, who: str, packet: bytes) -> Output:
        dev = self.a if who == "a" else self.b
        out = dev.send_packet(packet, self.clock.now)
        self.deliver(out, who)
        return out

    def tick(self, seconds: float) -> None:
        """Advance time by ``seconds`` firing every timer on the way, in deadline order."""
        end = self.clock.now + seconds
        while True:
            deadlines = [d for d in (self.a.next_deadline(), self.b.next_deadline()) if d is not None]
            nxt = min(deadlines, default=None)
            if nxt is None or nxt > end:
                break
            self.clock.now = max(self.clock.now, nxt)
            self.deliver(self.a.update_timers(self.clock.now), "a")
            self.deliver(self.b.update_timers(self.clock.now), "b")
        self.clock.now = end

    def kinds(self, who: str) -> list[str]:
        return [k for w, k in self.events if w == who]


@pytest.fixture
def pair() -> Pair:
    return Pair()


def initiations(pair: Pair, who: str) -> list[float]:
    """Times at which ``who`` sent a handshake initiation (type 1)."""
    return [t for w, d, t in pair.wire if w == who and d[0] == 1]
