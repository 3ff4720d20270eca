"""The agent's Prometheus collector for its own GPU and host telemetry.

Rendering (dcgm-exporter's names and labels, ``anex_*`` metrics) is shared with the
coordinator's fleet ``/metrics``: :func:`anex_agent.telemetry.exposition.metric_families`.

Wiring (agent)::

    from anex_agent.gpu.exposition import register_collectors
    register_collectors(api.registry, monitor)     # monitor: TelemetryMonitor

The collector reads ``monitor.telemetry()`` only: a scrape never calls NVML and never
blocks the event loop.
"""

from __future__ import annotations

from typing import Any, Iterator, Protocol

from prometheus_client.core import Metric
from prometheus_client.registry import Collector, CollectorRegistry

from anex_agent.telemetry.exposition import DCGM_FIELDS, GPU_LABELS, metric_families
from anex_agent.telemetry.options import DEFAULT, ExpositionOptions

__all__ = ["DCGM_FIELDS", "GPU_LABELS", "GpuTelemetryCollector", "metric_families", "register_collectors"]


class SnapshotSource(Protocol):
    def telemetry(self) -> dict[str, Any] | None: ...


class GpuTelemetryCollector(Collector):
    """Collector for the agent's registry: renders ``source.telemetry()`` (cached; never calls NVML)."""

    def __init__(self, source: SnapshotSource, options: ExpositionOptions = DEFAULT) -> None:
        self.source = source
        self.options = options

    def describe(self) -> Iterator[Metric]:
        return iter(())  # names depend on what the GPUs support; skip the registry's duplicate check

    def collect(self) -> Iterator[Metric]:
        telemetry = self.source.telemetry()
        if telemetry is None:
            return iter(())
        return iter(metric_families([({}, telemetry)], self.options))


def register_collectors(registry: CollectorRegistry, telemetry_source: SnapshotSource,
                        options: ExpositionOptions | None = None) -> Collector:
    """Register the GPU/host collector on ``registry`` (the agent API's). Returns it (for unregister).

    ``options``: host label spelling and the deprecated PCIe pair (:mod:`anex_agent.telemetry.options`)."""
    collector = GpuTelemetryCollector(telemetry_source, options or DEFAULT)
    registry.register(collector)
    return collector
