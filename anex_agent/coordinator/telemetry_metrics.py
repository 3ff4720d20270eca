"""Fleet GPU metrics on the coordinator's ``/metrics``: every node's latest telemetry, DCGM names.

Each node's latest heartbeat telemetry (``nodes.telemetry``, the block of
:mod:`anex_agent.gpu.telemetry`) is rendered by the agent's own renderer
(:func:`anex_agent.gpu.exposition.metric_families`) with two more labels, ``node`` (the
node's name) and ``node_id``, so a dashboard built for dcgm-exporter works on the whole
fleet by adding ``node`` to its queries. Added here:
``anex_fleet_node_telemetry_age_seconds{node,node_id}`` (now minus the sample time) and
``anex_fleet_nodes_with_telemetry``.

Contract:
* A background task (``gpu-fleet-metrics``) reads the table every ``REFRESH_INTERVAL``
  seconds into memory; ``collect()`` renders that cache (no database call on a scrape).
  Expired nodes are left out. A failed refresh keeps the previous cache and is logged once
  per distinct error; it never ends the coordinator's TaskGroup.
* Telemetry that is not the agent's shape is skipped field by field (it is opaque JSON
  from nodes): a broken node cannot break the scrape of the others.

Hooked in through the coordinator's documented extension point: this module is listed in
``anex_agent.coordinator.app.ROUTE_MODULES``; its :func:`setup` declares no routes, adds the
collector with ``ctx.metrics.add_collector`` and the refresh task with ``ctx.add_background``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Callable, Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from anex_agent.gpu.exposition import metric_families

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 5.0  # seconds; Prometheus scrapes every 15 s by default

_SELECT = "SELECT id, name, telemetry FROM nodes WHERE telemetry IS NOT NULL AND state <> 'expired' ORDER BY name, id"


class FleetTelemetry:
    """The cache: node id -> (name, telemetry dict). Refreshed from the database."""

    def __init__(self, db: Any, clock: Callable[[], float]) -> None:
        self._db = db
        self._clock = clock
        self.nodes: dict[str, tuple[str, dict[str, Any]]] = {}
        self._errors_logged: set[str] = set()

    async def refresh(self) -> int:
        """Reload every node's latest telemetry; returns how many nodes have some."""
        rows = await self._db.fetch(_SELECT)
        nodes: dict[str, tuple[str, dict[str, Any]]] = {}
        for row in rows:
            raw = row["telemetry"]
            try:
                telemetry = json.loads(raw) if isinstance(raw, str) else raw
            except ValueError:
                continue
            if isinstance(telemetry, dict):
                nodes[str(row["id"])] = (str(row["name"]), telemetry)
        self.nodes = nodes
        return len(nodes)

    async def run(self, interval: float | None = None) -> None:
        while True:
            try:
                await self.refresh()
            except Exception as exc:  # keep the old cache; never take the coordinator down
                message = f"{type(exc).__name__}: {exc}"
                if message not in self._errors_logged:
                    self._errors_logged.add(message)
                    log.warning("refreshing fleet GPU metrics failed: %s (logged once)", message)
            await asyncio.sleep(REFRESH_INTERVAL if interval is None else interval)


class FleetGpuCollector(Collector):
    def __init__(self, fleet: FleetTelemetry) -> None:
        self.fleet = fleet

    def describe(self) -> Iterator[Metric]:
        return iter(())  # series depend on the fleet; skip the registry's duplicate-name check

    def collect(self) -> Iterator[Metric]:
        nodes = self.fleet.nodes
        merged: dict[str, Metric] = {}
        for node_id, (name, telemetry) in nodes.items():
            try:  # one node at a time: a block that does not render drops that node only
                families = metric_families([({"node": name, "node_id": node_id}, telemetry)])
            except Exception:
                continue
            for family in families:
                if family.name in merged:
                    merged[family.name].samples.extend(family.samples)
                else:
                    merged[family.name] = family
        age = GaugeMetricFamily("anex_fleet_node_telemetry_age_seconds", "Seconds since the node's latest telemetry sample",
                                labels=["node", "node_id"])
        now = self.fleet._clock()
        for node_id, (name, telemetry) in nodes.items():
            taken = telemetry.get("taken_at")
            if isinstance(taken, (int, float)):
                age.add_metric([name, node_id], max(0.0, now - float(taken)))
        count = GaugeMetricFamily("anex_fleet_nodes_with_telemetry", "Nodes (not expired) that sent telemetry",
                                  value=len(nodes))
        return iter([*merged.values(), age, count])


def setup(registry: Any, ctx: Any) -> None:
    """Coordinator extension hook: collector on ``ctx.metrics``, refresh task on ``ctx``'s TaskGroup."""
    fleet = FleetTelemetry(ctx.db, ctx.clock)
    ctx.metrics.add_collector(FleetGpuCollector(fleet))
    ctx.add_background("gpu-fleet-metrics", fleet.run)
