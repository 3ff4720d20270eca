"""What a kubelet would report for a pod, from its provision and its node's workload state (pure).

:func:`observe` takes the pod (a dict), its provision (``ProvisionView``, or None before it
exists) and the workload's :class:`~anex_agent.wire.heartbeat.ContainerState` from the provision's node
view (None until the agent reported one), and returns an :class:`Observation`: the pod's
``status`` as the status subresource takes it (a JSON merge patch: every field we own is set,
``None`` removes one), the step the pod is at, and the Event that step deserves. The mapping:

==============================  =========  ===============================================
provision / workload            phase      container state
==============================  =========  ===============================================
none yet, ``selecting``         Pending    waiting ``Selecting``
``renting``                     Pending    waiting ``Renting`` (offer, price)
``booting``                     Pending    waiting ``Booting`` (offer, rental, price)
``ready``, workload not started Pending    waiting ``ContainerCreating``
``ready``, running              Running    running (``startedAt``); podIP = the mesh address;
                                           ``ready``/``started`` (and the Ready condition)
                                           as the agent's probes say (no probes: True)
``ready``, between two runs     Running    waiting ``CrashLoopBackOff``, lastState terminated (the
                                           last run, kept once it runs again), restartCount
                                           (its policy restarts it)
``ready``, terminated           Succeeded  terminated: exitCode 0, ``Completed``
                                / Failed   exitCode, signal, ``Error`` / ``OOMKilled``
``failed``                      Failed     waiting ``ProvisioningFailed`` (pod reason too)
``lost``                        Failed     waiting ``MachineLost`` (pod reason too)
``released``                    Failed     waiting ``MachineReleased`` (idle GPUs: the machine was released)
``deleting``/``deleted``        Failed     waiting ``ProvisionDeleted`` (deleted outside the cluster)
==============================  =========  ===============================================

The agent restarts the workload in place by the pod's ``restartPolicy`` (``ANEX_RESTART_POLICY``,
:mod:`anex_agent.agent.restart_policy`): between two runs it reports ``CrashLoopBackOff``; a
terminated workload is one it will not start again, and ends the pod. :func:`refused` is the
status of a pod the virtual node will not run at all. Conditions keep their
``lastTransitionTime`` while their status stays the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from anex_agent.wire.provisioning import ProvisionState, ProvisionView
from anex_agent.wire.heartbeat import ContainerState

TERMINAL_PHASES = ("Succeeded", "Failed")
NORMAL, WARNING = "Normal", "Warning"


@dataclass(frozen=True)
class Observation:
    status: dict[str, Any]
    step: str  # Selecting, Renting, Booting, ContainerCreating, Running, Succeeded, Failed, ...
    event: tuple[str, str, str] | None  # (type, reason, message) to record when the step is new


def kube_time(when: datetime | None) -> str | None:
    """RFC 3339 in UTC with whole seconds, as ``metav1.Time`` is written."""
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_terminal(pod: Mapping[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in TERMINAL_PHASES


def _price(view: ProvisionView) -> str:
    return f" at ${view.price_per_hour:g}/h" if view.price_per_hour is not None else ""


def _conditions(pod: Mapping[str, Any], ready: bool, now: str, *, ended: bool = False,
                running: bool = False) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in (pod.get("status") or {}).get("conditions") or []}
    wanted = {"PodScheduled": True, "Initialized": True, "ContainersReady": ready, "Ready": ready}
    out = []
    for kind, value in wanted.items():
        status = "True" if value else "False"
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now
        condition: dict[str, Any] = {"type": kind, "status": status, "lastTransitionTime": since,
                                     "lastProbeTime": None}
        if not value and ended:
            condition.update(reason="PodCompleted", message="the container has ended")
        elif not value and running:
            condition.update(reason="ContainersNotReady",
                             message=f"containers with unready status: [{_name(pod)}] (its readiness or startup "
                             "probe has not passed)")
        elif not value:
            condition.update(reason="ContainersNotReady", message="the container is not running")
        out.append(condition)
    return out


def _container(pod: Mapping[str, Any], state: dict[str, Any], *, ready: bool, started: bool, restarts: int,
               container_id: str | None) -> dict[str, Any]:
    container = ((pod.get("spec") or {}).get("containers") or [{}])[0]
    status: dict[str, Any] = {"name": container.get("name", ""), "image": container.get("image", ""),
                              "imageID": "", "ready": ready, "started": started, "restartCount": restarts,
                              "state": state, "lastState": {}}
    if container_id:
        status["containerID"] = container_id
    return status


def _name(pod: Mapping[str, Any]) -> str:
    return (((pod.get("spec") or {}).get("containers") or [{}])[0]).get("name", "")


def _waiting(reason: str, message: str) -> dict[str, Any]:
    return {"waiting": {"reason": reason, "message": message}}


def _last_state(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The ``lastState`` the pod's status holds now (written while its container backed off)."""
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return dict(statuses[0].get("lastState") or {})


