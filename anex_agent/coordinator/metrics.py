"""Prometheus metrics of one coordinator process, in its own registry.

Extension point: other parts (GPU fleet metrics, issue 5) add a collector with
``ctx.metrics.add_collector(collector)``; ``collector.collect()`` is called on each
scrape of ``/metrics`` (keep it cheap: read cached values, no database calls).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "anex_coordinator_http_requests", "HTTP requests by route and status", ["route", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "anex_coordinator_http_request_seconds", "HTTP request latency by route", ["route"],
            buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=self.registry,
        )
        self.heartbeats = Counter("anex_coordinator_heartbeats", "heartbeats received", registry=self.registry)
        self.joins = Counter("anex_coordinator_joins", "successful node joins (incl. re-joins)", registry=self.registry)
        self.watchers = Gauge("anex_coordinator_watchers", "connected watch streams", registry=self.registry)
        self.nodes = Gauge("anex_coordinator_nodes", "nodes by state (all coordinators)", ["state"], registry=self.registry)
        self.gateways = Gauge("anex_coordinator_gateways", "registered gateways", registry=self.registry)
        self.changes_delivered = Counter(
            "anex_coordinator_changes", "change-log entries seen by this process", registry=self.registry
        )

    def add_collector(self, collector) -> None:
        self.registry.register(collector)
