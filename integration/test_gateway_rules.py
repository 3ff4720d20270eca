"""The gateway's forwarding + nftables rules, for real: node -> gateway (WireGuard) -> cluster, with masquerade.

Namespaces: ``node`` --veth-- ``gw`` --veth-- ``cluster``. WireGuard (our wireguard-go
engine, via ``engine_driver.py``) joins node and gw. The cluster namespace knows no
route back to the mesh, so the node reaches the cluster only through the gateway's
masquerade. The rules and the sysctl are installed by our own gateway modules
(:mod:`anex_agent.gateway.nft`, :mod:`anex_agent.gateway.forwarding`) run inside ``gw``.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from integration.netns import Netns, missing_prerequisites, unique, veth
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


@pytest.fixture
def topology():
    node, gw, cluster = Netns("rn"), Netns("rg"), Netns("rc")
    sides: list[Side] = []
    try:
        for ns in (node, gw, cluster):
            ns.create()
        veth(node, gw, "192.168.73.2/24", "192.168.73.1/24")
        veth(gw, cluster, "172.30.0.1/24", "172.30.0.2/24")
        cluster.run(["ip", "addr", "add", "172.31.0.2/24", "dev", cluster.check_output(
            ["ip", "-o", "-4", "addr", "show", "to", "172.30.0.2"]).split()[1]])
        gw_if = [l.split()[1] for l in gw.check_output(["ip", "-o", "-4", "addr"]).splitlines() if "172.30.0.1" in l][0]
        gw.run(["ip", "addr", "add", "172.31.0.1/24", "dev", gw_if])
        hub = Side(gw, unique("anxrg"))
        sides.append(hub)
        spoke = Side(node, unique("anxrn"))
        sides.append(spoke)
        hub.apply(listen_port=51820, address="10.73.0.1/16", mtu=1420,
                  peers=[{"public_key": spoke.public, "allowed_ips": ["10.73.0.2/32"]}])
        spoke.apply(listen_port=None, address="10.73.0.2/32", mtu=1420, routes=[MESH, ROUTED, NOT_ROUTED],
                    peers=[{"public_key": hub.public, "endpoint": "192.168.73.1:51820",
                            "allowed_ips": [MESH, ROUTED, NOT_ROUTED], "persistent_keepalive": 25}])
        yield node, gw, cluster, hub
    finally:
        for side in sides:
            try:
                side.stop()
            except Exception:
                pass
        for ns in (node, gw, cluster):
            ns.close()


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
