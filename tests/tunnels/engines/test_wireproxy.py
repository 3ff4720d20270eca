"""wireproxy engine: exact config rendering, validation, 0600 file, /metrics parsing, and supervision
of a real child process (tests/tunnels/fake_wireproxy.py, a stand-in taking wireproxy's flags)."""

from __future__ import annotations

import asyncio
import dataclasses
import base64
import json
import os
import socket
import stat
import sys
from pathlib import Path

import pytest

from anex_agent.errors import ConfigError, EngineError
from anex_agent.tunnels.engines.config import DesiredConfig, Forward, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.registry import engine_classes
from anex_agent.tunnels.engines.wireproxy import (
    ClientTunnel,
    ServerTunnel,
    WireproxyEngine,
    WireproxyOptions,
    parse_metrics,
    render_config,
    write_config,
)
from tests.polling import wait_until

FAKE = Path(__file__).resolve().parents[1] / "fake_wireproxy.py"
PRIV = bytes(range(32))
PRIV_B64 = base64.b64encode(PRIV).decode()
GW_PUB = base64.b64encode(bytes(range(100, 132))).decode()
GW2_PUB = base64.b64encode(bytes(range(150, 182))).decode()
PSK = base64.b64encode(bytes([7]) * 32).decode()


def desired(endpoint: str = "gw.example.com:51820", **kw) -> DesiredConfig:
    return DesiredConfig(private_key=PRIV, listen_port=None, address="10.254.0.5/16", mtu=1400, peers=(
        PeerConfig(public_key=GW_PUB, endpoint=endpoint, allowed_ips=("10.254.0.0/16", "10.96.0.0/12"),
                   persistent_keepalive=25, **kw),))


OPTIONS = WireproxyOptions(
    proxy_address="127.0.0.1:3128", health_address="127.0.0.1:9080", dns=("10.254.254.1",),
    check_alive=("10.254.254.1",),
    client_tunnels=(ClientTunnel("127.0.0.1:5432", "db.default.svc.cluster.local:5432"),
                    ClientTunnel("127.0.0.1:6379", "10.96.0.20:6379")),
    server_tunnels=(ServerTunnel(8888, "127.0.0.1:8888"),),
)

GOLDEN = f"""\
# Written by anex-agent for wireproxy; holds a private key (mode 0600). Do not edit.
[Interface]
Address = 10.254.0.5/16
PrivateKey = {PRIV_B64}
DNS = 10.254.254.1
MTU = 1400
CheckAlive = 10.254.254.1

[Peer]
PublicKey = {GW_PUB}
Endpoint = gw.example.com:51820
AllowedIPs = 10.254.0.0/16, 10.96.0.0/12
PersistentKeepalive = 25

[http]
BindAddress = 127.0.0.1:3128

[TCPClientTunnel]
BindAddress = 127.0.0.1:5432
Target = db.default.svc.cluster.local:5432

[TCPClientTunnel]
BindAddress = 127.0.0.1:6379
Target = 10.96.0.20:6379

[TCPServerTunnel]
ListenPort = 8888
Target = 127.0.0.1:8888
"""


def test_render_golden():
    assert render_config(desired(), OPTIONS) == GOLDEN


def test_render_optional_fields():
    opts = WireproxyOptions(health_address="[::1]:9080", check_alive=("10.254.254.1", "fd00::1"), check_alive_interval=10)
    two = DesiredConfig(private_key=PRIV, listen_port=51999, address="fd00::5/64", mtu=1420, peers=(
        PeerConfig(public_key=GW_PUB, endpoint="[2001:db8::1]:51820", allowed_ips=("::/0",), preshared_key=PSK),
        PeerConfig(public_key=GW2_PUB, endpoint=None, allowed_ips=()),))
    assert render_config(two, opts) == f"""\
# Written by anex-agent for wireproxy; holds a private key (mode 0600). Do not edit.
[Interface]
Address = fd00::5/64
PrivateKey = {PRIV_B64}
ListenPort = 51999
MTU = 1420
CheckAlive = 10.254.254.1, fd00::1
CheckAliveInterval = 10

[Peer]
PublicKey = {GW_PUB}
PresharedKey = {PSK}
Endpoint = [2001:db8::1]:51820
AllowedIPs = ::/0

[Peer]
PublicKey = {GW2_PUB}

[http]
BindAddress = 127.0.0.1:3128
"""


