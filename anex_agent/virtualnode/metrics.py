"""The virtual node's Prometheus metrics, served on ``--metrics-listen IP:PORT`` (``GET /metrics``).

Who may connect: whoever reaches that address; there is no token. Bind it to loopback or to an
address only the cluster's Prometheus reaches. The series hold counts and timings only: no pod
name, namespace or address. Off by default.

    anex_virtual_node_pods{phase}                       pods bound to our Nodes, by phase (Pending, Running,
                                                        Succeeded, Failed; read at scrape time)
    anex_virtual_node_pod_phase_seconds{phase}          time a pod spent in a phase, observed when it leaves
                                                        it (histogram)
    anex_virtual_node_pod_failures_total{reason}        pods that became Failed, by reason (ProvisioningFailed,
                                                        MachineLost, UnsupportedPodSpec,
                                                        ProvisioningRefused, Error, OOMKilled, ...)
    anex_virtual_node_provisions_created_total          provisions created for pods
    anex_virtual_node_provisions_deleted_total          provisions deleted (pod ended, deleted or gone)

plus the process's own (``process_*``). The pods gauge is read from the controller's cache; a
scrape never calls the API server or the coordinator.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from anex_agent.net.http.server import MetricsEndpoint

PHASES = ("Pending", "Running", "Succeeded", "Failed")
PHASE_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 24 * 3600)


class _Pods(Collector):
    """Pods by phase, counted at scrape time from ``pods()`` (uid -> pod)."""

    def __init__(self, pods: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.pods = pods

    def describe(self) -> Iterator:
        return iter(())

    def collect(self) -> Iterator:
        counts = dict.fromkeys(PHASES, 0)
        for pod in list(self.pods().values()):
            phase = (pod.get("status") or {}).get("phase") or "Pending"
            counts[phase] = counts.get(phase, 0) + 1
        family = GaugeMetricFamily("anex_virtual_node_pods", "pods bound to the virtual nodes, by phase",
                                   labels=["phase"])
        for phase, count in counts.items():
            family.add_metric([phase], count)
        yield family


class PodMetrics(MetricsEndpoint):
    """The controller's registry. :meth:`phase_written` is told each phase written for a pod."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__("virtual-node-metrics")
        self.clock = clock
        self.registry = registry = CollectorRegistry()
        self.phase_seconds = Histogram("anex_virtual_node_pod_phase_seconds", "time a pod spent in a phase",
                                       ["phase"], buckets=PHASE_BUCKETS, registry=registry)
        self.failures = Counter("anex_virtual_node_pod_failures", "pods that became Failed, by reason", ["reason"],
                                registry=registry)
        self.provisions_created = Counter("anex_virtual_node_provisions_created", "provisions created for pods",
                                          registry=registry)
        self.provisions_deleted = Counter("anex_virtual_node_provisions_deleted", "provisions deleted",
                                          registry=registry)
        ProcessCollector(registry=registry)
        self._phases: dict[str, tuple[str, float]] = {}  # uid -> (phase, since)

    def watch_pods(self, pods: Callable[[], dict[str, dict[str, Any]]]) -> None:
        self.registry.register(_Pods(pods))

    def phase_written(self, uid: str, phase: str, reason: str | None) -> None:
        """Observe the time in the pod's previous phase when ``phase`` differs; count a new failure."""
        now = self.clock()
        before = self._phases.get(uid)
        if before is not None and before[0] == phase:
            return
        if before is not None:
            self.phase_seconds.labels(before[0]).observe(max(0.0, now - before[1]))
        self._phases[uid] = (phase, now)
        if phase == "Failed":
            self.failures.labels(reason or "Unknown").inc()

    def forget(self, uid: str) -> None:
        """The pod is gone: the time in its last phase is observed."""
        before = self._phases.pop(uid, None)
        if before is not None:
            self.phase_seconds.labels(before[0]).observe(max(0.0, self.clock() - before[1]))



def failure_reason(status: dict[str, Any]) -> str | None:
    """The reason of a Failed status: the pod's, else its container's terminated reason."""
    if status.get("reason"):
        return status["reason"]
    for container in status.get("containerStatuses") or []:
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("reason"):
            return terminated["reason"]
    return None
