"""How a provision recovers: the event each attempt ended with, the retry decision, the boot
phases and what the machine's provider status and GPUs say.

* :func:`event_of`: the event an attempt outcome is (``refused`` -> ``no-capacity``;
  ``unavailable``, ``boot_timeout``, ``deadline``, ``unhealthy``, ``failed`` -> ``error``;
  ``lost``, ``interrupted`` -> ``interruption``; ``deleted``, ``idle``: none).
* :func:`decide`: a round of attempts ended (no candidate left, max attempts) or a machine was
  lost: :class:`Retry` (when, why) while the policy retries on the event and its window is
  open, else None (the provision ends). The window starts at the first event since the
  provision was last ``ready`` (``provisions.retry_since``); the delay is the policy's backoff
  for the retries made so far (``provisions.retries``).
* :func:`interrupted`: a provider status that says the machine was stopped under us: outbid or
  preempted (Vast.AI ``intended_status``/``actual_status`` stopped, exited or offline,
  ``status_msg`` saying outbid; RunPod ``desiredStatus`` EXITED or TERMINATED).
* :func:`running`: the provider reports the machine running (Vast.AI ``actual_status``).
* :func:`gpu_fault`: a node's telemetry saying a GPU needs a reset (an XID that is a hardware
  fault, a GPU lost or needing a reset) or the health verdict ``unhealthy``.
* :func:`idle`: whether the node's GPUs are all below the idle threshold.

Migration 420 adds the columns (SQL that runs on SQLite and PostgreSQL): ``provisions.retries``,
``retry_since``, ``round_start`` (the attempt number a round of candidates starts after: offers
tried before it may be tried again), ``idle_since``; ``provision_attempts.event``,
``running_at`` (the machine seen running at its provider), ``joined_at`` (the agent joined).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone

from anex_agent.coordinator.migrations import Migration
from anex_agent.coordinator.provisioning.policy import ERROR, INTERRUPTION, NO_CAPACITY, RecoveryPolicy
from anex_agent.providers.rentals import Rental
from anex_agent.telemetry.models import classify_xid

MIGRATION = Migration(420, "provisioning: recovery (retries, phases, idle)", """
    ALTER TABLE provisions ADD COLUMN retries BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE provisions ADD COLUMN retry_since DOUBLE PRECISION;
    ALTER TABLE provisions ADD COLUMN round_start BIGINT NOT NULL DEFAULT 0;
    ALTER TABLE provisions ADD COLUMN idle_since DOUBLE PRECISION;
    ALTER TABLE provision_attempts ADD COLUMN event TEXT;
    ALTER TABLE provision_attempts ADD COLUMN running_at DOUBLE PRECISION;
    ALTER TABLE provision_attempts ADD COLUMN joined_at DOUBLE PRECISION
""")

_EVENTS = {"refused": NO_CAPACITY, "unavailable": ERROR, "boot_timeout": ERROR, "deadline": ERROR,
           "unhealthy": ERROR, "failed": ERROR, "lost": INTERRUPTION, "interrupted": INTERRUPTION}


def event_of(outcome: str | None) -> str | None:
    return _EVENTS.get(outcome or "")


@dataclass(frozen=True)
class Retry:
    delay: float
    retries: int  # this retry's number (1 for the first)
    since: float  # when the retry window opened
    reason: str


def _when(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def decide(policy: RecoveryPolicy, row: dict, event: str | None, reason: str, *, now: float) -> Retry | str:
    """A :class:`Retry` when ``policy`` retries on ``event`` and its window is open, else the reason the
    provision ends with (``reason``, saying why it was not retried when the policy retries on it)."""
    if event is None or not policy.retries(event):
        return reason
    since = row["retry_since"] if row["retry_since"] is not None else now
    until = since + policy.retry_for
    if now >= until:
        return f"{reason} (not retried: the {event} retry window of {policy.retry_for:g}s ended at {_when(until)})"
    n = int(row["retries"] or 0)
    delay = policy.delay(n)
    return Retry(delay, n + 1, since, f"{event}: {reason}; retry {n + 1} at {_when(now + delay)} "
                                      f"(retrying until {_when(until)})")


_STOPPED = {"stopped", "exited", "terminated", "offline"}


def interrupted(rental: Rental) -> str | None:
    """Why the provider's status of ``rental`` says it was outbid or preempted, or None."""
    details = rental.details or {}
    status = (rental.status or "").lower()
    intended = str(details.get("intended_status") or "").lower()
    message = str(details.get("status_msg") or "")
    if rental.provider == "runpod" and status in ("exited", "terminated"):
        return f"runpod reports the pod {status.upper()} (preempted)"
    if intended in _STOPPED or status in _STOPPED or "outbid" in message.lower():
        said = f"actual_status {status}, intended_status {intended or '-'}" + (f": {message}" if message else "")
        return f"{rental.provider} stopped the machine ({said}; outbid or preempted)"
    return None


