"""The WebSocket relay through real outside parts, from Debian's packages (scripts/install-deps):

* tinyproxy as a corporate proxy: a node that can send no UDP and reach no TCP port but the
  proxy's joins the coordinator and reaches the relay (HTTP ``CONNECT``) through it
  (``HTTP_PROXY``);
* nginx terminating TLS in front of the relay with a certificate from a CA this test
  creates: the gateway advertises the ``wss://`` URL of nginx, the agent verifies the
  certificate against ``ANEX_CA_FILE``; without that CA it refuses the relay.

Skipped, with the reason, where nginx or tinyproxy is not installed.
"""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest

from anex_agent.testing.mesh import COORDINATOR_PORT, HTTP_PORT, SERVICE_NAME, UNDERLAY_GW, WS_PORT, wait_until
from integration.conftest import client
from tests.tls_certs import make_certs

PROXY_PORT = 8888
TLS_PORT = 8444
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}"


def get_ok(ns, path: str) -> bool:
    try:
        return client(ns, "get", f"{URL}{path}", "--proxy", "127.0.0.1:3128", timeout=8).get("status") == 200
    except subprocess.TimeoutExpired:
        return False


def start_in(ns, argv: list[str], log) -> subprocess.Popen:
    return ns.popen(argv, stdout=log, stderr=subprocess.STDOUT)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def port_open(ns, host: str, port: int) -> bool:
    code = f"import socket;socket.create_connection(({host!r},{port}),timeout=1).close()"
    return ns.run(["python3", "-c", code], check=False).returncode == 0


@pytest.fixture(scope="module")
def tinyproxy(mesh):
    if shutil.which("tinyproxy") is None:
        pytest.skip("tinyproxy is not installed (scripts/install-deps installs it)")
    conf = mesh.workdir / "tinyproxy.conf"
    conf.write_text(f"Port {PROXY_PORT}\nListen {UNDERLAY_GW}\nTimeout 600\nAllow 192.168.100.0/24\n"
                    f"ConnectPort {WS_PORT}\nConnectPort {COORDINATOR_PORT}\nConnectPort 443\nMaxClients 100\nLogLevel Connect\n")
    proc = start_in(mesh.gateway, ["tinyproxy", "-d", "-c", str(conf)], open(mesh.workdir / "tinyproxy.log", "ab"))
    wait_until(lambda: port_open(mesh.gateway, UNDERLAY_GW, PROXY_PORT), 10, "tinyproxy listening")
    yield proc
    stop(proc)


def test_a_node_whose_only_way_out_is_a_connect_proxy_joins_through_it(mesh, tinyproxy):
    n = mesh.add_node_namespace()
    mesh.block_udp(n, except_tcp_to=(f"{UNDERLAY_GW}:{PROXY_PORT}",))
    assert not port_open(n.ns, UNDERLAY_GW, WS_PORT)  # the relay itself is out of reach
    assert not port_open(n.ns, UNDERLAY_GW, COORDINATOR_PORT)  # and so is the coordinator
    env = mesh.agent_env(n, ANEX_PATH="auto", HTTP_PROXY=f"http://{UNDERLAY_GW}:{PROXY_PORT}",
                         NO_PROXY="localhost,127.0.0.1")
    mesh.start_agent(n, env)
    try:
        status = n.status()
        assert status["path"] == "websocket"
        (relay,) = status["path_choice"]["relays"].values()
        assert relay["connected"] and relay["proxy"] == f"http://{UNDERLAY_GW}:{PROXY_PORT}"
        assert get_ok(n.ns, "/through-the-proxy")
        assert status["coordinator"]["reachable"] is True  # joined and heartbeating through the proxy too
        log = (mesh.workdir / "tinyproxy.log").read_text(errors="replace")
        assert f"CONNECT {UNDERLAY_GW}:{WS_PORT}" in log or "Established connection" in log, log[-2000:]
    finally:
        mesh.stop_agent(n)
        mesh.unblock_udp(n)


