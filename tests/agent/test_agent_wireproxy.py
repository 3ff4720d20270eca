"""The agent with the external wireproxy engine, end to end, as users start it.

Real processes: ``anex-agent coordinator`` on loopback, ``anex-agent run --engine wireproxy
-- CMD``, and the stand-in ``tests/tunnels/fake_wireproxy.py`` placed on PATH as
``wireproxy`` (the real binary is not installed here; the fake takes the same flags, checks
the config's mode and sections, serves /readyz and /metrics, and binds the [http] and
[TCPClientTunnel] addresses like wireproxy does). A gateway is registered through the REST
API only (its WireGuard side is not needed: the fake does no WireGuard).

It lives in tests/ (not integration/) because nothing here needs root or a namespace:
wireproxy needs no NET_ADMIN or TUN, which is the point of that engine.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from anex_agent.client.rest import proven_body
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.wire.gateways import GatewayRegisterRequest

FAKE = Path(__file__).resolve().parents[1] / "tunnels" / "fake_wireproxy.py"
ADMIN_TOKEN = "wireproxy-e2e-admin-token-0123456789"
SERVICE = "echo.default.svc.cluster.local:80"
PUSHED = "db.default.svc.cluster.local:5432"

WORKLOAD = (
    "import socket,sys,time,os,json\n"
    "port=int(sys.argv[1]); release=sys.argv[2]\n"
    "open(release+'.env','w').write(json.dumps(dict(os.environ)))\n"
    "s=socket.create_connection(('127.0.0.1',port),timeout=10)\n"
    "got=s.recv(200).decode().strip()\n"
    "print('WORKLOAD-GOT', got, flush=True)\n"
    "s.close()\n"
    "open(release+'.got','w').write(got)\n"
    "while not os.path.exists(release): time.sleep(0.05)\n"
    "sys.exit(5)\n"
)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as err:  # not yet
            last = err
        time.sleep(0.1)
    raise TimeoutError(f"timed out waiting for {what} (last error: {last})")


def http(method: str, url: str, body: dict | None = None, token: str | None = None) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, method=method, data=json.dumps(body).encode() if body is not None else None,
                                 headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, _body(resp.read().decode())
    except urllib.error.HTTPError as err:
        return err.code, _body(err.read().decode())


def _body(text: str) -> dict:
    return json.loads(text) if text.strip().startswith("{") else {"text": text}


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is gone for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def starts(control: Path) -> list[dict]:
    path = control / "starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


#: What the test coordinator tells nodes (``--heartbeat-interval``): a test that waits for heartbeats
#: sees them within a second or two, not the default 15 s.
HEARTBEAT_INTERVAL = 1.0


@pytest.fixture
def coordinator(tmp_path):
    port = free_port()
    env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN_TOKEN}
    log = open(tmp_path / "coordinator.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(tmp_path / "coord"), "--heartbeat-interval", str(HEARTBEAT_INTERVAL)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http("GET", f"{url}/v1/nodes", token=ADMIN_TOKEN)[0] == 200, 30, "the coordinator")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


@pytest.fixture
def fake_on_path(tmp_path):
    """A PATH directory with ``wireproxy`` running the fake, and the fake's control directory."""
    bindir, control = tmp_path / "bin", tmp_path / "fake"
    bindir.mkdir()
    control.mkdir()
    wrapper = bindir / "wireproxy"
    # the agent gives wireproxy a minimal environment: the control directory rides in the wrapper
    wrapper.write_text(f"#!/bin/sh\nFAKE_WIREPROXY_DIR={control} exec {sys.executable} {FAKE} \"$@\"\n")
    wrapper.chmod(0o755)
    (control / "listen").write_text("bind [http] and tunnels like wireproxy\n")
    return bindir, control


