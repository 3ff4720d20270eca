"""The agent's Prometheus collector renders what the supervisor last saw."""

from types import SimpleNamespace

from prometheus_client import CollectorRegistry, generate_latest

from anex_agent.agent.metrics import AgentCollector
from anex_agent.wire.heartbeat import TransportStatus


def render(agent) -> str:
    registry = CollectorRegistry()
    registry.register(AgentCollector(agent))
    return generate_latest(registry).decode()


def test_full_state():
    agent = SimpleNamespace(
        last_transport=TransportStatus(engine="wireguard-go", path="udp", last_handshake_age=4.5, rx_bytes=1000, tx_bytes=2000),
        dataplane=SimpleNamespace(config=SimpleNamespace(version=7), forwards=SimpleNamespace(active={5000: "a:1", 6000: "b:2"}, refused={6000: 3}),
                                  proxy=SimpleNamespace(refused=5), socks=None),
        identity=SimpleNamespace(node_id="n-1"),
        coordinator_reachable=False,
    )
    text = render(agent)
    assert 'anex_agent_info{engine="wireguard-go",node_id="n-1",path="udp"} 1.0' in text
    assert "anex_agent_handshake_age_seconds 4.5" in text
    assert "anex_agent_received_bytes_total 1000.0" in text and "anex_agent_sent_bytes_total 2000.0" in text
    assert "anex_agent_coordinator_reachable 0.0" in text
    assert "anex_agent_config_version 7.0" in text and "anex_agent_forwards 2.0" in text
    assert 'anex_agent_forward_refused_connections_total{port="6000"} 3.0' in text
    assert 'anex_agent_proxy_refused_connections_total{proxy="http"} 5.0' in text
    assert 'proxy="socks5"' not in text  # no SOCKS5 proxy: no series


async def test_a_proxy_past_its_limit_counts_the_refusal_on_metrics():
    """A real HTTP proxy with room for one client: the second is closed at once, and /metrics says so."""
    import asyncio

    from anex_agent.frontends.proxy import ProxyServer
    from anex_agent.net.dialer import OSDialer
    from tests.polling import wait_until

    async with ProxyServer(OSDialer(), host="127.0.0.1", port=0, max_connections=1) as proxy:
        agent = SimpleNamespace(last_transport=None, identity=None, coordinator_reachable=None,
                                dataplane=SimpleNamespace(config=None, forwards=None, proxy=proxy, socks=None))
        assert 'anex_agent_proxy_refused_connections_total{proxy="http"} 0.0' in render(agent)
        first = await asyncio.open_connection(*proxy.address)
        await wait_until(lambda: proxy._sessions, what="the first client being served")
        second = await asyncio.open_connection(*proxy.address)
        assert await second[0].read() == b""  # closed at once
        await wait_until(lambda: proxy.refused == 1, what="the refusal counted")
        assert 'anex_agent_proxy_refused_connections_total{proxy="http"} 1.0' in render(agent)
        for _reader, writer in (first, second):
            writer.close()


def test_before_anything_is_up():
    agent = SimpleNamespace(last_transport=None, dataplane=None, identity=None, coordinator_reachable=None)
    text = render(agent)
    assert "anex_agent_info" in text
    assert "handshake" not in text and "reachable" not in text