def running(rental: Rental) -> bool:
    """Whether the provider reports the machine running (Vast.AI: ``actual_status``, not the contract's
    ``cur_state``, which says running while the image still loads)."""
    if rental.provider == "vastai" and rental.details is not None and "cur_state" in rental.details:
        return str(rental.details.get("actual_status") or "").lower() == "running"
    return (rental.status or "").lower() == "running"


def _telemetry(node: dict) -> dict:
    raw = node.get("telemetry")
    if not raw:
        return {}
    try:
        value = json.loads(raw) if isinstance(raw, str) else raw
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def gpu_fault(node: dict) -> str | None:
    """Why the node's GPUs are unusable (a hardware XID, a GPU lost or needing a reset, the verdict
    ``unhealthy``), or None."""
    telemetry = _telemetry(node)
    for gpu in telemetry.get("gpus") or []:
        if not isinstance(gpu, dict):
            continue
        if gpu.get("state") in ("gpu_lost", "reset_required"):
            return f"GPU {gpu.get('index')} reports {gpu.get('state')}"
        xid = gpu.get("last_xid")
        if isinstance(xid, int) and xid and classify_xid(xid) == "hardware":
            return f"GPU {gpu.get('index')} reported XID {xid} (a hardware fault that needs a reset)"
    for event in telemetry.get("xids") or []:
        if isinstance(event, dict) and isinstance(event.get("xid"), int) and classify_xid(event["xid"]) == "hardware":
            return f"GPU {event.get('gpu')} reported XID {event['xid']} (a hardware fault that needs a reset)"
    if node.get("health") == "unhealthy":
        reasons = node.get("health_reasons") or "[]"
        try:
            text = "; ".join(json.loads(reasons)) if isinstance(reasons, str) else "; ".join(reasons)
        except ValueError:
            text = ""
        return "the node's health check says unhealthy" + (f" ({text})" if text else "")
    return None


def idle(node: dict, threshold: float) -> bool | None:
    """True when every GPU of the node's latest telemetry is below ``threshold`` percent; None: no reading."""
    utils = [g.get("gpu_util_pct") for g in _telemetry(node).get("gpus") or [] if isinstance(g, dict)]
    utils = [u for u in utils if isinstance(u, (int, float))]
    if not utils:
        return None
    return all(u < threshold for u in utils)


def late_phase(policy: RecoveryPolicy, attempt: dict | None, node: dict | None, now: float) -> str | float:
    """The reason a booting attempt's current phase is past its deadline (the phase named), else when
    that deadline comes: ``running`` from the rental, ``join`` from the machine running, ``heartbeat``
    from the join."""
    if attempt is None or attempt["rented_at"] is None:
        return float("inf")
    if node is not None and attempt.get("joined_at") is not None:
        phase, since, what = "heartbeat", attempt["joined_at"], f"node {node['id']} joined but sent no heartbeat"
    elif attempt.get("running_at") is None:
        phase, since, what = "running", attempt["rented_at"], \
            f"{attempt['provider']} did not report rental {attempt['rental_id']} running"
    else:
        phase, since, what = "join", attempt["running_at"], "the machine runs but no node joined"
    limit = policy.deadline(phase)
    due = float(since) + limit
    if now < due:
        return due
    return f"phase {phase}: {what} within {limit:g}s"


def workload_late(policy: RecoveryPolicy, node: dict, ready_at: float | None, now: float) -> str | None:
    """The reason a ready node's workload did not start within the ``workload`` deadline (from the first
    heartbeat), or None (started, no workload to watch: ``anex-agent daemon``, or not yet due)."""
    if ready_at is None or now < ready_at + policy.deadline("workload"):
        return None
    try:
        status = json.loads(node.get("status") or "{}")
    except ValueError:
        return None
    workload = status.get("workload") if isinstance(status, dict) else None
    if not isinstance(workload, dict) or workload.get("state") != "waiting":
        return None
    reason = workload.get("reason") or "waiting"
    return f"phase workload: the workload did not start within {policy.deadline('workload'):g}s ({reason})"