@pytest.fixture(scope="module")
def nginx_tls(mesh):
    """nginx in the gateway namespace terminating TLS on TLS_PORT in front of the relay; the gateway
    advertises nginx's wss:// URL while the fixture lives."""
    if shutil.which("nginx") is None:
        pytest.skip("nginx is not installed (scripts/install-deps installs it)")
    work = mesh.workdir / "nginx"
    work.mkdir(exist_ok=True)
    certs = make_certs(work, ip=UNDERLAY_GW, dns_names=())
    conf = work / "nginx.conf"
    conf.write_text(f"""
worker_processes 1;
pid {work}/nginx.pid;
error_log {work}/error.log info;
events {{ worker_connections 256; }}
http {{
  access_log {work}/access.log;
  client_body_temp_path {work}/body; proxy_temp_path {work}/proxy; fastcgi_temp_path {work}/fcgi;
  uwsgi_temp_path {work}/uwsgi; scgi_temp_path {work}/scgi;
  server {{
    listen {UNDERLAY_GW}:{TLS_PORT} ssl;
    ssl_certificate {certs.cert};
    ssl_certificate_key {certs.key};
    location /relay {{
      proxy_pass http://127.0.0.1:{WS_PORT};
      proxy_http_version 1.1;
      proxy_set_header Upgrade $http_upgrade;
      proxy_set_header Connection "upgrade";
      proxy_set_header X-Forwarded-For $remote_addr;
      proxy_read_timeout 3600s;
      proxy_send_timeout 3600s;
      proxy_buffering off;
    }}
  }}
}}
""")
    proc = start_in(mesh.gateway, ["nginx", "-c", str(conf), "-g", "daemon off;"], open(work / "nginx.out", "ab"))
    wait_until(lambda: port_open(mesh.gateway, UNDERLAY_GW, TLS_PORT), 10, "nginx listening")
    mesh.stop_gateway()
    mesh.start_gateway(ws_url=f"wss://{UNDERLAY_GW}:{TLS_PORT}/relay")
    try:
        yield certs.ca
    finally:
        mesh.stop_gateway()
        mesh.start_gateway()
        stop(proc)


def test_relay_behind_nginx_terminating_tls_with_the_agent_verifying_it(mesh, nginx_tls):
    n = mesh.add_node_namespace()
    mesh.block_udp(n)
    mesh.start_agent(n, mesh.agent_env(n, ANEX_PATH="auto", ANEX_CA_FILE=str(nginx_tls)))
    try:
        status = n.status()
        assert status["path"] == "websocket"
        (relay,) = status["path_choice"]["relays"].values()
        assert relay["connected"] and relay["url"] == f"wss://{UNDERLAY_GW}:{TLS_PORT}/relay"
        assert get_ok(n.ns, "/through-nginx")
        gateway_log = (mesh.workdir / "gateway.log").read_text(errors="replace")
        assert f"from 127.0.0.1:" in gateway_log and f"(forwarded for {n.underlay})" in gateway_log  # via nginx
    finally:
        mesh.stop_agent(n)
        mesh.unblock_udp(n)


def test_without_the_ca_the_agent_refuses_the_relay(mesh, nginx_tls):
    n = mesh.add_node_namespace()
    mesh.block_udp(n)
    mesh.start_agent(n, mesh.agent_env(n, ANEX_PATH="auto"), wait_ready=False)
    try:
        wait_until(lambda: "CERTIFICATE_VERIFY_FAILED" in n.log() or "certificate verify failed" in n.log(), 30,
                   "the agent refusing the relay's certificate")
        time.sleep(1)
        status = n.status()
        assert status["path"] == "websocket"
        (relay,) = status["path_choice"]["relays"].values()
        assert not relay["connected"] and "certificate" in (relay["last_error"] or "").lower()
        assert not get_ok(n.ns, "/must-not-work")
    finally:
        mesh.stop_agent(n)
        mesh.unblock_udp(n)
