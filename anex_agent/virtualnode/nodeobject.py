"""The Node and Lease objects of a virtual node, and its capacity (pure: no I/O).

Contract:
* :func:`node_name` is ``<prefix><provider>`` (``anex-vastai``); the Node carries the labels
  ``node-provider: <provider>``, ``type: virtual-kubelet``, ``kubernetes.io/os: linux``,
  ``kubernetes.io/arch: amd64``, ``kubernetes.io/role: agent``, ``kubernetes.io/hostname`` and
  the taint ``virtual-kubelet.io/provider=<provider>:NoSchedule`` (:func:`node_object`).
* :func:`node_status` is the status subresource as a merge patch: capacity and allocatable,
  the conditions (``Ready`` True only while the coordinator answers; no memory, disk or PID
  pressure: each pod gets a machine of its own), the addresses (InternalIP: where the API
  server reaches the virtual node; Hostname), ``daemonEndpoints.kubeletEndpoint.Port``,
  ``nodeInfo``. Conditions keep ``lastTransitionTime`` while their status stays the same.
* :func:`capacity_from_offers` sums what the provider can rent now (``GET /v1/offers``:
  GPUs, CPU cores, RAM of every listed offer); :class:`Capacity` holds the configured
  fallback used while the offers cannot be read.
* :func:`lease_object` is the node's ``coordination.k8s.io/v1`` Lease in ``kube-node-lease``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from anex_agent import __version__

LEASE_NAMESPACE = "kube-node-lease"
LEASE_DURATION = 40  # seconds, as the kubelet's default (renewed every 10 s)
TAINT_KEY = "virtual-kubelet.io/provider"
GPU = "nvidia.com/gpu"
PROVIDER_LABEL = "node-provider"


@dataclass(frozen=True)
class Capacity:
    """What a node offers the scheduler: pods, CPU cores, memory (MiB), GPUs."""

    pods: int
    cpu: int
    memory_mib: int
    gpus: int

    def resources(self) -> dict[str, str]:
        return {"pods": str(self.pods), "cpu": str(self.cpu), "memory": f"{self.memory_mib}Mi", GPU: str(self.gpus)}


def node_name(prefix: str, provider: str) -> str:
    return f"{prefix}{provider}"


def micro_time(when: datetime) -> str:
    """``metav1.MicroTime``: RFC 3339 in UTC with microseconds."""
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def kube_time(when: datetime) -> str:
    return when.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def labels(name: str, provider: str) -> dict[str, str]:
    return {PROVIDER_LABEL: provider, "type": "virtual-kubelet", "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64", "kubernetes.io/role": "agent", "kubernetes.io/hostname": name}


def taints(provider: str) -> list[dict[str, str]]:
    return [{"key": TAINT_KEY, "value": provider, "effect": "NoSchedule"}]


def node_object(name: str, provider: str) -> dict[str, Any]:
    """A new Node (its status comes with :func:`node_status`)."""
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": labels(name, provider)},
            "spec": {"taints": taints(provider)}}


def node_patch(name: str, provider: str, node: Mapping[str, Any]) -> dict[str, Any] | None:
    """A merge patch that puts our labels and taint back on an existing Node (None: nothing to do).

    Taints others added (the node lifecycle controller's ``not-ready``) are kept."""
    meta_labels = (node.get("metadata") or {}).get("labels") or {}
    wanted = labels(name, provider)
    patch: dict[str, Any] = {}
    if any(meta_labels.get(k) != v for k, v in wanted.items()):
        patch["metadata"] = {"labels": wanted}
    present = (node.get("spec") or {}).get("taints") or []
    ours = taints(provider)[0]
    if not any(t.get("key") == TAINT_KEY and t.get("value") == ours["value"] and t.get("effect") == ours["effect"]
               for t in present):
        patch["spec"] = {"taints": [t for t in present if t.get("key") != TAINT_KEY] + [ours]}
    return patch or None


def _condition(kind: str, ok: bool, reason: str, message: str, before: Mapping[str, Mapping[str, Any]],
               now: str) -> dict[str, Any]:
    status = "True" if ok else "False"
    old = before.get(kind) or {}
    since = old.get("lastTransitionTime") if old.get("status") == status and old.get("lastTransitionTime") else now
    return {"type": kind, "status": status, "reason": reason, "message": message, "lastHeartbeatTime": now,
            "lastTransitionTime": since}


def node_status(node: Mapping[str, Any] | None, capacity: Capacity, *, coordinator_ok: bool, why: str,
                internal_ip: str, kubelet_port: int, name: str, now: datetime) -> dict[str, Any]:
    """The node's status (see the module docstring); ``why`` says how the coordinator answered."""
    before = {c.get("type"): c for c in ((node or {}).get("status") or {}).get("conditions") or []}
    stamp = kube_time(now)
    conditions = [
        _condition("Ready", coordinator_ok, "CoordinatorReachable" if coordinator_ok else "CoordinatorUnreachable",
                   why, before, stamp),
        _condition("MemoryPressure", False, "MachinePerPod", "each pod runs on a machine of its own", before, stamp),
        _condition("DiskPressure", False, "MachinePerPod", "each pod runs on a machine of its own", before, stamp),
        _condition("PIDPressure", False, "MachinePerPod", "each pod runs on a machine of its own", before, stamp),
        _condition("NetworkUnavailable", False, "Mesh", "pods are reached through the mesh", before, stamp),
    ]
    resources = capacity.resources()
    return {"capacity": resources, "allocatable": resources, "conditions": conditions,
            "addresses": [{"type": "InternalIP", "address": internal_ip}, {"type": "Hostname", "address": name}],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": kubelet_port}},
            "nodeInfo": {"machineID": name, "systemUUID": name, "bootID": "", "kernelVersion": "",
                         "osImage": "rented machines (anex-agent)", "containerRuntimeVersion": "anex://" + __version__,
                         "kubeletVersion": f"anex-agent-{__version__}", "kubeProxyVersion": "",
                         "operatingSystem": "linux", "architecture": "amd64"}}


def _finite(value: Any) -> float:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 0.0
    return number if math.isfinite(number) and number > 0 else 0.0


def capacity_from_offers(offers: list[Mapping[str, Any]], *, pods: int) -> Capacity:
    """The sum of the listed offers' GPUs, CPU cores and RAM (``offers[].specs`` of ``GET /v1/offers``)."""
    gpus = cpu = ram = 0.0
    for offer in offers:
        specs = offer.get("specs") or {}
        gpus += _finite(specs.get("gpu_count"))
        cpu += _finite(specs.get("cpu_cores"))
        ram += _finite(specs.get("ram_mb"))
    return Capacity(pods=pods, cpu=int(cpu), memory_mib=int(ram), gpus=int(gpus))


def lease_object(name: str, node_uid: str | None, now: datetime, *, resource_version: str | None = None
                 ) -> dict[str, Any]:
    """The node's Lease, renewed now (owned by the Node, so it goes with it)."""
    meta: dict[str, Any] = {"name": name, "namespace": LEASE_NAMESPACE}
    if node_uid:
        meta["ownerReferences"] = [{"apiVersion": "v1", "kind": "Node", "name": name, "uid": node_uid}]
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta,
            "spec": {"holderIdentity": name, "leaseDurationSeconds": LEASE_DURATION, "renewTime": micro_time(now)}}
