"""The gateway's Prometheus metrics: the flag, what a scrape shows, and who is told what."""

from __future__ import annotations

import asyncio
import socket
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.errors import ConfigError
from anex_agent.gateway.peers import PeerBook
from anex_agent.gateway.service import Gateway
from anex_agent.gateway.settings import build_settings
from anex_agent.wire.keys import encode_key
from anex_agent.wire.gateways import MeshPeer, PeerSet

URL = "http://127.0.0.1:8700"


def settings(**extra):
    return build_settings(coordinator_url=URL, token="t", endpoint="192.0.2.1:51820", **extra)


def test_the_flag_takes_an_ip_and_port_and_names_itself_when_bad():
    assert settings().metrics_listen is None  # off by default
    assert settings(metrics_listen="0.0.0.0:9101").metrics_listen == ("0.0.0.0", 9101)
    assert settings(metrics_listen=":9101").metrics_listen == ("127.0.0.1", 9101)  # no host: loopback
    for bad in ("prometheus:9101", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:²"):
        with pytest.raises(ConfigError) as info:
            settings(metrics_listen=bad)
        assert info.value.source == "--metrics-listen" and "must be HOST:PORT" in str(info.value)


class FakeRelay:
    """The relay's report, as :meth:`anex_agent.gateway.relay.Relay.report` gives it."""

    def report(self) -> dict:
        return {"live": 3, "pending": 11, "nodes": 2, "accepted": 7, "refused_auth": 4, "refused_source": 900,
                "refused_timeout": 35, "to_hub": 120, "to_node": 95}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int, path: str = "/metrics") -> tuple[int, str, dict]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
            return resp.status, resp.read().decode(), dict(resp.headers)
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode(), dict(err.headers)


def samples(text: str) -> dict:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


async def test_a_scrape_shows_the_peer_set_the_changes_and_the_relay(tmp_path):
    gateway = Gateway(settings(state_dir=str(tmp_path)))
    gateway.book = PeerBook.from_peer_set(PeerSet(version=42, peers=[
        MeshPeer(node_id=f"n{i}", name=f"secret-name-{i}", public_key=encode_key(bytes([i]) * 32),
                 allowed_ips=[f"10.254.0.{i + 2}/32"]) for i in range(5)]))
    gateway.metrics.changes.labels("peer_added").inc(5)
    gateway.metrics.apply_seconds.observe(0.0007)
    port = free_port()
    await gateway.metrics.serve("127.0.0.1", port)
    try:
        status, text, headers = await asyncio.to_thread(scrape, port)
        assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
        got = samples(text)
        assert got[("anex_gateway_peers", ())] == 5 and got[("anex_gateway_peer_set_version", ())] == 42
        assert got[("anex_gateway_changes_total", (("type", "peer_added"),))] == 5
        assert got[("anex_gateway_apply_seconds_bucket", (("le", "0.001"),))] == 1
        assert got[("anex_gateway_watch_connected", ())] == 0  # never connected in this test
        assert ("anex_gateway_relay_connections", ()) not in got  # no relay: no relay series
        assert "process_resident_memory_bytes" in text
        assert "secret-name" not in text and "10.254.0" not in text  # counts only: no names, no addresses

        gateway.relay = FakeRelay()
        got = samples((await asyncio.to_thread(scrape, port))[1])
        assert got[("anex_gateway_relay_connections", ())] == 3 and got[("anex_gateway_relay_nodes", ())] == 2
        assert got[("anex_gateway_relay_accepted_total", ())] == 7
        assert got[("anex_gateway_relay_refused_total", (("reason", "auth"),))] == 4
        assert got[("anex_gateway_relay_refused_total", (("reason", "full"),))] == 0
        assert got[("anex_gateway_relay_pending", ())] == 11
        assert got[("anex_gateway_relay_refused_total", (("reason", "source"),))] == 900
        assert got[("anex_gateway_relay_refused_total", (("reason", "timeout"),))] == 35
        assert got[("anex_gateway_relay_datagrams_total", (("direction", "to_hub"),))] == 120

        assert (await asyncio.to_thread(scrape, port, "/status"))[0] == 404
    finally:
        await gateway.metrics.close()


async def test_a_port_in_use_is_an_error_naming_the_flag(tmp_path):
    gateway = Gateway(settings(state_dir=str(tmp_path)))
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(Exception, match=r"cannot serve metrics on 127\.0\.0\.1:\d+ \(--metrics-listen\)"):
            await gateway.metrics.serve("127.0.0.1", taken.getsockname()[1])
