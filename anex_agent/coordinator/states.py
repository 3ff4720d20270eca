"""Node state transitions (pure: no clock, no I/O; callers pass ``now``).

    pending ──first heartbeat──► ready ──no heartbeat for not_ready_after──► not_ready
       │                           ▲                                             │
       │                           └──────────────── heartbeat ◄─────────────────┤
       └──no heartbeat for expired_after since joining──► expired ◄──no heartbeat for expired_after
                                                           │
                                                           └── heartbeat ──► ready

``expired`` is where a node ends up when it has been silent for ``expired_after``
seconds (rented machines vanish without saying goodbye); it keeps its record and
address until an admin deletes it, and comes back to ``ready`` if it heartbeats again.
"""

from __future__ import annotations

from dataclasses import dataclass

from anex_agent.wire import NodeState


@dataclass(frozen=True)
class Timings:
    """Seconds. ``heartbeat_interval`` is what nodes are told; the others are thresholds."""

    heartbeat_interval: float = 15.0
    not_ready_after: float = 60.0
    expired_after: float = 3600.0

    def __post_init__(self) -> None:
        if not 0 < self.heartbeat_interval < self.not_ready_after < self.expired_after:
            raise ValueError(
                "timings must satisfy 0 < heartbeat interval < not-ready-after < expired-after "
                f"(got {self.heartbeat_interval}, {self.not_ready_after}, {self.expired_after})"
            )


def on_heartbeat(state: NodeState) -> NodeState:
    """Any heartbeat makes a node ready."""
    return NodeState.ready


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
