"""The gateway's forwarding + nftables rules, for real: node -> gateway (WireGuard) -> cluster, with masquerade.

Namespaces: ``node`` --veth-- ``gw`` --veth-- ``cluster``. WireGuard (our wireguard-go
engine, via ``engine_driver.py``) joins node and gw. The cluster namespace knows no
route back to the mesh, so the node reaches the cluster only through the gateway's
masquerade. The rules and the sysctl are installed by our own gateway modules
(:mod:`anex_agent.gateway.nft`, :mod:`anex_agent.gateway.forwarding`) run inside ``gw``.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time

import pytest

from integration.netns import Netns, missing_prerequisites, read_line, unique, veth
from integration.test_engines import REPO, Side

REASON = missing_prerequisites("wireguard-go", "nft", "ping")
pytestmark = pytest.mark.skipif(REASON is not None, reason=REASON or "")

MESH = "10.73.0.0/16"
ROUTED = "172.30.0.0/24"      # given to the gateway as --route
NOT_ROUTED = "172.31.0.0/24"  # reachable from gw, but not a --route: must stay closed


def _in_gw(gw: Netns, code: str) -> subprocess.CompletedProcess:
    return gw.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": REPO}, check=False)


def _ping(ns: Netns, addr: str) -> bool:
    return ns.run(["ping", "-c", "1", "-W", "1", addr], check=False).returncode == 0


@contextlib.contextmanager
def _mesh(second_node: bool = False):
    """node [+ node2] -- gw -- cluster; yields (node, node2 or None, gw, cluster, hub)."""
    node, gw, cluster = Netns("rn"), Netns("rg"), Netns("rc")
    node2 = Netns("rm") if second_node else None
    namespaces = [ns for ns in (node, node2, gw, cluster) if ns is not None]
    sides: list[Side] = []
    try:
        for ns in namespaces:
            ns.create()
        veth(node, gw, "192.168.73.2/24", "192.168.73.1/24")
        veth(gw, cluster, "172.30.0.1/24", "172.30.0.2/24")
        cluster.run(["ip", "addr", "add", "172.31.0.2/24", "dev", cluster.check_output(
            ["ip", "-o", "-4", "addr", "show", "to", "172.30.0.2"]).split()[1]])
        gw_if = [l.split()[1] for l in gw.check_output(["ip", "-o", "-4", "addr"]).splitlines() if "172.30.0.1" in l][0]
        gw.run(["ip", "addr", "add", "172.31.0.1/24", "dev", gw_if])
        hub = Side(gw, unique("anxrg"))
        sides.append(hub)
        spokes = [(node, "10.73.0.2", "192.168.73.1")]
        if node2 is not None:
            veth(node2, gw, "192.168.74.2/24", "192.168.74.1/24")
            spokes.append((node2, "10.73.0.3", "192.168.74.1"))
        created = []
        for ns, address, underlay in spokes:
            spoke = Side(ns, unique("anxrn"))
            sides.append(spoke)
            created.append((spoke, address, underlay))
        hub.apply(listen_port=51820, address="10.73.0.1/16", mtu=1420,
                  peers=[{"public_key": spoke.public, "allowed_ips": [f"{address}/32"]} for spoke, address, _ in created])
        for spoke, address, underlay in created:
            spoke.apply(listen_port=None, address=f"{address}/32", mtu=1420, routes=[MESH, ROUTED, NOT_ROUTED],
                        peers=[{"public_key": hub.public, "endpoint": f"{underlay}:51820",
                                "allowed_ips": [MESH, ROUTED, NOT_ROUTED], "persistent_keepalive": 25}])
        yield node, node2, gw, cluster, hub
    finally:
        for side in sides:
            try:
                side.stop()
            except Exception:
                pass
        for ns in namespaces:
            ns.close()


@pytest.fixture
def topology():
    with _mesh() as (node, _, gw, cluster, hub):
        yield node, gw, cluster, hub


def test_masquerade_lets_the_node_reach_only_the_routed_network(topology):
    node, gw, cluster, hub = topology
    assert _ping(node, "10.73.0.1"), "tunnel not up"
    table = "anex_gw_" + unique("t")
    setup = (
        "from anex_agent.gateway import forwarding, nft\n"
        "print(forwarding.enable())\n"
        f"nft.install(nft.GatewayRules(table={table!r}, mesh_ifname={hub.ifname!r}, mesh_network={MESH!r},"
        f" mesh_address='10.73.0.1', routes=({ROUTED!r},)))\n"
    )
    # Without our rules the cluster cannot answer: it has no route to the mesh.
    gw.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
    assert not _ping(node, "172.30.0.2")
    gw.run(["sh", "-c", "echo 0 > /proc/sys/net/ipv4/ip_forward"])

    result = _in_gw(gw, setup)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "0"  # forwarding was off and we turned it on
    assert gw.check_output(["cat", "/proc/sys/net/ipv4/ip_forward"]).strip() == "1"

    assert _ping(node, "172.30.0.2"), "node cannot reach the routed cluster network through the gateway"
    # the cluster saw the gateway's address, not the node's mesh address (masquerade)
    server = cluster.popen([sys.executable, "-c",
                            "import socket;s=socket.create_server(('172.30.0.2',8080));c,a=s.accept();"
                            "c.sendall(a[0].encode());c.close()"])
    try:
        seen = node.run([sys.executable, "-c",
                         "import socket,time\nend=time.monotonic()+20\nwhile True:\n try: s=socket.create_connection(('172.30.0.2',8080),2);break\n"
                         " except OSError:\n  if time.monotonic()>end: raise\n  time.sleep(0.1)\nprint(s.recv(100).decode())"], timeout=30).stdout.strip()
    finally:
        server.wait(timeout=10)
    assert seen == "172.30.0.1"
    assert not _ping(node, "172.31.0.2"), "a network that is not a --route must stay closed"

    # Removing the table and restoring the sysctl leaves the gateway namespace as it was.
    teardown = f"from anex_agent.gateway import forwarding, nft\nprint(nft.remove({table!r}))\nforwarding.restore('0')\n"
    result = _in_gw(gw, teardown)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    assert table not in gw.check_output(["nft", "list", "tables"])
    assert gw.check_output(["cat", "/proc/sys/net/ipv4/ip_forward"]).strip() == "0"
    assert not _ping(node, "172.30.0.2")


def test_dns_port_on_the_mesh_address_is_closed_from_outside_the_mesh(topology):
    node, gw, cluster, hub = topology
    table = "anex_gw_" + unique("d")
    result = _in_gw(gw, "from anex_agent.gateway import nft\n"
                        f"nft.install(nft.GatewayRules(table={table!r}, mesh_ifname={hub.ifname!r}, mesh_network={MESH!r},"
                        f" mesh_address='10.73.0.1', routes=({ROUTED!r},)))\n")
    assert result.returncode == 0, result.stderr
    listener = gw.popen([sys.executable, "-c",
                         "import socket\ns=socket.create_server(('10.73.0.1',53))\n"
                         "while True:\n c,a=s.accept();c.sendall(b'hi');c.close()"])
    connect = ("import socket,sys\ntry:\n s=socket.create_connection(('10.73.0.1',53),2);print(s.recv(2).decode())\n"
               "except OSError as e: print('closed')")
    # From the mesh the port must open; the listener process and the tunnel's handshake may
    # still be starting, so the first check retries for a while (the second must not).
    connect_retrying = ("import socket,time\ndeadline=time.monotonic()+15\nwhile True:\n try:\n"
                        "  s=socket.create_connection(('10.73.0.1',53),2);print(s.recv(2).decode());break\n"
                        " except OSError:\n  if time.monotonic()>deadline: print('closed');break\n  time.sleep(0.2)")
    try:
        cluster.run(["ip", "route", "add", MESH, "via", "172.30.0.1"])
        assert node.run([sys.executable, "-c", connect_retrying], timeout=30).stdout.strip() == "hi"  # from the mesh: open
        assert cluster.run([sys.executable, "-c", connect], timeout=20).stdout.strip() == "closed"  # from elsewhere
    finally:
        listener.terminate()
        _in_gw(gw, f"from anex_agent.gateway import nft\nnft.remove({table!r})\n")


# Listeners on the gateway host: services bound to every address (a kubelet, sshd) and
# the DNS port on the mesh address, TCP and UDP. Each TCP one greets with b"hi", UDP echoes.
HOST_SERVICES = """
import socket, threading
def tcp(host, port):
    s = socket.create_server((host, port))
    def serve():
        while True:
            c, _ = s.accept(); c.sendall(b"hi"); c.close()
    threading.Thread(target=serve, daemon=True).start()
