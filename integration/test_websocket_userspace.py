"""The WebSocket path's scenarios on the userspace engine: the agent runs unprivileged (a
non-root user, no capabilities), so ``ANEX_ENGINE=auto`` picks the built-in engine, whose
datagram transport is the path's SwitchBind (UDP and the gateway's relay, switched inside).

* a node whose namespace drops every outgoing UDP datagram: ``auto`` finds the WebSocket path
  and the proxy (GET/POST by cluster name), CONNECT and a ``GW_TUNNEL_*`` forward work over
  it; the gateway restarting (relay and hub) is survived without restarting the agent;
* a node that starts on UDP: UDP blocked mid-session -> traffic flows again over WebSocket
  within 10 s; unblocked -> back on UDP within 60 s (UDP re-probed every 5 s here), and the
  hub follows the engine back to its own socket (the pull-back after a probe).
"""

from __future__ import annotations

import json
import shutil
import time

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, UNDERLAY_GW, WS_PORT, wait_until
from integration.conftest import TUNNEL_1, client
from integration.test_websocket import PROXY, URL, get_ok, hub_endpoint_port, over_websocket_and_back, udp_ports


def _unprivileged_agent(mesh, node, **env) -> None:
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    mesh.start_agent(node, mesh.agent_env(node, ANEX_ENGINE="auto", ANEX_PATH="auto", **env), unprivileged=True)


@pytest.fixture(scope="module")
def ublocked(mesh):
    """An unprivileged agent on a node whose UDP never leaves its namespace."""
    n = mesh.add_node_namespace()
    mesh.block_udp(n)
    _unprivileged_agent(mesh, n, **{f"GW_TUNNEL_{TUNNEL_1}": f"{SERVICE_NAME}:{HTTP_PORT}"})
    yield n
    mesh.stop_agent(n)


def test_auto_picks_userspace_and_the_websocket_path(ublocked):
    status = ublocked.status()
    assert status["engine"] == "userspace"
    assert status["path"] == "websocket", status.get("path_choice")
    choice = status["path_choice"]
    assert "no WireGuard handshake" in choice["reason"] and choice["switches"][-1]["to"] == "websocket"
    relays = choice["relays"]  # the engine's SwitchBind: one relay per gateway, inside the engine's Bind
    assert any(r.get("connected") and r.get("url") == f"ws://{UNDERLAY_GW}:{WS_PORT}/relay"
               for r in relays.values()), relays


def test_proxy_connect_and_forward_over_websocket(ublocked):
    result = client(ublocked.ns, "get", f"{URL}/hello", "--proxy", PROXY)
    assert result.get("status") == 200, result
    assert json.loads(result["body"])["path"] == "/hello"
    result = client(ublocked.ns, "get", f"{URL}/upload", "--proxy", PROXY, "--body-size", str(2 * 1024 * 1024 + 5))
    assert result.get("status") == 200 and result["sha256"] == result["sent_sha256"], result
    result = client(ublocked.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", PROXY, "--path", "/tunnelled")
    assert result.get("status") == 200, result
    forwarded = client(ublocked.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/a")
    assert json.loads(forwarded["body"])["service"] == "echo"


def test_relay_restart_is_survived_without_restarting_the_agent(mesh, ublocked):
    pid = ublocked.proc.pid
    assert get_ok(ublocked.ns, "/before")
    mesh.stop_gateway()
    mesh.start_gateway()
    started = time.monotonic()
    wait_until(lambda: get_ok(ublocked.ns, "/after", timeout=4), 60, "traffic over the relay after the gateway restarted")
    assert ublocked.proc.pid == pid and ublocked.proc.poll() is None
    assert ublocked.status()["path"] == "websocket"
    print(f"userspace: traffic resumed {time.monotonic() - started:.1f} s after the gateway was back")


def test_udp_blocked_mid_session_then_unblocked(mesh):
    n = mesh.add_node_namespace()
    _unprivileged_agent(mesh, n, ANEX_PATH_PROBE_INTERVAL="5")
    try:
        status = n.status()
        assert status["engine"] == "userspace" and status["path"] == "udp", status.get("path_choice")
        # quiet on UDP: after 2 s with nothing received the watch probes UDP (a socket of its own);
        # the engine's keepalive then pulls the hub back, so the cluster reaches the node at once
        # (the engine itself sends nothing for 25 s: its persistent keepalive)
        time.sleep(3)
        # within 15 s: the pull-back is at once; without it only the engine's 25 s persistent
        # keepalive would bring the hub back (the margin is for a busy machine)
        wait_until(lambda: hub_endpoint_port(mesh, n) in udp_ports(n), 15, "the hub back on the engine's socket",
                   interval=0.2)
        ping = mesh.cluster.run(["ping", "-c", "1", "-W", "2", status["address"]], check=False)
        assert ping.returncode == 0, ping.stdout + ping.stderr
        assert get_ok(n.ns, "/udp")
        over_websocket_and_back(mesh, n, "userspace")
    finally:
        mesh.unblock_udp(n)
        mesh.stop_agent(n)