def test_agent_runs_wireproxy_renders_its_config_restarts_it_on_a_pushed_tunnel_and_leaves_nothing(
        tmp_path, coordinator, fake_on_path):
    bindir, control = fake_on_path
    gw_key = KeyPair(generate_private_key())
    status, token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "gateway"}, ADMIN_TOKEN)
    assert status in (200, 201), token
    _, info = http("GET", f"{coordinator}/v1/coordinator")
    status, gateway = http("POST", f"{coordinator}/v1/gateways", proven_body(GatewayRegisterRequest, {
        "token": token["token"], "name": "gw-e2e",
        "endpoint": "127.0.0.1:51820", "routes": ["10.96.0.0/12"]}, gw_key, info["public_key"]))
    assert status in (200, 201), gateway
    status, node_token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "node"}, ADMIN_TOKEN)
    assert status in (200, 201), node_token

    tunnel_port, pushed_port, inbound_port = free_port(), free_port(), free_port()
    proxy, api = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    state = tmp_path / "state"
    release = tmp_path / "release"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        "FAKE_WIREPROXY_DIR": str(control),
        "ANEX_COORDINATOR_URL": coordinator, "ANEX_JOIN_TOKEN": node_token["token"], "ANEX_STATE_DIR": str(state),
        "ANEX_PROXY_LISTEN": proxy, "ANEX_API_LISTEN": api, "ANEX_INBOUND_PORTS": str(inbound_port),
        "ANEX_NODE_NAME": "wireproxy-node", f"GW_TUNNEL_{tunnel_port}": SERVICE,
    })
    agent = subprocess.Popen([sys.executable, "-m", "anex_agent", "run", "--engine", "wireproxy", "--",
                              sys.executable, "-c", WORKLOAD, str(tunnel_port), str(release)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    config_path = state / "wireproxy.conf"
    try:
        first = wait_for(lambda: starts(control), 60, "wireproxy started by the agent")[0]
        assert first["argv"][0] == "-c" and first["argv"][1] == str(config_path) and first["argv"][2] == "-i"
        health = first["argv"][3]
        assert health.startswith("127.0.0.1:") and health != proxy
        # wireproxy gets a minimal environment: PATH, never an ANEX_* secret
        assert "PATH" in first["env"] and "HOME" not in first["env"], first["env"]
        assert not [n for n in first["env"] if n.startswith(("ANEX_", "GW_TUNNEL_"))], first["env"]

        # the config it rendered for the fake
        assert stat.S_IMODE(config_path.stat().st_mode) == 0o600
        text = config_path.read_text()
        status, nodes = http("GET", f"{coordinator}/v1/nodes", token=ADMIN_TOKEN)
        node = next(n for n in nodes["nodes"] if n["name"] == "wireproxy-node")
        assert f"Address = {node['address']}/" in text
        assert f"PrivateKey = " in text
        assert f"[Peer]\nPublicKey = {gw_key.public_b64}\nEndpoint = 127.0.0.1:51820\n" in text
        assert f"CheckAlive = {gateway['address']}" in text
        assert f"[http]\nBindAddress = {proxy}\n" in text
        assert f"[TCPClientTunnel]\nBindAddress = 127.0.0.1:{tunnel_port}\nTarget = {SERVICE}\n" in text
        assert f"[TCPServerTunnel]\nListenPort = {inbound_port}\nTarget = 127.0.0.1:{inbound_port}\n" in text

        # the workload reached wireproxy's tunnel (the agent started no forward of its own there)
        wait_for(lambda: (control / "starts.jsonl").exists() and agent.poll() is None, 10, "agent running")
        status_doc = wait_for(lambda: http("GET", f"http://{api}/status")[1] or None, 30, "the agent API")
        assert status_doc["engine"] == "wireproxy"
        assert status_doc["tunnels"] == [{"listen_port": tunnel_port, "target": SERVICE}]
        assert status_doc["wireproxy"]["running"] and status_doc["wireproxy"]["starts"] == 1
        assert status_doc["wireproxy"]["server_tunnels"] == [{"listen_port": inbound_port, "target": f"127.0.0.1:{inbound_port}"}]
        assert status_doc["peers"][0]["public_key"] == gw_key.public_b64  # from wireproxy's /metrics
        assert status_doc["detect"]["engines"]["wireproxy"]["supported"] is True
        assert http("GET", f"http://{api}/readyz") == (200, {"text": "ready: wireproxy /readyz: 200\n"})
        (control / "readyz").write_text("503")  # wireproxy's own verdict decides readiness
        code, body = http("GET", f"http://{api}/readyz")
        assert code == 503 and "wireproxy /readyz: HTTP 503" in body["text"]
        (control / "readyz").write_text("200")

        # a tunnel pushed from the coordinator: re-render and restart (no live reconfiguration).
        # Pushed only once the workload has used its tunnel: a restart briefly closes wireproxy's listeners.
        wait_for(lambda: Path(f"{release}.got").exists(), 30, "the workload's first connection")
        status, _ = http("PUT", f"{coordinator}/v1/nodes/{node['id']}/tunnels",
                         {"tunnels": [{"listen_port": pushed_port, "target": PUSHED}]}, ADMIN_TOKEN)
        assert status == 200
        second = wait_for(lambda: starts(control)[1:], 30, "wireproxy restarted after the pushed tunnel")[0]
        text = config_path.read_text()
        assert f"[TCPClientTunnel]\nBindAddress = 127.0.0.1:{pushed_port}\nTarget = {PUSHED}\n" in text
        assert f"BindAddress = 127.0.0.1:{tunnel_port}" in text  # GW_TUNNEL kept
        assert second["argv"] == first["argv"]  # same file, same health address
        assert f"127.0.0.1:{pushed_port}" in second["listeners"]
        wait_for(lambda: not alive(first["pid"]), 10, "the old wireproxy to exit")
        with socket.create_connection(("127.0.0.1", pushed_port), timeout=5) as conn:
            assert conn.recv(200).decode().startswith(f"fake-wireproxy tcpclienttunnel 127.0.0.1:{pushed_port}")
        doc = wait_for(lambda: (d := http("GET", f"http://{api}/status")[1])["wireproxy"]["starts"] == 2 and d, 10, "status")
        assert doc["wireproxy"]["restarts"] == ["config changed"]
        assert {"listen_port": pushed_port, "target": PUSHED} in doc["tunnels"]

        release.write_text("go")
        out, _ = agent.communicate(timeout=60)
    except BaseException:
        if agent.poll() is None:
            agent.kill()
        out, _ = agent.communicate()
        logs = [p.read_text(errors="replace")[-3000:] for p in (state / "wireproxy.log", tmp_path / "coordinator.log") if p.exists()]
        print("--- agent\n" + out[-6000:] + "\n--- wireproxy, coordinator\n" + "\n".join(logs))
        raise
    assert agent.returncode == 5, out
    assert f"WORKLOAD-GOT fake-wireproxy tcpclienttunnel 127.0.0.1:{tunnel_port}" in out
    assert out.index("mesh up") < out.index("WORKLOAD-GOT")
    assert "Traceback" not in out, out
    assert len(starts(control)) == 2
    # the workload's environment: no join token (nor any other ANEX_* secret), harmless names kept
    seen = json.loads(Path(f"{release}.env").read_text())
    assert not {"ANEX_JOIN_TOKEN", "ANEX_COORDINATOR_URL", "ANEX_STATE_DIR"} & set(seen), sorted(seen)
    assert node_token["token"] not in json.dumps(seen)
    assert seen["ANEX_NODE_NAME"] == "wireproxy-node" and seen["ANEX_PROXY_LISTEN"] == proxy
    assert seen[f"GW_TUNNEL_{tunnel_port}"] == SERVICE
    for started in starts(control):
        assert not alive(started["pid"]), f"wireproxy {started['pid']} is still running"
    assert not config_path.exists()  # the private key does not outlive the agent


def test_a_node_that_joins_before_any_gateway_heartbeats_and_starts_wireproxy_when_one_registers(
        tmp_path, coordinator, fake_on_path):
    bindir, control = fake_on_path
    _, node_token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "node"}, ADMIN_TOKEN)
    api = f"127.0.0.1:{free_port()}"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "FAKE_WIREPROXY_DIR": str(control),
        "ANEX_COORDINATOR_URL": coordinator, "ANEX_JOIN_TOKEN": node_token["token"],
        "ANEX_STATE_DIR": str(tmp_path / "state"), "ANEX_PROXY_LISTEN": f"127.0.0.1:{free_port()}",
        "ANEX_API_LISTEN": api, "ANEX_NODE_NAME": "early-node",
    })
    agent = subprocess.Popen([sys.executable, "-m", "anex_agent", "daemon", "--engine", "wireproxy"],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []  # the agent's output as it comes (read by a thread: the test waits for a line)
    reader = threading.Thread(target=lambda: lines.extend(agent.stdout), daemon=True, name="agent-output")
    reader.start()
    try:
        node_id = wait_for(lambda: http("GET", f"http://{api}/status")[1]["node_id"], 60, "the agent API")
        beats: set[str] = set()

        def two_heartbeats():
            assert agent.poll() is None
            seen = http("GET", f"{coordinator}/v1/nodes/{node_id}", token=ADMIN_TOKEN)[1]["last_heartbeat_at"]
            beats.update([seen] if seen else [])
            return len(beats) >= 2
        wait_for(two_heartbeats, 60, "two heartbeats while no gateway exists")
        assert http("GET", f"http://{api}/healthz")[0] == 200
        assert starts(control) == []  # nothing to run wireproxy against yet

        gw_key = KeyPair(generate_private_key())
        _, token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "gateway"}, ADMIN_TOKEN)
        _, info = http("GET", f"{coordinator}/v1/coordinator")
        status, _ = http("POST", f"{coordinator}/v1/gateways", proven_body(GatewayRegisterRequest, {
            "token": token["token"], "name": "gw-late", "endpoint": "127.0.0.1:51820", "routes": ["10.96.0.0/12"]},
            gw_key, info["public_key"]))
        assert status in (200, 201)
        wait_for(lambda: starts(control), 60, "wireproxy started once the gateway registered")
        wait_for(lambda: http("GET", f"http://{api}/readyz")[0] == 200, 60, "the agent ready")
        # the ready-wait saw the gateway's handshake (its line may follow /readyz by a look or two)
        wait_for(lambda: any("tunnel ready: a gateway answered" in line for line in list(lines)), 60,
                 "the agent's 'tunnel ready' line")
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=60)
        reader.join(60)
    except BaseException:
        agent.kill()
        agent.wait()
        reader.join(10)
        print("--- agent\n" + "".join(lines)[-6000:])
        raise
    out = "".join(lines)
    assert agent.returncode == 0, out