def _start_time(pod: Mapping[str, Any], view: ProvisionView | None, now: str) -> str:
    return (pod.get("status") or {}).get("startTime") or kube_time(view.created_at if view else None) or now


def observe(pod: Mapping[str, Any], view: ProvisionView | None, workload: ContainerState | None, *,
            host_ip: str, now: datetime) -> Observation:
    """The pod's status now (see the module docstring)."""
    stamp = kube_time(now) or ""
    restarts = workload.restart_count if workload is not None else 0
    container_id = f"anex://{view.node_id}" if view is not None and view.node_id else None
    base: dict[str, Any] = {"hostIP": host_ip, "hostIPs": [{"ip": host_ip}], "startTime": _start_time(pod, view, stamp),
                            "reason": None, "message": None, "podIP": None, "podIPs": None}

    def pending(reason: str, message: str, event: tuple[str, str, str] | None) -> Observation:
        status = {**base, "phase": "Pending", "conditions": _conditions(pod, False, stamp),
                  "containerStatuses": [_container(pod, _waiting(reason, message), ready=False, started=False,
                                                   restarts=restarts, container_id=container_id)]}
        return Observation(status, reason, event)

    def failed(reason: str, message: str, event_reason: str | None = None) -> Observation:
        status = {**base, "phase": "Failed", "reason": reason, "message": message,
                  "conditions": _conditions(pod, False, stamp),
                  "containerStatuses": [_container(pod, _waiting(reason, message), ready=False, started=False,
                                                   restarts=restarts, container_id=container_id)]}
        return Observation(status, reason, (WARNING, event_reason or reason, message))

    if view is None or view.state == ProvisionState.selecting:
        why = (view.reason if view is not None and view.reason else "looking for an offer that matches the pod's "
               "annotations")
        return pending("Selecting", why, (NORMAL, "Selecting", why))
    if view.state == ProvisionState.renting:
        message = f"renting {view.provider} offer {view.offer_id}{_price(view)}"
        return pending("Renting", message, (NORMAL, "Renting", message))
    if view.state == ProvisionState.booting:
        message = (f"rented {view.provider} offer {view.offer_id} (rental {view.rental_id}){_price(view)}; "
                   "waiting for the machine to join the mesh")
        return pending("Booting", message, (NORMAL, "Rented", message))
    if view.state == ProvisionState.failed:
        return failed("ProvisioningFailed", view.reason or "the coordinator could not provision a machine")
    if view.state == ProvisionState.lost:
        return failed("MachineLost", view.reason or "the provider took the machine back")
    if view.state == ProvisionState.released:
        return failed("MachineReleased", view.reason or "its GPUs stayed idle: the machine was released")
    if view.state in (ProvisionState.deleting, ProvisionState.deleted):
        return failed("ProvisionDeleted", "the pod's provision was deleted outside the cluster "
                      f"({view.reason or view.state.value}); the machine is gone")
    # ready: the machine joined; what its workload does
    address = view.address
    with_ip = {**base, "podIP": address, "podIPs": [{"ip": address}] if address else None}
    if workload is not None and workload.state == "waiting" and workload.reason == "CrashLoopBackOff":
        code = workload.exit_code if workload.exit_code is not None else 0
        last: dict[str, Any] = {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                "startedAt": kube_time(workload.started_at),
                                "finishedAt": kube_time(workload.finished_at), "containerID": container_id}
        if workload.signal:
            last["signal"] = workload.signal
        message = f"back-off restarting failed container {_name(pod)} (exited with status {code})"
        container = _container(pod, _waiting("CrashLoopBackOff", message), ready=False, started=False,
                               restarts=restarts, container_id=container_id)
        container["lastState"] = {"terminated": {k: v for k, v in last.items() if v is not None}}
        status = {**with_ip, "phase": "Running", "conditions": _conditions(pod, False, stamp),
                  "containerStatuses": [container]}
        return Observation(status, f"BackOff-{restarts}", (WARNING, "BackOff", message))
    if workload is None or workload.state == "waiting":
        message = f"the machine joined as node {view.node_id} ({address}); starting the container"
        return pending("ContainerCreating", message, (NORMAL, "Booting", message))
    if workload.state == "running":
        started = kube_time(workload.started_at) or stamp
        ready = workload.ready is not False  # None: an agent without probes, ready while it runs
        container = _container(pod, {"running": {"startedAt": started}}, ready=ready,
                               started=workload.started is not False, restarts=restarts, container_id=container_id)
        if restarts:  # a kubelet keeps the last run's end while the container runs again
            container["lastState"] = _last_state(pod)
        status = {**with_ip, "phase": "Running", "conditions": _conditions(pod, ready, stamp, running=True),
                  "containerStatuses": [container]}
        message = f"started the container on {view.provider} node {view.node_id}, pod IP {address}"
        return Observation(status, "Running", (NORMAL, "Started", message))
    code = workload.exit_code if workload.exit_code is not None else (0 if workload.reason == "Completed" else 1)
    reason = workload.reason or ("Completed" if code == 0 else "Error")
    terminated: dict[str, Any] = {"exitCode": code, "reason": reason,
                                  "startedAt": kube_time(workload.started_at),
                                  "finishedAt": kube_time(workload.finished_at) or stamp,
                                  "containerID": container_id}
    if workload.signal:
        terminated["signal"] = workload.signal
    terminated = {k: v for k, v in terminated.items() if v is not None}
    phase = "Succeeded" if code == 0 else "Failed"
    status = {**with_ip, "phase": phase, "conditions": _conditions(pod, False, stamp, ended=True),
              "containerStatuses": [_container(pod, {"terminated": terminated}, ready=False, started=False,
                                               restarts=restarts, container_id=container_id)]}
    kind = NORMAL if code == 0 else WARNING
    message = f"the container exited with status {code} ({reason})" + (
        f", signal {workload.signal}" if workload.signal else "")
    return Observation(status, phase, (kind, "Completed" if code == 0 else reason, message))


def refused(pod: Mapping[str, Any], reason: str, message: str, *, host_ip: str, now: datetime) -> dict[str, Any]:
    """The status of a pod that will not run (nothing rented): Failed with ``reason`` and ``message``."""
    stamp = kube_time(now) or ""
    return {"phase": "Failed", "reason": reason, "message": message, "hostIP": host_ip, "hostIPs": [{"ip": host_ip}],
            "startTime": (pod.get("status") or {}).get("startTime") or stamp,
            "podIP": None, "podIPs": None,
            "conditions": _conditions(pod, False, stamp),
            "containerStatuses": [_container(pod, _waiting(reason, message), ready=False, started=False, restarts=0,
                                             container_id=None)]}
