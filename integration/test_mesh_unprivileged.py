"""The native mesh's scenarios on a node whose agent runs unprivileged: a non-root user, no
capabilities (so no TUN device and no NET_ADMIN), no wireguard-go. ``auto`` picks the built-in
userspace engine, whose user-space TCP/IP stack talks to the Linux TCP stack of the cluster
namespace through the real gateway (wireguard-go)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from anex_agent.testing.mesh import (CLUSTER_IP, HTTP_PORT, SERVICE2_NAME, SERVICE_NAME, SINK_PORT, SOURCE_PORT,
                                  UNPRIVILEGED, UNPRIVILEGED_UID, wait_until)
from integration.conftest import TUNNEL_1, TUNNEL_2, assert_agent_api_needs_the_cluster_token, client
from integration.netns import read_line

PROXY = "127.0.0.1:3128"
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}"
INBOUND = 8090
UDP_INBOUND = 5300
BULK_DOWN, BULK_UP = 18090, 18091
PG_PORT, PG_TUNNEL = 5433, 15433
NOBODY = UNPRIVILEGED_UID


@pytest.fixture(scope="module")
def unode(mesh):
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    n = mesh.add_node_namespace()
    env = mesh.agent_env(n, **{
        "ANEX_ENGINE": "auto",
        "ANEX_INBOUND_PORTS": f"{INBOUND},{UDP_INBOUND}/udp",
        f"GW_TUNNEL_{TUNNEL_1}": f"{SERVICE_NAME}:{HTTP_PORT}",
        f"GW_TUNNEL_{TUNNEL_2}": f"{SERVICE2_NAME}:8081",
        f"GW_TUNNEL_{BULK_DOWN}": f"{CLUSTER_IP}:{SOURCE_PORT}",
        f"GW_TUNNEL_{BULK_UP}": f"{CLUSTER_IP}:{SINK_PORT}",
        f"GW_TUNNEL_{PG_TUNNEL}": f"{CLUSTER_IP}:{PG_PORT}",
    })
    mesh.start_agent(n, env, unprivileged=True)  # wireguard-go is on PATH: without capabilities it cannot run
    yield n
    mesh.stop_agent(n)


def test_agent_is_unprivileged_and_auto_picked_userspace(unode):
    status = unode.status()
    assert status["engine"] == "userspace"
    uid_line = [l for l in Path(f"/proc/{_agent_pid(unode)}/status").read_text().splitlines() if l.startswith(("Uid", "CapEff", "CapBnd"))]
    assert uid_line[0].split()[1:] == [str(NOBODY)] * 4
    assert all(l.split()[1] == "0000000000000000" for l in uid_line[1:])
    assert status["detect"]["engines"]["wireguard-go"]["supported"] is False
    assert status["detect"]["engines"]["kernel"]["supported"] is False


def _agent_pid(node) -> int:
    for pid in node.ns.pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if b"daemon" in cmd and not any(c.endswith(b"setpriv") for c in cmd[:1]):
            return pid
    raise AssertionError("no agent process")


def test_proxy_get_by_cluster_name(unode):
    result = client(unode.ns, "get", f"{URL}/hello?x=1", "--proxy", PROXY)
    assert result.get("status") == 200, result
    body = json.loads(result["body"])
    assert body["service"] == "echo" and body["path"] == "/hello?x=1" and body["peer"] == "10.77.0.1"


def test_proxy_post_streams_a_body_both_ways(unode):
    result = client(unode.ns, "get", f"{URL}/upload", "--proxy", PROXY, "--body-size", str(3 * 1024 * 1024 + 17))
    assert result.get("status") == 200, result
    assert result["length"] == 3 * 1024 * 1024 + 17 and result["sha256"] == result["sent_sha256"]


def test_connect_through_the_proxy(unode):
    result = client(unode.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", PROXY, "--path", "/tunnelled")
    assert result.get("status") == 200, result
    assert json.loads(result["body"])["path"] == "/tunnelled"


def test_gw_tunnels_and_bulk_both_ways(unode):
    first = client(unode.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/a")
    second = client(unode.ns, "get", f"http://127.0.0.1:{TUNNEL_2}/b")
    assert json.loads(first["body"])["service"] == "echo" and json.loads(second["body"])["service"] == "echo2"
    down = client(unode.ns, "bulk", f"127.0.0.1:{BULK_DOWN}", "--bytes", str(20_000_000), timeout=120)
    up = client(unode.ns, "bulk", f"127.0.0.1:{BULK_UP}", "--bytes", str(20_000_000), "--direction", "up", timeout=120)
    assert down.get("bytes") == 20_000_000 and up.get("bytes") == 20_000_000, (down, up)
    print(f"unprivileged bulk: down {down['mbit_s']:.0f} Mbit/s, up {up['mbit_s']:.0f} Mbit/s")


def test_proxy_502_names_a_host_that_does_not_resolve(unode):
    result = client(unode.ns, "get", "http://nosuch.default.svc.cluster.local:8080/", "--proxy", PROXY)
    assert result.get("status") == 502, result
    assert "nosuch.default.svc.cluster.local" in result["body"]


def test_tunnel_pushed_from_the_coordinator_goes_live(mesh, unode):
    node_id = unode.status()["node_id"]
    port = 19091
    mesh.admin("PUT", f"/v1/nodes/{node_id}/tunnels", {"tunnels": [{"listen_port": port, "target": f"{SERVICE_NAME}:{HTTP_PORT}"}]})
    try:
        result = wait_until(
            lambda: (r := client(unode.ns, "get", f"http://127.0.0.1:{port}/pushed", timeout=10)).get("status") == 200 and r,
            15, "the pushed tunnel answering",
        )
        assert json.loads(result["body"])["path"] == "/pushed"
    finally:
        mesh.admin("PUT", f"/v1/nodes/{node_id}/tunnels", {"tunnels": []})


def test_cluster_reaches_a_workload_port_at_the_mesh_address(mesh, unode):
    address = unode.status()["address"]
    server = unode.ns.popen(
        [*UNPRIVILEGED, sys.executable, "-m", "anex_agent.testing.services", "http", "--listen", f"127.0.0.1:{INBOUND}",
         "--name", "workload"], stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(server, 30, "workload server ready").strip() == "ready"
        result = client(mesh.cluster, "get", f"http://{address}:{INBOUND}/inbound")
        assert result.get("status") == 200, result
        body = json.loads(result["body"])
        assert body["service"] == "workload" and body["peer"] == "127.0.0.1"  # relayed from the mesh address
        closed = client(mesh.cluster, "get", f"http://{address}:{INBOUND + 1}/", "--timeout", "5")
        assert "error" in closed  # not an inbound port: refused
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_cluster_reaches_a_workload_udp_port_and_two_clients_keep_their_replies_apart(mesh, unode):
    """``ANEX_INBOUND_PORTS=...,5300/udp``: the built-in engine's stack serves the UDP port at the mesh
    address; two cluster clients asking at once each get the answer to their own question, from the
    mesh address and port they asked."""
    address = unode.status()["address"]
    server = unode.ns.popen(
        [*UNPRIVILEGED, sys.executable, "-m", "anex_agent.testing.services", "udp", "--listen",
         f"127.0.0.1:{UDP_INBOUND}", "--name", "workload"], stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(server, 30, "workload server ready").strip() == "ready"
        result = client(mesh.cluster, "udp", f"{address}:{UDP_INBOUND}", "--clients", "2")
        assert result.get("ok") is True, result
        assert [r["source"] for r in result["replies"]] == [f"{address}:{UDP_INBOUND}"] * 2
        assert all(r["reply"].startswith("workload ") for r in result["replies"])
        counters = unode.status()["userspace"]["inbound_udp"][f"{UDP_INBOUND}/udp"]
        assert counters["sessions"] >= 2 and counters["dropped_full"] == 0, counters
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_ping_the_mesh_address(mesh, unode):
    address = unode.status()["address"]
    out = mesh.cluster.run(["ping", "-c", "2", "-W", "3", address], check=False)
    assert out.returncode == 0, out.stdout + out.stderr


def _works(node) -> bool:
    by_proxy = client(node.ns, "get", f"{URL}/x", "--proxy", PROXY, timeout=8)
    by_tunnel = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_1}/y", timeout=8)
    return by_proxy.get("status") == 200 and by_tunnel.get("status") == 200


def test_gateway_restart_and_fail_static(mesh, unode):
    assert _works(unode)
    mesh.kill_gateway()
    mesh.start_gateway()
    restarted = time.monotonic()
    wait_until(lambda: _works(unode), 20, "traffic through the restarted gateway", interval=0.2)
    print(f"unprivileged node: traffic resumed {time.monotonic() - restarted:.1f} s after the gateway was back")
    mesh.stop_coordinator()
    try:
        wait_until(lambda: unode.status()["coordinator"]["reachable"] is False, 60, "the coordinator seen down", interval=0.5)
        assert _works(unode)  # fail static: the data plane keeps its last good config
    finally:
        mesh.start_coordinator()
    wait_until(lambda: unode.status()["coordinator"]["reachable"] is True, 90, "the coordinator back", interval=0.5)
    mesh.stop_gateway()
    mesh.start_gateway()
    wait_until(lambda: _works(unode), 20, "traffic after restoring the gateway", interval=0.3)


@pytest.mark.timeout(600)  # about 50 s on a quiet 2-core machine; several times that on a busy one
def test_many_concurrent_proxy_connections_complete_with_bounded_memory(unode):
    """``ANEX_MANY_CONNECTIONS`` (default 500) CONNECTs at once, 1 MB each; the agent's memory stays
    within its per-connection buffer bounds."""
    count = int(os.environ.get("ANEX_MANY_CONNECTIONS", "500"))
    pid = _agent_pid(unode)
    rss = lambda: int(next(l for l in Path(f"/proc/{pid}/status").read_text().splitlines()  # noqa: E731
                          if l.startswith("VmRSS:")).split()[1]) / 1024
    before = peak = rss()
    script = Path(__file__).resolve().parent / "many_connect.py"
    proc = unode.ns.popen([sys.executable, str(script), str(count), "1000000", f"{CLUSTER_IP}:{SOURCE_PORT}"],
                          stdout=subprocess.PIPE, text=True)
    started = time.monotonic()
    while proc.poll() is None and time.monotonic() - started < 560:
        peak = max(peak, rss())
        time.sleep(0.2)
    if proc.poll() is None:
        proc.kill()
    completed = int(proc.stdout.read().strip() or 0)
    print(f"{count} connections x 1 MB: {completed} complete in {time.monotonic() - started:.0f} s, "
          f"agent RSS {before:.0f} -> peak {peak:.0f} MiB")
    assert completed == count
    # each connection may hold at most its netstack send + receive buffers and the relay's copy buffers
    assert peak - before < count * 1.6
    assert unode.status()["userspace"]["netstack"]["connections"] < count  # they went away again


def test_agent_api_on_the_mesh_needs_the_cluster_token(mesh, unode):
    """Served by the engine's stack at the mesh address: the caller is the cluster, not loopback."""
    assert_agent_api_needs_the_cluster_token(mesh, unode.status())


