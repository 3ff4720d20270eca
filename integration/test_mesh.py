"""End-to-end data paths of a native (wireguard-go) node: proxy, CONNECT, GW_TUNNEL, inbound, agent API.

One mesh (session) and one node (module) are shared; each test drives real traffic from
inside the node's namespace to the cluster namespace, or back.
"""

from __future__ import annotations

import json
import sys

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, SERVICE_NAME, wait_until
from integration.conftest import TUNNEL_1, TUNNEL_2, assert_agent_api_needs_the_cluster_token, client
from integration.netns import read_line

PROXY = "127.0.0.1:3128"
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}"


def test_proxy_get_by_cluster_name(node):
    result = client(node.ns, "get", f"{URL}/hello?x=1", "--proxy", PROXY)
    assert result.get("status") == 200, result
    body = json.loads(result["body"])
    assert body["service"] == "echo" and body["path"] == "/hello?x=1"
    # the cluster saw the gateway (masquerade), not the node's underlay address
    assert body["peer"] == "10.77.0.1"


def test_proxy_post_streams_a_body_both_ways(node):
    result = client(node.ns, "get", f"{URL}/upload", "--proxy", PROXY, "--body-size", str(3 * 1024 * 1024 + 17))
    assert result.get("status") == 200, result
    assert result["length"] == 3 * 1024 * 1024 + 17
    assert result["sha256"] == result["sent_sha256"]
    assert result["headers"]["X-Echo-Method"] == "POST"


def test_connect_through_the_proxy(node):
    result = client(node.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", PROXY, "--path", "/tunnelled")
    assert result.get("status") == 200, result
    assert json.loads(result["body"])["path"] == "/tunnelled"


def test_two_gw_tunnels_at_once(node):
    first = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/a")
    second = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_2}/b")
    assert first.get("status") == 200 and second.get("status") == 200, (first, second)
    assert json.loads(first["body"])["service"] == "echo"
    assert json.loads(second["body"])["service"] == "echo2"


def test_proxy_502_names_a_host_that_does_not_resolve(node):
    result = client(node.ns, "get", "http://nosuch.default.svc.cluster.local:8080/", "--proxy", PROXY)
    assert result.get("status") == 502, result
    assert "nosuch.default.svc.cluster.local" in result["body"]


def test_tunnel_pushed_from_the_coordinator_appears_and_goes_live(mesh, node):
    node_id = node.status()["node_id"]
    port = 19090
    mesh.admin("PUT", f"/v1/nodes/{node_id}/tunnels", {"tunnels": [{"listen_port": port, "target": f"{SERVICE_NAME}:{HTTP_PORT}"}]})
    try:
        result = wait_until(
            lambda: (r := client(node.ns, "get", f"http://127.0.0.1:{port}/pushed", timeout=10)).get("status") == 200 and r,
            15, "the pushed tunnel answering",
        )
        assert json.loads(result["body"])["path"] == "/pushed"
        assert {"listen_port": port, "target": f"{SERVICE_NAME}:{HTTP_PORT}"} in node.status()["tunnels"]
    finally:
        mesh.admin("PUT", f"/v1/nodes/{node_id}/tunnels", {"tunnels": []})
    wait_until(lambda: "error" in client(node.ns, "get", f"http://127.0.0.1:{port}/", timeout=5), 15, "the removed tunnel closing")
    # the GW_TUNNEL_* forwards from the environment stay
    assert client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/still").get("status") == 200


def test_cluster_reaches_a_workload_port_at_the_mesh_address(mesh, node):
    address = node.status()["address"]
    server = node.ns.popen(
        [sys.executable, "-m", "anex_agent.testing.services", "http", "--listen", "0.0.0.0:8090", "--name", "workload"],
        stdout=__import__("subprocess").PIPE, text=True,
    )
    try:
        assert read_line(server, 30, "workload server ready").strip() == "ready"
        result = client(mesh.cluster, "get", f"http://{address}:8090/inbound")
        assert result.get("status") == 200, result
        body = json.loads(result["body"])
        assert body["service"] == "workload" and body["peer"] == CLUSTER_IP
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_status_reports_engine_path_handshake_and_tunnels(node):
    status = node.status()
    assert status["engine"] == "wireguard-go" and status["path"] == "udp"
    assert status["last_handshake_age"] is not None and status["last_handshake_age"] < 180
    assert status["detect"]["engines"]["wireguard-go"]["supported"] is True
    assert status["coordinator"]["reachable"] is True
    assert {t["listen_port"] for t in status["tunnels"]} >= {TUNNEL_1, TUNNEL_2}
    assert status["rx_bytes"] > 0 and status["tx_bytes"] > 0
    metrics = node.ns.run([sys.executable, "-c", "import urllib.request;print(urllib.request.urlopen('http://127.0.0.1:9555/metrics').read().decode())"]).stdout
    assert "anex_agent_handshake_age_seconds" in metrics and "anex_agent_forwards" in metrics


def test_agent_api_on_the_mesh_needs_the_cluster_token(mesh, node):
    assert_agent_api_needs_the_cluster_token(mesh, node.status())


def test_node_is_ready_at_the_coordinator(mesh, node):
    node_id = node.status()["node_id"]
    view = wait_until(lambda: (v := mesh.admin("GET", f"/v1/nodes/{node_id}")) and v["status"] and v, 30, "a heartbeat")
    assert view["state"] == "ready"
    assert view["status"]["engine"] == "wireguard-go"


def test_no_secret_on_any_command_line(mesh, node):
    """Tokens and private keys reach processes through the environment or files, never argv
    (which ``ps`` shows to every local user): the gateway, the agent, wireguard-go, the demo."""
    from pathlib import Path

    secrets = {"gateway join token": mesh.gateway_token, "admin token": mesh.admin_token,
               "node private key": (node.state_dir / "private.key").read_text().strip(),
               "gateway private key": (Path(mesh.workdir) / "gateway" / "private.key").read_text().strip()}
    assert all(secrets.values()), secrets.keys()
    seen = 0
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue  # exited meanwhile
        seen += "anex-agent" in argv or "wireguard-go" in argv
        for what, secret in secrets.items():
            assert secret not in argv, f"the {what} is on the command line of pid {entry.name}: {argv[:200]}"
    assert seen >= 3  # coordinator, gateway, agent (and wireguard-go) were looked at
