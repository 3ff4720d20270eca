"""The heartbeat: what a node reports at the interval the coordinator sets, and what it answers.

    POST   /v1/nodes/{id}/heartbeat       node       Heartbeat -> HeartbeatAck

:class:`Heartbeat` carries the node's :class:`TransportStatus` (with the workload's
:class:`ContainerState` under ``anex-agent run``) and its telemetry block, checked as received
by :mod:`anex_agent.wire.telemetry`. :class:`HeartbeatAck` carries the node's
:class:`NodeState`, which the heartbeats drive, when to send the next one
(``next_heartbeat_in``), and a new credential when one is due.
"""

from __future__ import annotations

from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, field_serializer

from anex_agent.telemetry.models import Telemetry
from anex_agent.wire.base import PATH_REASON_MAX, Counter, Model, ShortText, Version
from anex_agent.wire.telemetry import check_raw_telemetry


class NodeState(str, Enum):
    """pending (joined, no heartbeat yet) -> ready -> not_ready (missed heartbeats) -> expired."""

    pending = "pending"
    ready = "ready"
    not_ready = "not_ready"
    expired = "expired"


class ContainerState(Model):
    """The workload's state as Kubernetes reports a container's (``anex-agent run`` only)."""

    state: Literal["waiting", "running", "terminated"]
    reason: ShortText = Field("", description="waiting: ContainerCreating, or CrashLoopBackOff (its restart "
                              "policy starts it again; the other fields tell its last run); terminated: Completed, "
                              "Error or OOMKilled")
    exit_code: int | None = Field(None, ge=0, le=255, description="terminated (or CrashLoopBackOff: the last run): "
                                  "the shell-style status (128+N for signal N)")
    signal: int | None = Field(None, ge=1, le=64, description="terminated: the signal that ended it, if one did")
    started_at: datetime | None = None
    finished_at: datetime | None = None
    restart_count: Counter = 0
    ready: bool | None = Field(None, description="running: whether its readiness probe passes (True without one, once "
                               "started); None: the agent runs no probes (read: ready while running)")
    started: bool | None = Field(None, description="running: whether its startup probe passed (True without one); "
                                 "None: the agent runs no probes")
    probe_failures: Counter = Field(0, description="how many times a probe decided against the workload so far "
                                    "(a readiness probe unready, a liveness or startup probe stopping it), all runs")
    probe_message: ShortText = Field("", description="the last such decision, e.g. 'Liveness probe failed: ...'")


class TransportStatus(Model):
    engine: ShortText = ""
    path: ShortText = ""
    path_reason: str = Field("", max_length=PATH_REASON_MAX, description="why the node is on this path (udp|websocket), or has none (none)")
    last_handshake_age: float | None = Field(None, ge=0, description="seconds since the last handshake, None if never")
    rx_bytes: Counter = 0
    tx_bytes: Counter = 0
    dead_peer: str = Field("", max_length=PATH_REASON_MAX,
                           description="the last dead-peer detection: when, why a fresh handshake was started, outcome")
    workload: ContainerState | None = Field(None, description="the workload of `anex-agent run`; None for `daemon`")


class Heartbeat(Model):
    status: TransportStatus = Field(default_factory=TransportStatus)
    config_version: Version = 0
    telemetry: Annotated[Telemetry | None, BeforeValidator(check_raw_telemetry)] = Field(
        None,
        description=(
            "the node's GPU and host telemetry (anex_agent.telemetry.models, docs/telemetry.md); the coordinator "
            "takes the node's health from telemetry['health'] and stores the block as sent. Keys this "
            "version does not know are kept. Bounded by anex_agent.telemetry.bounds (64 GPUs, 256 list "
            "items and keys, nesting 8). Numbers are finite; counters and "
            "measures (keys ending in _bytes, _count, _errors, _pct, _mhz, _w, _seconds, _bits, _gbps, and "
            "the values of xid_counts) are not negative; strings hold at most 4096 characters and no NUL"
        ),
    )

    @field_serializer("telemetry")
    def _telemetry_as_sent(self, value: Telemetry | None) -> dict[str, Any] | None:
        return None if value is None else value.as_sent()


class HeartbeatAck(Model):
    state: NodeState
    config_version: int = Field(description="the coordinator's current config version for this node")
    next_heartbeat_in: float = Field(description="seconds until the coordinator expects the next heartbeat")
    credential: str | None = Field(
        None, description="a new credential for this node (rotation); the one used for this call ends after a grace"
    )