@pytest.fixture(scope="module")
def cluster_postgres(mesh):
    """A PostgreSQL server of its own in the cluster namespace (trust authentication, test only)."""
    import glob
    import pwd
    import tempfile

    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not bins or shutil.which("psql") is None:
        pytest.skip("PostgreSQL server binaries or psql are not installed")
    bindir = Path(bins[-1]).parent
    try:
        pg = pwd.getpwnam("postgres")
    except KeyError:
        pytest.skip("no postgres user")
    data = Path(tempfile.mkdtemp(prefix="anex-it-pg-"))
    os.chown(data, pg.pw_uid, pg.pw_gid)
    as_pg = ["setpriv", f"--reuid={pg.pw_uid}", f"--regid={pg.pw_gid}", "--clear-groups", "--"]
    subprocess.run([*as_pg, str(bindir / "initdb"), "-D", str(data / "db"), "-U", "postgres", "--auth=trust"],
                   check=True, capture_output=True, timeout=120)
    with open(data / "db" / "pg_hba.conf", "a") as hba:
        hba.write(f"host all all {CLUSTER_IP.rsplit('.', 1)[0]}.0/24 trust\n")  # the gateway masquerades the mesh
    server = mesh.cluster.popen([*as_pg, str(bindir / "postgres"), "-D", str(data / "db"), "-p", str(PG_PORT),
                                 "-c", f"listen_addresses={CLUSTER_IP}", "-k", str(data)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(lambda: mesh.cluster.run([str(bindir / "pg_isready"), "-q", "-h", CLUSTER_IP, "-p", str(PG_PORT)],
                                        check=False).returncode == 0, 60, "PostgreSQL in the cluster namespace")
    yield
    server.terminate()
    server.wait(timeout=20)
    shutil.rmtree(data, ignore_errors=True)


def test_psql_to_postgresql_in_the_cluster_through_a_gw_tunnel(unode, cluster_postgres):
    """A real protocol through the forward: our TCP on the node, Linux's and PostgreSQL's in the cluster."""
    import hashlib

    query = "SELECT md5(string_agg(i::text, ',' ORDER BY i)) FROM generate_series(1, 300000) AS i"
    out = unode.ns.run(["psql", "-h", "127.0.0.1", "-p", str(PG_TUNNEL), "-U", "postgres", "-At", "-c", query],
                       check=False, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == hashlib.md5(",".join(str(i) for i in range(1, 300001)).encode()).hexdigest()
    rows = unode.ns.run(["psql", "-h", "127.0.0.1", "-p", str(PG_TUNNEL), "-U", "postgres", "-At", "-c",
                         "COPY (SELECT i, repeat('x', 200) FROM generate_series(1, 20000) AS i) TO STDOUT"],
                        check=False, timeout=60)
    assert rows.returncode == 0, rows.stderr
    lines = rows.stdout.splitlines()
    assert len(lines) == 20000 and lines[-1] == "20000\t" + "x" * 200
