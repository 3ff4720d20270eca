"""The probe report behind ``anex-agent detect``: which engines can run here, and why not.

:func:`detect` returns a :class:`DetectReport`; ``to_dict()`` is plain JSON (it goes into
``/status``, the heartbeat's ``facts.detect`` and ``anex-agent detect --json``). Shape::

    {"engines": {"kernel": {"supported": false, "reason": "...",
                            "serves_workload": true, "workload_reason": "..."}, ...},
     "auto": "wireguard-go",     # what the agent's auto picks: first supported engine in AUTO_ORDER
                                 # that can also serve the workload, or null
     "auto_skipped": {},          # engines that run here but cannot serve the workload, with why
     "udp": {"supported": true, "reason": "..."},
     "capabilities": ["wireguard-go", "userspace", "udp"]}   # what NodeFacts.capabilities carries

``supported`` says whether the engine can run here; ``serves_workload`` whether it can
serve a node's proxy, forwards and inbound ports (class-level, see
``Engine.workload_support``). ``auto_skipped`` names the engines that run here but were
passed over, and why.

Probes never raise; a probe that blows up is reported as unsupported with the error.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass, field
from typing import Any

from anex_agent.tunnels.engines.registry import AUTO_ORDER, engine_classes
from anex_agent.tunnels.engines.status import Support

#: capability names reported to the coordinator, per engine (NodeFacts.capabilities).
CAPABILITY_NAMES = {"kernel": "kernel-wireguard", "wireguard-go": "wireguard-go", "userspace": "userspace", "wireproxy": "wireproxy"}


@dataclass(frozen=True)
class DetectReport:
    engines: dict[str, Support]
    udp: Support
    auto: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: per engine: can it serve the workload (Engine.workload_support)
    workload: dict[str, Support] = field(default_factory=dict)

    @property
    def auto_skipped(self) -> dict[str, str]:
        """Engines that run here but that the agent's auto does not pick, with the reason."""
        return {n: f"runs here but cannot serve the workload: {self.workload[n].reason}"
                for n, s in self.engines.items() if s.ok and n in self.workload and not self.workload[n].ok}

    @property
    def capabilities(self) -> list[str]:
        caps = [CAPABILITY_NAMES[n] for n, s in self.engines.items() if s.ok]
        return caps + (["udp"] if self.udp.ok else [])

    def to_dict(self) -> dict[str, Any]:
        return {
            "engines": {name: {**s.to_dict(), **self._workload_dict(name)} for name, s in self.engines.items()},
            "auto": self.auto,
            "auto_skipped": self.auto_skipped,
            "udp": self.udp.to_dict(),
            "capabilities": self.capabilities,
            **self.extra,
        }

    def _workload_dict(self, name: str) -> dict[str, Any]:
        serves = self.workload.get(name)
        return {} if serves is None else {"serves_workload": serves.ok, "workload_reason": serves.reason}


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
        from anex_agent.tunnels.os.netconf import split_host_port

        try:
            host, port = split_host_port(target)
            sock.settimeout(timeout)
            sock.connect((host, port))
            sock.send(b"\x00")  # not a WireGuard message type: receivers drop it (whitepaper §5.4)
        except (OSError, ValueError) as err:
            reason = getattr(err, "strerror", None) or str(err)
            return Support(False, f"cannot send UDP to {target}: {reason}")
        return Support(True, f"UDP datagrams can be sent to {target} (delivery is confirmed by a handshake)")


def workload_answer(cls: Any) -> Support:
    try:
        return cls.workload_support()
    except Exception as err:  # class-level answer; report a broken one instead of raising
        return Support(False, f"workload_support failed: {type(err).__name__}: {err}")


def detect(*, udp_target: str | None = None) -> DetectReport:
    """Probe every engine (in AUTO_ORDER; absent ones say so) and UDP.

    ``auto`` follows the agent's policy (``base.choose_engine(for_workload=True)``): the
    first engine that runs here and can serve the workload.
    """
    classes = engine_classes()
    engines: dict[str, Support] = {}
    workload: dict[str, Support] = {}
    for name in AUTO_ORDER:
        cls = classes.get(name)
        engines[name] = probe_engine(cls) if cls is not None else Support(False, "not available in this build")
        if cls is not None:
            workload[name] = workload_answer(cls)
    auto = next((n for n, s in engines.items() if s.ok and workload.get(n, Support(False, "")).ok), None)
    return DetectReport(engines=engines, udp=probe_udp(udp_target), auto=auto, workload=workload)
