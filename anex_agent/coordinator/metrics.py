"""Prometheus metrics of one coordinator process, and the fleet's, kept apart.

* ``registry``: the coordinator's own process metrics (requests, latency, heartbeats,
  watchers, node counts by state, the process's memory and CPU). Nothing in it names a
  node, a host or a GPU; ``/metrics`` serves it to anyone.
* ``fleet``: metrics about the nodes (per-node names, hostnames, GPU UUIDs). ``/metrics``
  adds them only for a caller presenting the admin token or the metrics token
  (``--metrics-token-file`` / ``ANEX_METRICS_TOKEN``) as a bearer token.

Extension point: other parts add a collector with ``ctx.metrics.add_collector(collector)``
(fleet side); ``collector.collect()`` is called on each authorised scrape of ``/metrics``
(keep it cheap: read cached values, no database calls). A part that renders its series
itself adds ``ctx.metrics.add_text_source(render)``: ``render()`` returns exposition-format
bytes, appended as they are (fleet side too). A part whose cache is brought up to date by
the scrape itself adds ``ctx.metrics.add_before_fleet_scrape(refresh)``: ``await refresh()``
runs before an authorised scrape is rendered (so nothing reads the database while nobody
scrapes).
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from pathlib import Path

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector, generate_latest

from anex_agent.errors import ConfigError

MIN_TOKEN_LENGTH = 16


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.fleet = CollectorRegistry(auto_describe=True)
        self._text_sources: list[Callable[[], bytes]] = []
        self._before_fleet_scrape: list[Callable[[], Awaitable[None]]] = []
        ProcessCollector(registry=self.registry)
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
        self.watch_resyncs = Counter(
            "anex_coordinator_watch_resyncs", "watch streams closed because the watcher could not keep up",
            registry=self.registry,
        )
        self.nodes = Gauge("anex_coordinator_nodes", "nodes by state (all coordinators)", ["state"], registry=self.registry)
        self.gateways = Gauge("anex_coordinator_gateways", "registered gateways, those marked gone left out", registry=self.registry)
        self.changes_delivered = Counter(
            "anex_coordinator_changes", "change-log entries seen by this process", registry=self.registry
        )

    def add_collector(self, collector) -> None:
        """A fleet collector (served only to the admin or metrics token)."""
        self.fleet.register(collector)

    def add_text_source(self, render: Callable[[], bytes]) -> None:
        """Fleet series ``render()`` returns already in the text format (admin or metrics token only)."""
        self._text_sources.append(render)

    def add_before_fleet_scrape(self, refresh: Callable[[], Awaitable[None]]) -> None:
        """``await refresh()`` before each authorised scrape is rendered (see the module docstring)."""
        self._before_fleet_scrape.append(refresh)

    async def prepare_fleet_scrape(self) -> None:
        """Run the refreshes registered with :meth:`add_before_fleet_scrape`."""
        for refresh in self._before_fleet_scrape:
            await refresh()

    def exposition(self, *, fleet: bool) -> bytes:
        """The ``/metrics`` body: process metrics, plus the fleet's when ``fleet``."""
        body = generate_latest(self.registry)
        if not fleet:
            return body
        return b"".join([body, generate_latest(self.fleet), *(render() for render in self._text_sources)])


def load_metrics_token(path: Path | None, environ: dict[str, str] | None = None) -> str | None:
    """The metrics token: the first line of ``path`` (mode 0600 or stricter), else
    ``ANEX_METRICS_TOKEN``, else None (then only the admin token sees fleet metrics)."""
    env = os.environ if environ is None else environ
    if path is not None:
        try:
            mode = path.stat().st_mode & 0o777
            token = path.read_text().strip()
        except OSError as err:
            raise ConfigError("--metrics-token-file", f"cannot read {path}: {err.strerror}") from None
        if mode & 0o077:
            raise ConfigError("--metrics-token-file", f"{path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        source = "--metrics-token-file"
    else:
        token = env.get("ANEX_METRICS_TOKEN", "").strip()
        source = "ANEX_METRICS_TOKEN"
        if not token:
            return None
    if len(token) < MIN_TOKEN_LENGTH:
        raise ConfigError(source, f"the metrics token is too short; use at least {MIN_TOKEN_LENGTH} random characters")
    return token
