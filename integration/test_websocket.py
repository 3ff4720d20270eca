"""WireGuard over the gateway's WebSocket relay, end to end in namespaces (native engine: wireguard-go).

* a node whose namespace drops every outgoing UDP datagram: ``ANEX_PATH=auto`` finds the
  WebSocket path by itself and the proxy, CONNECT and ``GW_TUNNEL_*`` paths work over it;
  the coordinator's node view shows the path; the gateway restarting (relay and hub) is
  survived without restarting the agent;
* a node that starts on UDP: UDP blocked mid-session -> traffic flows again over WebSocket
  within 10 s; unblocked -> back on UDP within 60 s (UDP re-probed every 5 s here);
* a connection without a valid node key is refused by the relay.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, UNDERLAY_GW, WS_PORT, wait_until
from integration.conftest import TUNNEL_1, TUNNEL_2, client

PROXY = "127.0.0.1:3128"
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}"


@pytest.fixture(scope="module")
def blocked(mesh):
    """A node whose UDP never leaves its namespace, running ``anex-agent daemon`` with ANEX_PATH=auto."""
    n = mesh.add_node_namespace()
    mesh.block_udp(n)
    env = mesh.agent_env(
        n, ANEX_PATH="auto",
        **{f"GW_TUNNEL_{TUNNEL_1}": f"{SERVICE_NAME}:{HTTP_PORT}", f"GW_TUNNEL_{TUNNEL_2}": f"echo2.default.svc.cluster.local:8081"},
    )
    mesh.start_agent(n, env)
    yield n
    mesh.stop_agent(n)


def get_ok(ns, path: str = "/ws", timeout: float = 5) -> bool:
    try:
        result = client(ns, "get", f"{URL}{path}", "--proxy", PROXY, timeout=timeout)
    except subprocess.TimeoutExpired:
        return False
    return result.get("status") == 200


def test_auto_finds_the_websocket_path_when_udp_is_blocked(blocked):
    status = blocked.status()
    assert status["path"] == "websocket", status.get("path_choice")
    choice = status["path_choice"]
    assert choice["mode"] == "auto" and "no WireGuard handshake" in choice["reason"]
    assert choice["switches"][-1]["to"] == "websocket"
    (relay,) = choice["relays"].values()
    assert relay["connected"] and relay["url"] == f"ws://{UNDERLAY_GW}:{WS_PORT}/relay"
    # the hub sees this node at the relay's own socket on the gateway host, not at the node's address
    peer = status["peers"][0]
    assert peer["endpoint"].startswith("127.0.0.1:")


def test_proxy_get_and_post_over_websocket(blocked):
    result = client(blocked.ns, "get", f"{URL}/hello", "--proxy", PROXY)
    assert result.get("status") == 200, result
    assert json.loads(result["body"])["path"] == "/hello"
    result = client(blocked.ns, "get", f"{URL}/upload", "--proxy", PROXY, "--body-size", str(2 * 1024 * 1024 + 5))
    assert result.get("status") == 200 and result["sha256"] == result["sent_sha256"], result


def test_connect_and_gw_tunnels_over_websocket(blocked):
    result = client(blocked.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", PROXY, "--path", "/tunnelled")
    assert result.get("status") == 200, result
    first = client(blocked.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/a")
    second = client(blocked.ns, "get", f"http://127.0.0.1:{TUNNEL_2}/b")
    assert json.loads(first["body"])["service"] == "echo" and json.loads(second["body"])["service"] == "echo2"


def test_the_coordinator_shows_the_path(mesh, blocked):
    node_id = blocked.status()["node_id"]
    view = wait_until(lambda: (v := mesh.admin("GET", f"/v1/nodes/{node_id}")) and v.get("status") and v, 40,
                      "a heartbeat")
    assert view["status"]["path"] == "websocket"
    assert "no WireGuard handshake" in view["status"]["path_reason"]


def test_a_connection_without_a_node_key_is_refused(blocked, mesh):
    code = (
        "import asyncio,sys\n"
        "from websockets.asyncio.client import connect\n"
        "from anex_agent.net import relay_protocol as rp; from anex_agent.wire import keys\n"
        "async def main():\n"
        "    k=keys.generate_private_key()\n"
        "    async with connect(sys.argv[1],subprotocols=[rp.SUBPROTOCOL]) as ws:\n"
        "        ch=rp.parse_challenge(await ws.recv())\n"
        "        await ws.send(rp.answer_message(private_key=k,public_key=keys.encode_key(keys.public_key(k)),"
        "gateway_public=keys.public_key(k),challenge=ch))\n"
        "        try:\n"
        "            await ws.send(b'\\x01'+bytes(147)); await asyncio.wait_for(ws.recv(),5)\n"
        "        except Exception as e: print(getattr(getattr(e,'rcvd',None),'code',repr(e)))\n"
        "asyncio.run(main())\n"
    )
    out = blocked.ns.run([sys.executable, "-c", code, f"ws://{UNDERLAY_GW}:{WS_PORT}/relay"], timeout=20)
    assert out.stdout.strip() == "4003", out
    log = (mesh.workdir / "gateway.log").read_text(errors="replace")
    assert "relay: refused a connection" in log


def detect_gateways(node) -> dict:
    from anex_agent.testing.mesh import anex_argv

    out = node.ns.run([*anex_argv(), "detect", "--json", "--state-dir", str(node.state_dir)], timeout=60)
    return json.loads(out.stdout)["gateways"]


def test_detect_tests_udp_and_the_relay_for_real(blocked):
    (gateway,) = detect_gateways(blocked).values()
    assert gateway["udp"]["supported"] is False and "no WireGuard handshake" in gateway["udp"]["reason"]
    assert gateway["websocket"]["supported"] is True and "accepted this node" in gateway["websocket"]["reason"]


def test_gateway_restart_is_survived_without_restarting_the_agent(mesh, blocked):
    pid = blocked.proc.pid
    assert get_ok(blocked.ns, "/before")
    mesh.stop_gateway()
    mesh.start_gateway()
    started = time.monotonic()
    wait_until(lambda: get_ok(blocked.ns, "/after", timeout=4), 60, "traffic over the relay after the gateway restarted")
    assert blocked.proc.pid == pid and blocked.proc.poll() is None
    assert blocked.status()["path"] == "websocket"
    print(f"traffic resumed {time.monotonic() - started:.1f} s after the gateway was back")


def hub_endpoint_port(mesh, node) -> int:
    """The UDP port the gateway's hub sends this node's datagrams to."""
    out = mesh.gateway.run(["wg", "show", "all", "endpoints"]).stdout
    for line in out.splitlines():
        endpoint = line.split()[-1]
        if endpoint.startswith(f"{node.underlay}:"):
            return int(endpoint.rsplit(":", 1)[1])
    raise AssertionError(f"no hub endpoint for {node.underlay}: {out}")


def udp_ports(node) -> set[int]:
    """Local ports of the UDP sockets open in the node's namespace (the engine's; a probe's is closed)."""
    out = node.ns.run(["ss", "-Huan"]).stdout
    return {int(line.split()[3].rsplit(":", 1)[1]) for line in out.splitlines() if line.strip()}