@pytest.mark.parametrize("make,field", [
    (lambda: ClientTunnel("localhost:5432", "db:5432"), "bind_address"),
    (lambda: ClientTunnel("127.0.0.1:5432", "$HOME:5432"), "target"),
    (lambda: ClientTunnel("127.0.0.1:5432", "db:0"), "target"),
    (lambda: ClientTunnel("127.0.0.1:5432", "db\n[Peer]:5432"), "target"),
    (lambda: ServerTunnel(0, "127.0.0.1:80"), "listen_port"),
    (lambda: ServerTunnel(80, "fd00::1:80"), "target"),
    (lambda: WireproxyOptions(health_address="0.0.0.0:9080"), "health_address"),
    (lambda: WireproxyOptions(dns=("resolver.local",)), "dns"),
    (lambda: WireproxyOptions(check_alive=("10.0.0.300",)), "check_alive"),
    (lambda: WireproxyOptions(proxy_address="127.0.0.1:3128", client_tunnels=(ClientTunnel("127.0.0.1:3128", "a:1"),)),
     "client_tunnels"),
    (lambda: WireproxyOptions(server_tunnels=(ServerTunnel(80, "a:1"), ServerTunnel(80, "b:1"))), "server_tunnels"),
    (lambda: render_config(DesiredConfig(private_key=PRIV, listen_port=None, address="10.0.0.1/24", mtu=1420), OPTIONS), "peers"),
    (lambda: render_config(desired(endpoint="gw example:51820"), OPTIONS), "endpoint"),
    # other scripts' digits ('²' passes str.isdigit, '٣' and '５' pass int)
    (lambda: ClientTunnel("127.0.0.1:5432", "db:²"), "target"),
    (lambda: ClientTunnel("127.0.0.1:５４３２", "db:5432"), "bind_address"),
    (lambda: ServerTunnel(80, "127.0.0.1:٣"), "target"),
    (lambda: WireproxyOptions(health_address="127.0.0.1:①"), "health_address"),
    (lambda: render_config(desired(endpoint="gw.example.com:٥١٨٢٠"), OPTIONS), "endpoint"),
])
def test_validation_names_the_field(make, field):
    with pytest.raises(ConfigError) as info:
        make()
    assert field in info.value.source


def test_write_config_is_0600_even_over_a_loose_file(tmp_path):
    path = tmp_path / "sub" / "wireproxy.conf"
    path.parent.mkdir()
    path.write_text("old")
    path.chmod(0o644)
    write_config(path, GOLDEN)
    assert path.read_text() == GOLDEN
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["wireproxy.conf"]  # no temp file left


def test_parse_metrics_uapi_dump():
    pk1, pk2 = bytes(range(100, 132)), bytes(range(150, 182))
    text = (f"private_key=REDACTED\nlisten_port=51820\npublic_key={pk1.hex()}\npreshared_key=REDACTED\n"
            "protocol_version=1\nendpoint=192.0.2.1:51820\nlast_handshake_time_sec=1700000000\n"
            "last_handshake_time_nsec=500000000\ntx_bytes=1234\nrx_bytes=5678\npersistent_keepalive_interval=25\n"
            f"allowed_ip=10.254.0.0/16\nallowed_ip=10.96.0.1/12\npublic_key={pk2.hex()}\n"
            "last_handshake_time_sec=0\nlast_handshake_time_nsec=0\ntx_bytes=0\nrx_bytes=0\nfuture_key=whatever\n")
    port, peers = parse_metrics(text)
    assert port == 51820 and len(peers) == 2
    assert peers[0].public_key == base64.b64encode(pk1).decode()
    assert peers[0].endpoint == "192.0.2.1:51820" and peers[0].last_handshake == 1700000000.5
    assert (peers[0].tx_bytes, peers[0].rx_bytes) == (1234, 5678)
    assert peers[0].allowed_ips == ("10.254.0.0/16", "10.96.0.0/12")
    assert peers[1].last_handshake is None and peers[1].endpoint is None
    assert parse_metrics("") == (0, ())
    for bad in ("garbage line", "public_key=zz", f"public_key={pk1.hex()}\nrx_bytes=lots"):
        with pytest.raises(EngineError, match="wireproxy /metrics"):
            parse_metrics(bad)