def udp(host, port):
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind((host, port))
    def serve():
        while True:
            data, peer = s.recvfrom(100); s.sendto(data, peer)
    threading.Thread(target=serve, daemon=True).start()
tcp("0.0.0.0", 10250); tcp("0.0.0.0", 22); tcp("10.73.0.1", 53); udp("10.73.0.1", 53)
print("ready", flush=True)
threading.Event().wait()
"""

# Probes run in parallel from a node; prints {"tcp 10.73.0.1:22": true, ...} (true: answered).
PROBE = """
import json, socket, subprocess, sys
from concurrent.futures import ThreadPoolExecutor
def tcp(host, port):
    try:
        with socket.create_connection((host, port), 2) as s:
            return s.recv(2) == b"hi"
    except OSError:
        return False
def udp(host, port):
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.settimeout(2)
        try:
            s.sendto(b"q", (host, port)); return s.recvfrom(10)[0] == b"q"
        except OSError:
            return False
def ping(host, _port):
    return subprocess.run(["ping", "-c", "1", "-W", "2", host], capture_output=True).returncode == 0
probes = json.loads(sys.argv[1])
with ThreadPoolExecutor(len(probes)) as pool:
    answers = list(pool.map(lambda p: {"tcp": tcp, "udp": udp, "ping": ping}[p[0]](p[1], p[2]), probes))