def over_websocket_and_back(mesh, n, label: str) -> None:
    """UDP blocked mid-session: traffic (asked for all along) flows again over the relay;
    unblocked: the agent returns to UDP and traffic still flows. How long each takes is printed
    (``bench/bench_websocket.py`` measures it); the test waits for the events."""
    mesh.block_udp(n)
    blocked_at = time.monotonic()
    try:
        wait_until(lambda: get_ok(n.ns, "/during", timeout=2), 60, "traffic over the relay after UDP was blocked")
    except TimeoutError as err:
        raise AssertionError(f"{err}; the agent's path: {n.status().get('path_choice')}") from None
    took = time.monotonic() - blocked_at
    status = n.status()
    assert status["path"] == "websocket", status["path_choice"]
    assert "nothing received from the gateways" in status["path_choice"]["reason"]
    print(f"{label}, UDP blocked: traffic flowing again over WebSocket after {took:.1f} s")

    mesh.unblock_udp(n)
    unblocked_at = time.monotonic()
    wait_until(lambda: n.status()["path"] == "udp", 60, "the agent returning to UDP")
    print(f"{label}, UDP unblocked: back on UDP after {time.monotonic() - unblocked_at:.1f} s")
    assert "UDP works again" in n.status()["path_choice"]["reason"]
    assert get_ok(n.ns, "/back")


def test_udp_blocked_mid_session_then_unblocked(mesh):
    n = mesh.add_node_namespace()
    mesh.start_agent(n, mesh.agent_env(n, ANEX_PATH="auto", ANEX_PATH_PROBE_INTERVAL="5"))
    try:
        assert n.status()["path"] == "udp"
        (gateway,) = detect_gateways(n).values()
        assert gateway["udp"]["supported"] is True and gateway["udp"]["rtt_ms"] is not None
        # quiet on UDP, the watch probes; a datagram to the gateway's mesh address pulls the hub back
        time.sleep(3)
        # within 15 s: the pull-back is at once; without it only the engine's 25 s persistent
        # keepalive would bring the hub back (the margin is for a busy machine)
        wait_until(lambda: hub_endpoint_port(mesh, n) in udp_ports(n), 15, "the hub back on the engine's socket",
                   interval=0.2)
        assert get_ok(n.ns, "/udp")
        over_websocket_and_back(mesh, n, "wireguard-go")
        assert not n.status()["path_choice"]["relays"]
    finally:
        mesh.unblock_udp(n)
        mesh.stop_agent(n)
