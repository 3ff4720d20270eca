"""What an engine reports: whether it can run here (:class:`Support`, the answer of
``is_supported()`` and ``workload_support()``) and its state once running (:class:`EngineStatus`,
with a :class:`PeerStatus` per peer: handshakes, bytes, endpoints).

Frozen values with a ``to_dict()`` for the reports (``anex-agent detect``, the agent's ``/status``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Support:
    """Answer of ``is_supported()``: ``ok`` and, always, a human ``reason`` (why not, or what was found)."""

    ok: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"supported": self.ok, "reason": self.reason}



@dataclass(frozen=True)
class PeerStatus:
    """What the engine reports about one peer. ``last_handshake`` is a UNIX time, ``None`` if never."""

    public_key: str
    endpoint: str | None
    last_handshake: float | None
    rx_bytes: int
    tx_bytes: int
    allowed_ips: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "public_key": self.public_key,
            "endpoint": self.endpoint,
            "last_handshake": self.last_handshake,
            "rx_bytes": self.rx_bytes,
            "tx_bytes": self.tx_bytes,
            "allowed_ips": list(self.allowed_ips),
        }


@dataclass(frozen=True)
class EngineStatus:
    """What the engine reports about itself. ``listen_port`` is the actual UDP port (0 if none)."""

    engine: str
    interface: str | None
    listen_port: int
    running: bool
    peers: tuple[PeerStatus, ...] = ()

    def peer(self, public_key: str) -> PeerStatus | None:
        return next((p for p in self.peers if p.public_key == public_key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "interface": self.interface,
            "listen_port": self.listen_port,
            "running": self.running,
            "peers": [p.to_dict() for p in self.peers],
        }