print(json.dumps({f"{k} {h}:{p}": a for (k, h, p), a in zip(probes, answers)}))
"""


def _probe(ns: Netns, probes: list[tuple[str, str, int]]) -> dict[str, bool]:
    result = ns.run([sys.executable, "-c", PROBE, json.dumps(probes)], timeout=30, check=False)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


def _wait_ping(ns: Netns, addr: str, within: float = 15.0) -> bool:
    deadline = time.monotonic() + within
    while not _ping(ns, addr):
        if time.monotonic() > deadline:
            return False
    return True


def _install(gw: Netns, table: str, hub: Side, routes: tuple[str, ...], dns: bool = True) -> None:
    result = _in_gw(gw, "from anex_agent.gateway import forwarding, nft\nforwarding.enable()\n"
                        f"nft.install(nft.GatewayRules(table={table!r}, mesh_ifname={hub.ifname!r}, mesh_network={MESH!r},"
                        f" mesh_address='10.73.0.1', routes={routes!r}, dns={dns!r}))\n")
    assert result.returncode == 0, result.stderr


HOST_ONLY = [("tcp", "10.73.0.1", 10250), ("tcp", "10.73.0.1", 22),      # bound to 0.0.0.0, via the mesh address
             ("tcp", "172.30.0.1", 10250), ("tcp", "172.31.0.1", 22),    # the host's other addresses, via the mesh
             ("ping", "172.30.0.1", 0)]
MESH_SERVICES = [("tcp", "10.73.0.1", 53), ("udp", "10.73.0.1", 53), ("ping", "10.73.0.1", 0), ("ping", "172.30.0.2", 0)]


def test_gateway_host_services_are_closed_to_the_mesh(topology):
    node, gw, cluster, hub = topology
    assert _wait_ping(node, "10.73.0.1"), "tunnel not up"
    services = gw.popen([sys.executable, "-c", HOST_SERVICES], stdout=subprocess.PIPE, text=True)
    table = "anex_gw_" + unique("h")
    try:
        assert read_line(services, 20, "host services ready").strip() == "ready"
        gw.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
        # Without our table every one of them answers through the mesh (the test can fail).
        before = _probe(node, HOST_ONLY)
        assert all(before.values()), before

        _install(gw, table, hub, (ROUTED,))
        after = _probe(node, HOST_ONLY + MESH_SERVICES)
        assert not any(after[f"{k} {h}:{p}"] for k, h, p in HOST_ONLY), after
        assert all(after[f"{k} {h}:{p}"] for k, h, p in MESH_SERVICES), after  # DNS, echo, the --route network
        # the same services stay open from outside the mesh (the host's own firewall decides there)
        outside = _probe(cluster, [("tcp", "172.30.0.1", 10250), ("tcp", "172.30.0.1", 22)])
        assert all(outside.values()), outside

        # Installing again (a restart) replaces the table: same verdicts, one table.
        _install(gw, table, hub, (ROUTED,))
        assert gw.check_output(["nft", "list", "tables"]).count(table) == 1
        assert _probe(node, [("tcp", "10.73.0.1", 22), ("tcp", "10.73.0.1", 53)]) == {
            "tcp 10.73.0.1:22": False, "tcp 10.73.0.1:53": True}

        # Removing the table gives the host back as it was.
        _in_gw(gw, f"from anex_agent.gateway import nft\nnft.remove({table!r})\n")
        assert _probe(node, [("tcp", "10.73.0.1", 22)]) == {"tcp 10.73.0.1:22": True}
    finally:
        services.kill()
        services.wait(timeout=10)
        _in_gw(gw, f"from anex_agent.gateway import nft\nnft.remove({table!r})\n")


def test_nodes_do_not_reach_each_other_through_the_gateway():
    with _mesh(second_node=True) as (node, node2, gw, cluster, hub):
        assert _wait_ping(node, "10.73.0.1") and _wait_ping(node2, "10.73.0.1"), "tunnels not up"
        gw.run(["sh", "-c", "echo 1 > /proc/sys/net/ipv4/ip_forward"])
        listener = node2.popen([sys.executable, "-c", "import socket\ns=socket.create_server(('0.0.0.0',7000))\n"
                                "while True:\n c,a=s.accept();c.sendall(b'hi');c.close()"])
        table = "anex_gw_" + unique("n")
        try:
            # Without our table the hub forwards node -> node (the test can fail).
            deadline = time.monotonic() + 15
            while not _probe(node, [("tcp", "10.73.0.3", 7000)])["tcp 10.73.0.3:7000"]:
                assert time.monotonic() < deadline, "node2's listener never answered through the hub"
            assert _ping(node, "10.73.0.3")
            # Even a --route that covers the mesh network does not open node -> node.
            _install(gw, table, hub, (ROUTED, "10.0.0.0/8"))
            after = _probe(node, [("tcp", "10.73.0.3", 7000), ("ping", "10.73.0.3", 0), ("ping", "172.30.0.2", 0)])
            assert after == {"tcp 10.73.0.3:7000": False, "ping 10.73.0.3:0": False, "ping 172.30.0.2:0": True}, after
            assert not _probe(node2, [("ping", "10.73.0.2", 0)])["ping 10.73.0.2:0"]
        finally:
            listener.kill()
            listener.wait(timeout=10)
            _in_gw(gw, f"from anex_agent.gateway import nft\nnft.remove({table!r})\n")
