"""Fleet GPU metrics on the coordinator's ``/metrics``: every node's latest telemetry, DCGM names.

Each node's latest heartbeat telemetry (``nodes.telemetry``, the JSON form of
:class:`anex_agent.telemetry.models.Telemetry`) is rendered by the renderer the agent uses too
(:func:`anex_agent.telemetry.exposition.metric_families`) with two more labels, ``node`` (the
node's name) and ``node_id``, so a dashboard built for dcgm-exporter works on the whole
fleet by adding ``node`` to its queries, or unchanged when Prometheus copies ``node`` into
``instance`` (``metric_relabel_configs``, docs/telemetry.md): every per-node series has ``node``.
Label spelling and the deprecated PCIe pair follow ``ctx.settings.gpu_metrics``
(:mod:`anex_agent.telemetry.options`). Added here:
``anex_fleet_node_telemetry_age_seconds{node,node_id}`` (now minus the sample time) and
``anex_fleet_nodes_with_telemetry``.

Served only to a scrape presenting the admin or metrics token (see :mod:`anex_agent.coordinator.metrics`).

Contract:
* The cache is brought up to date by the scrapes themselves, never by a timer: before an
  authorised scrape is rendered, :meth:`FleetTelemetry.ensure_fresh` refreshes it when the
  last refresh is older than ``REFRESH_INTERVAL`` seconds (concurrent scrapes share one
  refresh). So a coordinator nobody scrapes reads nothing (with 150,000 nodes a refresh
  reads every node's row and the telemetry of each node heard from since: a timer doing
  that every few seconds was what most delayed heartbeats at that size), and one scraped
  every 15 s refreshes once per scrape. A refresh: one query of ``(id, name,
  last_heartbeat_at)``, then the telemetry of only the nodes whose heartbeat time or name
  changed since the last look. The cache keeps
  each node's telemetry as the compact JSON text the node sent (bounded by
  :mod:`anex_agent.telemetry.bounds`), not as parsed objects: memory is about the sum of
  the nodes' telemetry sizes and does not grow with the number of heartbeats.
  :func:`exposition` parses and renders that cache, one node at a time.
  Expired nodes are left out. A failed refresh keeps what the cache has and is logged once
  per distinct error; the scrape is still answered from the cache.
* Telemetry is validated when it arrives; a stored block that is not of the model's shape
  anyway (stored by an older coordinator) is skipped field by field: a broken node cannot
  break the scrape of the others.

Hooked in through the coordinator's documented extension point: this module is listed in
``anex_agent.coordinator.app.ROUTE_MODULES``; its :func:`setup` declares no routes, adds the
renderer with ``ctx.metrics.add_text_source`` and the refresh with
``ctx.metrics.add_before_fleet_scrape``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any, Callable, Iterator

from prometheus_client import generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric

from anex_agent.telemetry.exposition import metric_families
from anex_agent.telemetry.options import DEFAULT, ExpositionOptions

log = logging.getLogger(__name__)

REFRESH_INTERVAL = 5.0  # seconds; Prometheus scrapes every 15 s by default

_INDEX = ("SELECT id, name, last_heartbeat_at FROM nodes WHERE telemetry IS NOT NULL AND state <> 'expired'"
          " ORDER BY name, id")
_BATCH = 500  # node ids per telemetry query


def _telemetry_query(count: int) -> str:
    return f"SELECT id, telemetry FROM nodes WHERE id IN ({', '.join(f'${i}' for i in range(1, count + 1))})"


class FleetTelemetry:
    """The cache: node id -> (name, heartbeat time, telemetry JSON text). Refreshed from the database."""

    def __init__(self, db: Any, clock: Callable[[], float], *, monotonic: Callable[[], float] = time.monotonic) -> None:
        self._db = db
        self._clock = clock
        self._monotonic = monotonic  # the age of the cache (ensure_fresh)
        self.nodes: dict[str, tuple[str, Any, str]] = {}
        self.fetched_total = 0  # telemetry rows read so far (unchanged nodes are not re-read)
        self._errors_logged: set[str] = set()
        self.refreshed_at: float | None = None  # when ensure_fresh last refreshed (or tried to)
        self._lock: asyncio.Lock | None = None

    async def refresh(self) -> int:
        """Bring the cache up to date; returns how many nodes have telemetry.

        Updated in place, batch by batch: a node's old text is released as its new one
        arrives, so a refresh never holds two copies of the fleet's telemetry."""
        rows = await self._db.fetch(_INDEX)
        index = {str(r["id"]): (str(r["name"]), r["last_heartbeat_at"]) for r in rows}
        nodes = self.nodes
        for gone in [node_id for node_id in nodes if node_id not in index]:
            del nodes[gone]
        changed = [node_id for node_id, key in index.items() if (entry := nodes.get(node_id)) is None or entry[:2] != key]
        for start in range(0, len(changed), _BATCH):
            batch = changed[start:start + _BATCH]
            for row in await self._db.fetch(_telemetry_query(len(batch)), *batch):
                node_id, raw = str(row["id"]), row["telemetry"]
                if raw is None:
                    nodes.pop(node_id, None)
                    continue
                nodes[node_id] = (*index[node_id], raw if isinstance(raw, str) else json.dumps(raw))
                self.fetched_total += 1
        return len(nodes)

    def parsed(self) -> Iterator[tuple[str, str, dict[str, Any]]]:
        """``(node id, name, telemetry)`` for every cached node whose telemetry is a JSON object."""
        for node_id, (name, _stamp, raw) in self.nodes.items():
            try:
                telemetry = json.loads(raw)
            except ValueError:
                continue
            if isinstance(telemetry, dict):
                yield node_id, name, telemetry

    async def ensure_fresh(self, max_age: float | None = None) -> None:
        """Refresh when the last refresh is older than ``max_age`` seconds (default
        ``REFRESH_INTERVAL``), or there was none;
        concurrent callers wait for the same refresh. A failure keeps the cache and is logged once
        per distinct error."""
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            now = self._monotonic()
            if self.refreshed_at is not None and now - self.refreshed_at < (REFRESH_INTERVAL if max_age is None else max_age):
                return
            try:
                await self.refresh()
            except Exception as exc:  # keep the old cache; the scrape is answered from it
                message = f"{type(exc).__name__}: {exc}"
                if message not in self._errors_logged:
                    self._errors_logged.add(message)
                    log.warning("refreshing fleet GPU metrics failed: %s (logged once)", message)
            self.refreshed_at = now


