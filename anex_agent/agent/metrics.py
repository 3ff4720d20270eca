"""The agent's own Prometheus metrics, read from what the supervisor last saw (never blocks a scrape).

Registered on :attr:`anex_agent.agent.api.AgentApi.registry` next to the GPU collectors.
Values come from :attr:`Agent.last_transport` (refreshed by each heartbeat and each
``/status``) and the current config; a scrape never calls the engine.

    anex_agent_info{engine,path,node_id}                1
    anex_agent_handshake_age_seconds                    seconds since the last gateway handshake (absent: never)
    anex_agent_received_bytes_total / _sent_bytes_total WireGuard bytes with the gateways
    anex_agent_coordinator_reachable                    1 / 0 (fail static when 0)
    anex_agent_config_version                           version of the config applied
    anex_agent_forwards                                 GW_TUNNEL + pushed forwards listening
    anex_agent_forward_refused_connections_total{port}  connections a forward port closed at once
                                                        (ANEX_FORWARD_MAX_CONNECTIONS already open)
    anex_agent_proxy_refused_connections_total{proxy}   connections the HTTP proxy (``http``) or the
                                                        SOCKS5 proxy (``socks5``) closed at once
                                                        (ANEX_PROXY_MAX_CONNECTIONS already open)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, InfoMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from anex_agent.agent.supervisor import Agent


class AgentCollector(Collector):
    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    def describe(self) -> Iterator:
        return iter(())

    def collect(self) -> Iterator:
        agent = self.agent
        transport = agent.last_transport
        dataplane = agent.dataplane
        info = InfoMetricFamily("anex_agent", "the node agent")
        info.add_metric(
            [],
            {
                "engine": transport.engine if transport else "",
                "path": transport.path if transport else "",
                "node_id": agent.identity.node_id if agent.identity else "",
            },
        )
        yield info
        if transport is not None:
            if transport.last_handshake_age is not None:
                yield GaugeMetricFamily("anex_agent_handshake_age_seconds", "seconds since the last gateway handshake", value=transport.last_handshake_age)
            yield CounterMetricFamily("anex_agent_received_bytes", "WireGuard bytes received from the gateways", value=transport.rx_bytes)
            yield CounterMetricFamily("anex_agent_sent_bytes", "WireGuard bytes sent to the gateways", value=transport.tx_bytes)
        if agent.coordinator_reachable is not None:
            yield GaugeMetricFamily("anex_agent_coordinator_reachable", "1 when the last coordinator call worked", value=1.0 if agent.coordinator_reachable else 0.0)
        if dataplane is not None and dataplane.config is not None:
            yield GaugeMetricFamily("anex_agent_config_version", "version of the applied node config", value=dataplane.config.version)
        if dataplane is not None and dataplane.forwards is not None:
            yield GaugeMetricFamily("anex_agent_forwards", "TCP forwards listening (GW_TUNNEL and pushed)", value=len(dataplane.forwards.active))
            refused = CounterMetricFamily("anex_agent_forward_refused_connections",
                                          "connections a forward port closed at once because its limit was open",
                                          labels=["port"])
            for port, count in sorted(dataplane.forwards.refused.items()):
                refused.add_metric([str(port)], count)
            yield refused
        proxies = [(name, server) for name, server in (("http", getattr(dataplane, "proxy", None)),
                                                       ("socks5", getattr(dataplane, "socks", None))) if server is not None]
        if proxies:
            refused = CounterMetricFamily("anex_agent_proxy_refused_connections",
                                          "connections a proxy closed at once because its limit was open",
                                          labels=["proxy"])
            for name, server in proxies:
                refused.add_metric([name], server.refused)
            yield refused
