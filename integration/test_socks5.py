"""The SOCKS5 proxy end to end: curl ``--socks5-hostname`` and ``--socks5`` through the agent into a
cluster service on the mesh, on wireguard-go (root) and on the built-in user-space engine (nobody,
no capabilities: the user-space TCP/IP stack's connections, relayed through the pooled buffers);
PySocks' DNS queries to the cluster's DNS through UDP ASSOCIATE (kernel UDP sockets through the
interface on wireguard-go, UDP ports of the stack on the user-space engine).

Both agents require a username and password (``ANEX_SOCKS_AUTH_FILE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from anex_agent.testing.mesh import CLUSTER_IP, DNS_PORT, HTTP_PORT, SERVICE_NAME, UNPRIVILEGED_UID

SOCKS = "127.0.0.1:1080"
USER = "alice:s3cret"
CURL_PROXY_ERROR = 97  # CURLE_PROXY: the proxy's handshake failed (curl 7.73+)


@pytest.fixture(scope="module", params=["wireguard-go", "userspace"])
def snode(request, mesh):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    unprivileged = request.param == "userspace"
    if unprivileged and shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    secrets = Path(tempfile.mkdtemp(prefix="anex-socks-"))
    auth_file = secrets / "socks-auth"
    auth_file.write_text(USER + "\n")
    os.chmod(auth_file, 0o600)
    if unprivileged:
        os.chown(secrets, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
        os.chown(auth_file, UNPRIVILEGED_UID, UNPRIVILEGED_UID)
    n = mesh.add_node_namespace()
    env = mesh.agent_env(n, ANEX_ENGINE=request.param,
                         ANEX_SOCKS_LISTEN=SOCKS, ANEX_SOCKS_AUTH_FILE=str(auth_file))
    mesh.start_agent(n, env, unprivileged=unprivileged)
    try:
        yield n
    finally:
        mesh.stop_agent(n)
        shutil.rmtree(secrets, ignore_errors=True)


def curl(node, *args: str, data: bytes | None = None) -> subprocess.CompletedProcess:
    return node.ns.run(["curl", "-sS", "--max-time", "30", *args], check=False, timeout=60, text=data is None,
                       input=data)


def test_the_engine_is_the_one_asked_for_and_status_shows_the_socks5_proxy(snode, request):
    status = snode.status()
    assert status["engine"] == request.node.callspec.params["snode"]
    assert status["socks"] == SOCKS


def test_curl_socks5_hostname_reaches_a_cluster_service_by_its_cluster_name(snode):
    out = curl(snode, "--socks5-hostname", SOCKS, "-U", USER, f"http://{SERVICE_NAME}:{HTTP_PORT}/via-socks?x=1")
    assert out.returncode == 0, out.stderr
    body = json.loads(out.stdout)
    assert body["service"] == "echo" and body["path"] == "/via-socks?x=1"
    assert body["peer"] == "10.77.0.1"  # the cluster saw the gateway (masquerade)


def test_curl_socks5_with_an_address_and_a_body_both_ways(snode):
    payload = os.urandom(2 * 1024 * 1024 + 7)
    out = curl(snode, "--socks5", SOCKS, "-U", USER, "--data-binary", "@-", f"http://{CLUSTER_IP}:{HTTP_PORT}/up",
               data=payload)
    assert out.returncode == 0, out.stderr
    assert hashlib.sha256(out.stdout).hexdigest() == hashlib.sha256(payload).hexdigest()


def test_a_name_the_cluster_does_not_know_is_host_unreachable(snode):
    out = curl(snode, "--socks5-hostname", SOCKS, "-U", USER, f"http://nosuch.default.svc.cluster.local:{HTTP_PORT}/")
    assert out.returncode == CURL_PROXY_ERROR, (out.returncode, out.stderr)
    assert "(4)" in out.stderr, out.stderr  # curl names the reply code: 04, host unreachable


def test_without_the_credentials_nothing_goes_through(snode):
    for user in (["-U", "alice:wrong"], []):
        out = curl(snode, "--socks5-hostname", SOCKS, *user, f"http://{SERVICE_NAME}:{HTTP_PORT}/")
        assert out.returncode == CURL_PROXY_ERROR and out.stdout == "", (user, out.returncode, out.stderr)


# PySocks (a third-party SOCKS5 client) asks a DNS server for an A record through UDP ASSOCIATE
PYSOCKS_DNS = """
import json, socket, sys
import dns.message, socks
server, port, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
user, password = sys.argv[4].split(":", 1)
query = dns.message.make_query(name, "A")
sock = socks.socksocket(socket.AF_INET, socket.SOCK_DGRAM)
sock.set_proxy(socks.SOCKS5, "127.0.0.1", 1080, rdns=True, username=user, password=password)
sock.settimeout(20)
sock.sendto(query.to_wire(), (server, port))
data, source = sock.recvfrom(4096)
answer = dns.message.from_wire(data)
print(json.dumps({"id_matches": answer.id == query.id, "source": list(source), "rcode": answer.rcode(),
                  "a": [item.address for rrset in answer.answer for item in rrset]}))
"""


def pysocks_dns(node, server: str, name: str) -> dict:
    out = node.ns.run([sys.executable, "-c", PYSOCKS_DNS, server, str(DNS_PORT), name, USER], check=False,
                      timeout=60, text=True)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_pysocks_asks_the_cluster_dns_over_udp_associate(snode):
    answer = pysocks_dns(snode, CLUSTER_IP, SERVICE_NAME)
    assert answer == {"id_matches": True, "source": [CLUSTER_IP, DNS_PORT], "rcode": 0, "a": [CLUSTER_IP]}


def test_pysocks_names_the_dns_server_by_its_cluster_name_and_the_agent_resolves_it(snode):
    answer = pysocks_dns(snode, SERVICE_NAME, "nosuch.default.svc.cluster.local")
    assert answer == {"id_matches": True, "source": [CLUSTER_IP, DNS_PORT], "rcode": 3, "a": []}  # NXDOMAIN, from it