def test_supported_only_with_a_binary(tmp_path):
    assert engine_classes()["wireproxy"] is WireproxyEngine
    assert not WireproxyEngine.is_supported(binary=str(tmp_path / "nope")).ok
    assert WireproxyEngine.is_supported(binary=str(FAKE)).ok
    assert WireproxyEngine(ifname=None).dialer() is None


# ---------------------------------------------------------------- supervision of a real process


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Control:
    def __init__(self, path: Path) -> None:
        self.path = path

    def starts(self) -> list[dict]:
        f = self.path / "starts.jsonl"
        return [json.loads(line) for line in f.read_text().splitlines()] if f.exists() else []

    def readyz(self, mode: str) -> None:
        (self.path / "readyz").write_text(mode)


@pytest.fixture
async def rig(tmp_path, monkeypatch, tasks):
    control = tmp_path / "control"
    control.mkdir()
    wrapper = tmp_path / "wireproxy"  # the engine gives its process a minimal environment: the control dir rides here
    wrapper.write_text(f"#!/bin/sh\nFAKE_WIREPROXY_DIR={control} exec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    addresses = {"gw.example.com": ["192.0.2.1"]}

    async def resolver(host: str, port: int) -> list[str]:  # DNS is the one thing faked here
        if host not in addresses:
            raise OSError("no such host")
        return list(addresses[host])

    engine = WireproxyEngine(ifname=None, binary=str(wrapper), state_dir=tmp_path / "state",
                             health_address=f"127.0.0.1:{free_port()}",
                             health_interval=0.05, failures_before_restart=3, start_grace=10)
    await engine.start(tasks)
    real_apply = engine.apply

    async def apply(desired, workload=None):  # the rig's workload unless the test gives one
        return await real_apply(desired, workload or WORKLOAD)

    engine.apply = apply
    engine.resolver = resolver
    try:
        yield engine, Control(control), addresses
    finally:
        await engine.stop()


WORKLOAD = WorkloadConfig(proxy_address=f"127.0.0.1:{free_port()}", gateways=("10.254.254.1",))


async def wait_healthy(engine):
    await wait_until(lambda: engine.supervision.last_health == 200, what="/readyz 200")


async def test_starts_with_the_flags_and_reports_metrics(rig):
    engine, control, _ = rig
    assert await engine.apply(desired()) is True
    await wait_healthy(engine)
    (start,) = control.starts()
    assert start["argv"] == ["-c", str(engine.config_path), "-i", engine.options.health_address]
    assert stat.S_IMODE(engine.config_path.stat().st_mode) == 0o600
    status = await engine.status()
    assert status.running and status.engine == "wireproxy" and status.listen_port == 40000
    (peer,) = status.peers
    assert peer.public_key == GW_PUB and peer.tx_bytes == 1000 and peer.last_handshake is not None
    assert peer.allowed_ips == ("10.254.0.0/16", "10.96.0.0/12")


async def test_same_config_twice_does_not_restart_and_a_change_does(rig):
    engine, control, _ = rig
    await engine.apply(desired())
    await wait_healthy(engine)
    assert await engine.apply(desired()) is False
    assert len(control.starts()) == 1
    assert await engine.apply(desired(), WorkloadConfig(proxy_address=engine.options.proxy_address,
                                                        forwards=(Forward(15432, "db:5432"),))) is True
    await wait_until(lambda: len(control.starts()) == 2, what="restart on config change")
    assert "Target = db:5432" in engine.config_path.read_text()
    assert engine.supervision.restarts == ["config changed"]


async def test_inbound_udp_ports_are_left_out_with_one_warning(rig, caplog):
    """wireproxy has no UDP server tunnel: the agent still starts (a pod's UDP container ports are
    passed to every engine), says once which ports are not served, and renders TCP ones only."""
    import logging

    engine, control, _ = rig
    caplog.set_level(logging.WARNING, logger="anex_agent.tunnels.engines.wireproxy")
    workload = WorkloadConfig(proxy_address=engine.options.proxy_address, inbound_ports=(8000,),
                              inbound_udp_ports=(53, 5353))
    await engine.apply(desired(), workload)
    await wait_healthy(engine)
    await engine.apply(desired(), workload)
    warnings = [r.message for r in caplog.records if "not served" in r.message]
    assert warnings == ["inbound UDP ports 53/udp,5353/udp are not served: wireproxy relays inbound TCP only; "
                        "use the built-in userspace engine (ANEX_ENGINE=userspace) for UDP"]
    text = engine.config_path.read_text()
    assert "ListenPort = 8000" in text and "5353" not in text and "ListenPort = 53\n" not in text


@pytest.mark.parametrize("mode,reason", [("503", "/readyz failed 3 times (HTTP 503)"),
                                         ("hang", "/readyz failed 3 times (no answer)"),
                                         ("exit", "process exited with status 3")])
async def test_restarts_when_unhealthy(rig, mode, reason):
    engine, control, _ = rig
    await engine.apply(desired())
    await wait_healthy(engine)
    first_pid = control.starts()[0]["pid"]
    control.readyz(mode)
    await wait_until(lambda: len(control.starts()) >= 2, what=f"restart after readyz={mode}")
    control.readyz("200")
    assert engine.supervision.restarts[0] == reason
    assert control.starts()[1]["pid"] != first_pid
    await wait_healthy(engine)
    with pytest.raises(ProcessLookupError):
        os.kill(first_pid, 0)  # the old process is gone


async def test_no_restart_during_start_grace(rig):
    engine, control, _ = rig
    engine.start_grace = 3600
    control.readyz("503")
    await engine.apply(desired())
    await wait_until(lambda: engine.supervision.last_health == 503, what="a 503 seen")
    await asyncio.sleep(0.5)
    assert len(control.starts()) == 1 and engine.supervision.restarts == []


async def test_restarts_when_the_endpoint_resolves_elsewhere(rig, tasks):
    """The endpoint policy above the engine follows the name; wireproxy gets the new address and restarts."""
    from anex_agent.tunnels.engines.endpoints import EndpointPolicy

    engine, control, addresses = rig
    policy = EndpointPolicy(engine.resolver)

    async def reapply():
        await engine.apply(await policy.resolve(desired()))

    await engine.apply(await policy.resolve(desired()))
    await wait_healthy(engine)
    tasks.spawn("endpoint-follow", lambda: policy.follow(reapply, 0.2))
    await asyncio.sleep(0.5)
    assert len(control.starts()) == 1  # same address: nothing happens
    assert control.starts()[0]["endpoints"] == ["192.0.2.1:51820"]
    addresses["gw.example.com"] = ["198.51.100.7"]
    await wait_until(lambda: len(control.starts()) == 2, what="restart after DNS change")
    assert engine.supervision.restarts == ["config changed"]
    assert control.starts()[1]["endpoints"] == ["198.51.100.7:51820"]
    del addresses["gw.example.com"]  # DNS failure later: keep running
    await asyncio.sleep(0.5)
    assert len(control.starts()) == 2


async def test_survives_a_failed_restart_and_comes_back(rig, tmp_path, tasks, caplog):
    """The binary vanishes while wireproxy must restart: the failure is logged, the supervisor keeps
    trying with backoff, and once the binary is back wireproxy runs again (never a silent death)."""
    engine, control, _ = rig
    wrapper = tmp_path / "bin" / "wireproxy"
    wrapper.parent.mkdir()
    wrapper.write_text(f"#!/bin/sh\nFAKE_WIREPROXY_DIR={control.path} exec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    engine.binary = str(wrapper)
    await engine.apply(desired())
    await wait_healthy(engine)
    hidden = wrapper.with_name("hidden")
    wrapper.rename(hidden)  # the binary is gone...
    control.readyz("exit")  # ...and the process exits
    await wait_until(lambda: tasks.failures["wireproxy-supervisor"] >= 2, what="failed restarts, logged")
    assert "cannot start" in caplog.text and "wireproxy-supervisor failed" in caplog.text
    assert not engine.running
    control.readyz("200")
    hidden.rename(wrapper)  # the binary is back
    await wait_until(lambda: len(control.starts()) == 2 and engine.running, what="wireproxy running again")
    await wait_healthy(engine)
    assert "not running (its last start failed)" in engine.supervision.restarts


async def test_stop_kills_the_process_and_removes_the_key_file(rig):
    engine, control, _ = rig
    await engine.apply(desired())
    await wait_healthy(engine)
    pid, path = control.starts()[0]["pid"], engine.config_path
    await engine.stop()
    await engine.stop()
    assert not path.exists()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    assert not (await engine.status()).running


async def test_missing_binary_is_an_engine_error(tmp_path, tasks):
    engine = WireproxyEngine(ifname=None, binary=str(tmp_path / "missing"), state_dir=tmp_path)
    await engine.start(tasks)
    with pytest.raises(EngineError, match="cannot start"):
        await engine.apply(desired(endpoint="192.0.2.1:51820"))
    await engine.stop()


def test_options_for_node_from_the_wire_config():
    from anex_agent.agent.engine_frontends import workload_config
    from anex_agent.agent.settings import AgentSettings
    from anex_agent.wire.nodes import NodeConfig

    config = NodeConfig.model_validate({
        "node_id": "n1", "version": 3, "address": "10.254.0.5", "network": "10.254.0.0/16", "mtu": 1400,
        "dns": ["10.254.254.1"],
        "gateways": [{"id": "gw", "public_key": GW_PUB, "endpoint": "gw.example.com:51820",
                      "allowed_ips": ["10.254.0.0/16"], "mesh_address": "10.254.254.1"}],
        "tunnels": [{"listen_port": 5432, "target": "db.default.svc.cluster.local:5432"}],
    })
    settings = AgentSettings(coordinator_url="http://c", join_token="", state_dir=Path("/tmp/x"), inbound_ports=(8888,))
    opts = WireproxyOptions.from_workload(workload_config(config, settings))
    assert render_config(desired(), opts) == GOLDEN.replace(
        "[TCPClientTunnel]\nBindAddress = 127.0.0.1:6379\nTarget = 10.96.0.20:6379\n\n", "")


async def test_with_no_gateway_nothing_runs_until_one_registers(rig):
    """A node that joins before any gateway exists: wireproxy needs a peer, so it waits for one."""
    engine, control, _ = rig
    no_gateway = dataclasses.replace(desired(), peers=())
    assert await engine.apply(no_gateway) is False
    assert control.starts() == [] and not (await engine.status()).running
    assert await engine.apply(desired()) is True  # the gateway registers
    await wait_healthy(engine)
    assert len(control.starts()) == 1
    assert await engine.apply(no_gateway) is True  # and is deleted: the process goes, the key file too
    assert not (await engine.status()).running and not engine.config_path.exists()
    assert await engine.apply(desired()) is True
    await wait_until(lambda: len(control.starts()) == 2, what="wireproxy started again")
