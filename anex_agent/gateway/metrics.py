"""The gateway's Prometheus metrics, served on ``--metrics-listen IP:PORT`` (``GET /metrics``).

Who may connect: whoever reaches that address; there is no token. Bind it to loopback or
to an address only the cluster's Prometheus reaches. The series hold counts and timings
only: no key, node name or address. Off by default.

    anex_gateway_peers                          peers in the hub's set
    anex_gateway_peer_set_version               version of the set (the coordinator's change feed)
    anex_gateway_changes_total{type}            watch events applied (peer_added, peer_removed, snapshot)
    anex_gateway_apply_seconds                  applying one event to the hub (histogram; a snapshot includes its whole save)
    anex_gateway_apply_errors_total             events the engine could not apply (logged)
    anex_gateway_watch_connected                1 while the watch stream is open
    anex_gateway_journal_lines                  changes in the state dir's journal since its snapshot
    anex_gateway_relay_connections              WebSocket relay: authenticated connections open (with --ws-listen)
    anex_gateway_relay_pending                  WebSocket relay: connections waiting for authentication
    anex_gateway_relay_nodes                    WebSocket relay: nodes connected
    anex_gateway_relay_accepted_total           WebSocket relay: connections accepted
    anex_gateway_relay_refused_total{reason}    full (max nodes), protocol, auth (no valid proof), source
                                                (too many waiting from one address), evicted (the oldest
                                                waiting, dropped for a newer one), timeout (no proof in time)
    anex_gateway_relay_datagrams_total{direction} to_hub, to_node, dropped_to_node, dropped_handshake_to_hub
                                                (a node's handshake messages past its relay budget)

plus the process's own (``process_*``). Gauges are read at scrape time from the gateway's
state; a scrape never calls the engine or the coordinator.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from anex_agent.net.http.server import MetricsEndpoint

if TYPE_CHECKING:
    from anex_agent.gateway.service import Gateway

APPLY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RELAY_REFUSALS = ("full", "protocol", "auth", "source", "evicted", "timeout")
RELAY_DIRECTIONS = ("to_hub", "to_node", "dropped_to_node", "dropped_handshake_to_hub")


class _Live(Collector):
    """What is read from the gateway at scrape time."""

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    def describe(self) -> Iterator:
        return iter(())

    def collect(self) -> Iterator:
        gateway = self.gateway
        yield GaugeMetricFamily("anex_gateway_peers", "peers in the hub's set", value=len(gateway.book.peers))
        yield GaugeMetricFamily("anex_gateway_peer_set_version", "version of the hub's peer set",
                                value=gateway.book.version)
        yield GaugeMetricFamily("anex_gateway_watch_connected", "1 while the watch stream is open",
                                value=1.0 if gateway.link.client.watch_connected else 0.0)
        yield GaugeMetricFamily("anex_gateway_journal_lines", "changes journaled since the state dir's snapshot",
                                value=gateway.state.journal_lines)
        relay = gateway.relay
        if relay is None:
            return
        report = relay.report()
        yield GaugeMetricFamily("anex_gateway_relay_connections", "authenticated WebSocket relay connections open",
                                value=report["live"])
        yield GaugeMetricFamily("anex_gateway_relay_pending", "WebSocket relay connections waiting for authentication",
                                value=report.get("pending", 0))
        yield GaugeMetricFamily("anex_gateway_relay_nodes", "nodes connected to the WebSocket relay",
                                value=report["nodes"])
        yield CounterMetricFamily("anex_gateway_relay_accepted", "WebSocket relay connections accepted",
                                  value=report.get("accepted", 0))
        refused = CounterMetricFamily("anex_gateway_relay_refused", "WebSocket relay connections refused",
                                      labels=["reason"])
        for reason in RELAY_REFUSALS:
            refused.add_metric([reason], report.get(f"refused_{reason}", 0))
        yield refused
        datagrams = CounterMetricFamily("anex_gateway_relay_datagrams", "WireGuard datagrams through the relay",
                                        labels=["direction"])
        for direction in RELAY_DIRECTIONS:
            datagrams.add_metric([direction], report.get(direction, 0))
        yield datagrams


class GatewayMetrics(MetricsEndpoint):
    """The gateway's registry: counters it updates as it applies events, gauges read live."""

    def __init__(self, gateway: Gateway) -> None:
        super().__init__("gateway-metrics")
        self.registry = registry = CollectorRegistry()
        self.changes = Counter("anex_gateway_changes", "watch events applied to the hub", ["type"],
                               registry=registry)
        self.apply_seconds = Histogram("anex_gateway_apply_seconds", "time to apply one watch event to the hub",
                                       buckets=APPLY_BUCKETS, registry=registry)
        self.apply_errors = Counter("anex_gateway_apply_errors", "watch events the engine could not apply",
                                    registry=registry)
        registry.register(_Live(gateway))
        ProcessCollector(registry=registry)

