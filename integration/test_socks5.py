"""The SOCKS5 proxy end to end: curl ``--socks5-hostname`` and ``--socks5`` through the agent into a
cluster service on the mesh, on wireguard-go (root) and on the built-in user-space engine (nobody,
no capabilities: the user-space TCP/IP stack's connections, relayed through the pooled buffers).

Both agents require a username and password (``ANEX_SOCKS_AUTH_FILE``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, SERVICE_NAME, UNPRIVILEGED_UID

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