class _One:
    """A collector of one family (what ``generate_latest`` needs)."""

    def __init__(self, *families: Metric) -> None:
        self.families = families

    def collect(self) -> Iterator[Metric]:
        return iter(self.families)


def exposition(fleet: FleetTelemetry, options: ExpositionOptions = DEFAULT) -> bytes:
    """The fleet's series in the Prometheus text format.

    Rendered one node at a time straight to text, each family's lines gathered under one
    ``# HELP``/``# TYPE`` header: the scrape holds the output and one node's objects, never
    every node's sample objects at once."""
    headers: dict[str, bytes] = {}
    lines: dict[str, list[bytes]] = {}
    age = GaugeMetricFamily("anex_fleet_node_telemetry_age_seconds", "Seconds since the node's latest telemetry sample",
                            labels=["node", "node_id"])
    now = fleet._clock()
    count = 0
    for node_id, name, telemetry in fleet.parsed():
        count += 1
        taken = telemetry.get("taken_at")
        if isinstance(taken, (int, float)):
            age.add_metric([name, node_id], max(0.0, now - float(taken)))
        try:  # one node at a time: a block that does not render drops that node only
            families = metric_families([({"node": name, "node_id": node_id}, telemetry)], options)
        except Exception:
            continue
        for family in families:
            text = generate_latest(_One(family))
            help_line, type_line, body = text.split(b"\n", 2)
            if family.name not in headers:
                headers[family.name] = help_line + b"\n" + type_line + b"\n"
                lines[family.name] = []
            lines[family.name].append(body)
    total = GaugeMetricFamily("anex_fleet_nodes_with_telemetry", "Nodes (not expired) that sent telemetry", value=count)
    return b"".join([chunk for name in headers for chunk in (headers[name], *lines[name])]) + generate_latest(_One(age, total))


def setup(registry: Any, ctx: Any) -> None:
    """Coordinator extension hook: fleet text on ``ctx.metrics``, refreshed before each authorised scrape."""
    fleet = FleetTelemetry(ctx.db, ctx.clock)
    options = getattr(getattr(ctx, "settings", None), "gpu_metrics", None) or DEFAULT
    ctx.metrics.add_text_source(lambda: exposition(fleet, options))
    ctx.metrics.add_before_fleet_scrape(fleet.ensure_fresh)
