"""What the workload is offered (WorkloadConfig) from NodeConfig + settings, and an engine's check of the settings."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from anex_agent.agent import engine_frontends
from anex_agent.agent.settings import AgentSettings, ListenAddress, TunnelSetting
from anex_agent.errors import ConfigError
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.tunnels.engines.registry import engine_classes
from anex_agent.tunnels.engines.wireproxy import WireproxyEngine, WireproxyOptions
from anex_agent.tunnels.engines.wireproxy_process import free_loopback_port
from anex_agent.wire.nodes import GatewayPeer, NodeConfig, TunnelSpec

GW = KeyPair(generate_private_key()).public_b64


def config(tunnels=()):
    return NodeConfig(node_id="n", version=3, address="10.254.0.7", network="10.254.0.0/16", mtu=1380, dns=["10.254.0.1"],
                      gateways=[GatewayPeer(id="g", public_key=GW, endpoint="192.0.2.1:51820", allowed_ips=["10.254.0.0/16"],
                                            mesh_address="10.254.0.1")],
                      tunnels=list(tunnels))


def settings(**kw):
    base = dict(coordinator_url="http://c", join_token="", state_dir=Path("/tmp/x"), engine="wireproxy",
                proxy_listen=ListenAddress("127.0.0.1", 4128))
    base.update(kw)
    return AgentSettings(**base)


def test_options_merge_local_and_pushed_tunnels_and_inbound_ports():
    local = TunnelSetting("GW_TUNNEL_5432", TunnelSpec(listen_port=5432, target="db.local:5432"))
    pushed = [TunnelSpec(listen_port=5432, target="pushed.loses:1"), TunnelSpec(listen_port=6379, target="redis:6379")]
    options = WireproxyOptions.from_workload(
        engine_frontends.workload_config(config(pushed), settings(tunnels=(local,), inbound_ports=(8000, 8888))),
        health_address="127.0.0.1:9999")
    assert options.proxy_address == "127.0.0.1:4128" and options.health_address == "127.0.0.1:9999"
    assert [(t.bind_address, t.target) for t in options.client_tunnels] == [("127.0.0.1:5432", "db.local:5432"),
                                                                            ("127.0.0.1:6379", "redis:6379")]
    assert [(t.listen_port, t.target) for t in options.server_tunnels] == [(8000, "127.0.0.1:8000"), (8888, "127.0.0.1:8888")]
    assert options.check_alive == ("10.254.0.1",) and options.dns == ("10.254.0.1",)


def test_inbound_udp_ports_reach_the_engine_and_wireproxy_starts_with_them_rendering_tcp_only():
    workload = engine_frontends.workload_config(config(), settings(inbound_ports=(8000,), inbound_udp_ports=(53,)))
    assert workload.inbound_ports == (8000,) and workload.inbound_udp_ports == (53,)
    engine_frontends.check_settings(settings(inbound_udp_ports=(53,)), WireproxyEngine)  # not refused: warned
    options = WireproxyOptions.from_workload(workload, health_address="127.0.0.1:9999")
    assert [t.listen_port for t in options.server_tunnels] == [8000]


def test_proxy_auth_is_refused_naming_the_variable():
    with pytest.raises(ConfigError) as err:
        engine_frontends.check_settings(settings(proxy_auth=object()), WireproxyEngine)
    assert err.value.source == "ANEX_PROXY_AUTH" and "wireproxy" in str(err.value)
    engine_frontends.check_settings(settings(), WireproxyEngine)
    for name, cls in engine_classes().items():  # engines that give a dialer: our proxy asks for the credentials
        if cls.frontends == "dialer":
            engine_frontends.check_settings(settings(proxy_auth=object()), cls)


def test_free_loopback_port_is_bindable():
    port = free_loopback_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
