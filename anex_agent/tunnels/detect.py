"""The probe report behind ``anex-agent detect``: which engines can run here, and why not.

:func:`detect` returns a :class:`DetectReport`; ``to_dict()`` is plain JSON (it goes into
``/status``, the heartbeat's ``facts.detect`` and ``anex-agent detect --json``). Shape::

    {"engines": {"kernel": {"supported": false, "reason": "..."}, "wireguard-go": {...}, ...},
     "auto": "wireguard-go",                # first supported engine in AUTO_ORDER, or null
     "udp": {"supported": true, "reason": "..."},
     "capabilities": ["wireguard-go", "udp"]}   # what NodeFacts.capabilities carries

Probes never raise; a probe that blows up is reported as unsupported with the error.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from anex_agent.tunnels.base import AUTO_ORDER, Support, engine_classes

#: capability names reported to the coordinator, per engine (NodeFacts.capabilities).
CAPABILITY_NAMES = {"kernel": "kernel-wireguard", "wireguard-go": "wireguard-go", "userspace": "userspace", "wireproxy": "wireproxy"}


@dataclass(frozen=True)
class DetectReport:
    engines: dict[str, Support]
    udp: Support
    auto: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def capabilities(self) -> list[str]:
        caps = [CAPABILITY_NAMES[n] for n, s in self.engines.items() if s.ok]
        return caps + (["udp"] if self.udp.ok else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "engines": {name: s.to_dict() for name, s in self.engines.items()},
            "auto": self.auto,
            "udp": self.udp.to_dict(),
            "capabilities": self.capabilities,
            **self.extra,
        }


def probe_engine(cls: Any) -> Support:
    try:
        return cls.is_supported()
    except Exception as err:  # is_supported must not raise; report it if one does
        return Support(False, f"probe failed: {type(err).__name__}: {err}")


def probe_udp(target: str | None = None, *, timeout: float = 1.0) -> Support:
    """Whether a UDP socket can be opened and send towards ``target`` (``HOST:PORT``; default: no send).

    UDP has no handshake, so this proves only that nothing local (no socket permission,
    no route) stops datagrams; whether they arrive is proven by a WireGuard handshake.
    """
    try:
        family = socket.AF_INET
        sock = socket.socket(family, socket.SOCK_DGRAM)
    except OSError as err:
        return Support(False, f"cannot open a UDP socket: {err.strerror or err}")
    with sock:
        try:
            sock.bind(("0.0.0.0", 0))
        except OSError as err:
            return Support(False, f"cannot bind a UDP socket: {err.strerror or err}")
        if target is None:
            return Support(True, "a UDP socket can be opened (no target given to send to)")
        from anex_agent.tunnels.netconf import split_host_port

        try:
            host, port = split_host_port(target)
            sock.settimeout(timeout)
            sock.connect((host, port))
            sock.send(b"\x00")  # not a WireGuard message type: receivers drop it (whitepaper §5.4)
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            return Support(False, f"cannot send UDP to {target}: {reason}")
        return Support(True, f"UDP datagrams can be sent to {target} (delivery is confirmed by a handshake)")


def detect(*, udp_target: str | None = None) -> DetectReport:
    """Probe every engine (in AUTO_ORDER; absent ones say so) and UDP."""
    classes = engine_classes()
    engines: dict[str, Support] = {}
    for name in AUTO_ORDER:
        cls = classes.get(name)
        engines[name] = probe_engine(cls) if cls is not None else Support(False, "not available in this build")
    auto = next((name for name, s in engines.items() if s.ok), None)
    return DetectReport(engines=engines, udp=probe_udp(udp_target), auto=auto)
