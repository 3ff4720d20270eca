"""Node state transitions (pure: no clock, no I/O; callers pass ``now``).

    pending ──first heartbeat──► ready ──no heartbeat for not_ready_after──► not_ready
       │                           ▲                                             │
       │                           └──────────────── heartbeat ◄─────────────────┤
       └──no heartbeat for expired_after since joining──► expired ◄──no heartbeat for expired_after

``expired`` is final: a node silent for ``expired_after`` seconds (rented machines vanish
without saying goodbye, and the host keeps the disk) is removed as if an admin deleted it
(the sweeper does it): its credential stops working, its peer leaves every gateway and
its address goes into quarantine. To come back it joins again, with a token that is
still good for it and a proof of its key.

Credentials rotate: a node's (on a heartbeat) and a gateway's (on its renewal call) once
``credential_rotation`` seconds after issue; the one rotated away keeps working for
``credential_grace`` seconds, so an answer lost on the way does not lock the caller out.
"""

from __future__ import annotations

from dataclasses import dataclass

from anex_agent.wire.heartbeat import NodeState


@dataclass(frozen=True)
class Timings:
    """Seconds. ``heartbeat_interval`` is what nodes are told; the others are thresholds."""

    heartbeat_interval: float = 15.0
    not_ready_after: float = 60.0
    expired_after: float = 3600.0
    credential_rotation: float = 3600.0
    credential_grace: float = 300.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval < self.not_ready_after < self.expired_after:
            raise ValueError(
                "timings must satisfy 0 < heartbeat interval < not-ready-after < expired-after "
                f"(got {self.heartbeat_interval}, {self.not_ready_after}, {self.expired_after})"
            )
        if not (self.heartbeat_interval < self.credential_rotation and 0 < self.credential_grace):
            raise ValueError(
                "timings must satisfy heartbeat interval < credential rotation and a grace above 0 "
                f"(got {self.heartbeat_interval}, {self.credential_rotation}, {self.credential_grace})"
            )


def on_heartbeat(state: NodeState) -> NodeState:
    """A heartbeat makes a pending or not_ready node ready (an expired node has no credential left)."""
    return NodeState.ready


def rotation_due(*, now: float, issued_at: float, timings: Timings) -> bool:
    """Whether a credential issued at ``issued_at`` is to be replaced now."""
    return now - issued_at >= timings.credential_rotation


def state_at(*, now: float, created_at: float, last_heartbeat_at: float | None, timings: Timings) -> NodeState:
    """The state a node is in at ``now`` given when it was last heard of."""
    if last_heartbeat_at is None:
        return NodeState.expired if now - created_at >= timings.expired_after else NodeState.pending
    silent = now - last_heartbeat_at
    if silent >= timings.expired_after:
        return NodeState.expired
    if silent >= timings.not_ready_after:
        return NodeState.not_ready
    return NodeState.ready
