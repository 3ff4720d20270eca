"""A data plane that heals itself, through the real processes in namespaces.

* the gateway SIGKILLed and restarted, with the coordinator down and up: a workload on the
  node fetching through the proxy every 0.2 s gets answers again once the gateway is back,
  because the node detects the dead peer and handshakes again by itself (no coordinator
  needed); the time it takes is printed (``recovery:`` lines) and measured against its 3 s
  goal by ``bench/bench_failover.py``;
* a second gateway and a second agent started on a running one's state dir are refused and
  change nothing; a crashed (SIGKILLed) instance does not block a restart;
* an idle tunnel sends no extra handshakes.

Runs on the session mesh with its own node (module fixture); its nodes use ``ANEX_PATH=udp``
where the measure is the dead-peer detection's alone (the WebSocket path has its own tests).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, WG_PORT, anex_argv, wait_until
from anex_agent.host.statelock import LOCK_NAME
from integration.conftest import client, ns_state

PROXY = "127.0.0.1:3128"
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}"

#: The workload: one request through the proxy every 0.2 s (each in its own thread, 2 s
#: timeout); prints one JSON line per request: when it started, when it ended, whether it got 200.
WORKLOAD = r"""
import json, sys, threading, time, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://" + sys.argv[2]}))
lock = threading.Lock()
def one(i):
    start = time.time()
    try:
        ok = opener.open(sys.argv[1] + "/w%d" % i, timeout=2).status == 200
    except Exception:
        ok = False
    with lock:
        print(json.dumps({"start": start, "end": time.time(), "ok": ok}), flush=True)
i = 0
while True:
    threading.Thread(target=one, args=(i,), daemon=True).start()
    i += 1
    time.sleep(0.2)
"""


class Workload:
    """The workload above, running in the node's namespace; its results collected in a thread."""

    def __init__(self, ns) -> None:
        self.proc = ns.popen([sys.executable, "-c", WORKLOAD, URL, PROXY], stdout=subprocess.PIPE, text=True)
        self.results: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                self.results.append(json.loads(line))
            except ValueError:
                pass

    def first_ok_after(self, t: float) -> float | None:
        """When the first request that started after ``t`` succeeded (its answer's arrival)."""
        ends = [r["end"] for r in list(self.results) if r["ok"] and r["start"] >= t]
        return min(ends) if ends else None

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(timeout=10)


@pytest.fixture(scope="module")
def node(mesh):
    n = mesh.add_node_namespace()
    mesh.start_agent(n, mesh.agent_env(n, ANEX_PATH="udp"))
    yield n
    mesh.stop_agent(n)


def _restart_and_measure(mesh, node, *, coordinator_up: bool) -> dict:
    workload = Workload(node.ns)
    try:
        wait_until(lambda: workload.first_ok_after(time.time() - 1.0), 20, "the workload getting answers")
        killed = time.time()
        mesh.kill_gateway()
        time.sleep(0.5)  # the workload notices: requests fail
        assert workload.first_ok_after(time.time()) is None
        restarted = time.time()
        mesh.start_gateway(registered=coordinator_up)
        back = time.time()  # the restarted gateway's interface is up
        wait_until(lambda: workload.first_ok_after(back), 20, "the workload getting answers again", interval=0.1)
        time.sleep(0.5)
        healed = workload.first_ok_after(back)
        figures = {
            "coordinator": "up" if coordinator_up else "down",
            "gateway_start_s": round(back - restarted, 2),
            "recovered_after_gateway_back_s": round(healed - back, 2),
            "recovered_after_restart_s": round(healed - restarted, 2),
            "outage_from_kill_s": round(healed - killed, 2),
        }
        print("recovery:", json.dumps(figures))
        return figures
    finally:
        workload.stop()


def test_gateway_killed_and_restarted_with_the_coordinator_down_heals_by_itself(mesh, node):
    mesh.stop_coordinator()
    try:
        _restart_and_measure(mesh, node, coordinator_up=False)
        status = node.status()
    finally:
        mesh.start_coordinator()
    # the node did it by itself: detected, logged, shown in /status and the heartbeat's status
    assert status["dead_peer"]["detections"] >= 1
    event = status["dead_peer"]["events"][-1]
    assert "nothing received" in event["reason"] and event["recovered_after"] is not None
    assert "dead peer: data sent to the gateways and nothing received" in node.log()
    wait_until(lambda: node.status()["coordinator"]["reachable"] is True, 90, "the agent reaching the coordinator again",
               interval=0.5)
    # leave the gateway registered with the coordinator that is back (its watch may sit in a backoff)
    mesh.stop_gateway()
    mesh.start_gateway()


def test_gateway_killed_and_restarted_with_the_coordinator_up_heals(mesh, node):
    _restart_and_measure(mesh, node, coordinator_up=True)
    # the heartbeat carries the last detection: the coordinator's node view shows it
    node_id = node.status()["node_id"]
    view = wait_until(lambda: (v := mesh.admin("GET", f"/v1/nodes/{node_id}")) and
                      "nothing received" in ((v.get("status") or {}).get("dead_peer") or "") and v, 60,
                      "a heartbeat with the dead-peer detection", interval=1.0)
    assert "handshake again after" in view["status"]["dead_peer"]


#: One HTTP/1.1 keep-alive connection held across a gateway restart: a request, a line on
#: stdin, a second request on the same connection; prints each status line.
IDLE_CONNECTION = r"""
import socket, sys
sock = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
def ask(path):
    sock.sendall(("GET %s HTTP/1.1\r\nHost: x\r\n\r\n" % path).encode())
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(4096)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int([l.split(b":")[1] for l in head.split(b"\r\n") if l.lower().startswith(b"content-length")][0])
    while len(body) < length:
        body += sock.recv(4096)
    print(head.split(b"\r\n")[0].decode(), flush=True)
ask("/idle-1")
sys.stdin.readline()
ask("/idle-2")
"""


def test_an_idle_connection_survives_a_gateway_restart(mesh, node):
    from anex_agent.testing.mesh import CLUSTER_IP

    conn = node.ns.popen([sys.executable, "-c", IDLE_CONNECTION, CLUSTER_IP, str(HTTP_PORT)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert conn.stdout.readline().startswith("HTTP/1.1 200")
        mesh.kill_gateway()
        mesh.start_gateway()
        conn.stdin.write("\n")
        conn.stdin.flush()
        out, err = conn.communicate(timeout=30)
        assert out.startswith("HTTP/1.1 200"), (out, err)  # the same connection, through the restarted gateway
    finally:
        if conn.poll() is None:
            conn.kill()
            conn.wait()


def _state_files(state_dir) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(state_dir.iterdir()) if p.is_file() and p.name != LOCK_NAME}


def _identity_files(files: dict[str, bytes]) -> dict:
    """The state dir's files without what the running gateway rewrites as peers change: the
    journal, and the peer set (with its version and the id of the journal that continues it)
    inside ``gateway.json``."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in ("peers", "version", "journal")}
        return value

    out: dict = {name: data for name, data in files.items() if name not in ("peers.journal", "gateway.json")}
    if "gateway.json" in files:
        out["gateway.json"] = strip(json.loads(files["gateway.json"]))
    return out


def _gateway_argv(mesh) -> list[str]:
    return [*anex_argv(), "gateway", "--coordinator", mesh.coordinator_url_for_gateway,
            "--state-dir", str(mesh.workdir / "gateway"), "--listen-udp", f"0.0.0.0:{WG_PORT}",
            "--endpoint", f"192.168.100.1:{WG_PORT}", "--route", "10.77.0.0/24"]


def test_a_second_gateway_on_the_running_ones_state_dir_is_refused_and_changes_nothing(mesh, node):
    state_dir = mesh.workdir / "gateway"
    before = (ns_state(mesh.gateway), _state_files(state_dir), mesh.admin("GET", "/v1/gateways"))
    assert client(node.ns, "get", f"{URL}/before-second", "--proxy", PROXY, timeout=15).get("status") == 200
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
    env["ANEX_GATEWAY_TOKEN"] = mesh.gateway_token
    second = mesh.gateway.run(_gateway_argv(mesh), check=False, timeout=30, env=env)
    assert second.returncode == 2, second.stdout + second.stderr
    assert str(state_dir) in second.stderr and f"PID {mesh.gateway_proc.pid}" in second.stderr, second.stderr
    after = (ns_state(mesh.gateway), _state_files(state_dir), mesh.admin("GET", "/v1/gateways"))
    assert after[0]["interfaces"] == before[0]["interfaces"] and after[0]["nft_tables"] == before[0]["nft_tables"]
    # credential and key untouched (the running gateway itself may save a peer change meanwhile:
    # its peer set and journal are its own to write)
    assert _identity_files(after[1]) == _identity_files(before[1])
    # no registration: the coordinator's view did not change (last_seen_at moves on its own: the
    # running gateway's watch stream is its sign of life, written every few seconds)
    assert _registrations(after[2]) == _registrations(before[2])
    assert mesh.gateway_proc.poll() is None
    assert client(node.ns, "get", f"{URL}/after-second", "--proxy", PROXY, timeout=15).get("status") == 200


def _registrations(listing: dict) -> list[dict]:
    """``GET /v1/gateways`` without what a running gateway's presence updates (``last_seen_at``)."""
    return [{k: v for k, v in g.items() if k != "last_seen_at"} for g in listing["gateways"]]


def test_a_second_agent_on_the_running_ones_state_dir_is_refused_and_changes_nothing(mesh, node):
    before = (ns_state(node.ns), _state_files(node.state_dir))
    second = node.ns.run([*anex_argv(), "daemon"], check=False, timeout=30, env=node.env)  # same ports too
    assert second.returncode == 2, second.stdout + second.stderr
    assert str(node.state_dir) in second.stderr and f"PID {node.proc.pid}" in second.stderr, second.stderr
    after = (ns_state(node.ns), _state_files(node.state_dir))
    assert after[0]["interfaces"] == before[0]["interfaces"] and after[0]["routes"] == before[0]["routes"]
    assert after[1] == before[1]
    assert node.proc.poll() is None
    assert client(node.ns, "get", f"{URL}/after-second-agent", "--proxy", PROXY, timeout=15).get("status") == 200


def test_a_sigkilled_gateway_does_not_block_its_restart(mesh, node):
    mesh.kill_gateway()  # SIGKILL: no clean-up, the lock file stays behind
    assert (mesh.workdir / "gateway" / LOCK_NAME).exists()
    mesh.start_gateway()
    wait_until(lambda: client(node.ns, "get", f"{URL}/after-crash", "--proxy", PROXY, timeout=8).get("status") == 200,
               20, "traffic through the restarted gateway")


def _initiations_from(ns, ifname: str) -> int:
    """Handshake initiations (WireGuard message type 1) the engine sent since the rule was added."""
    out = ns.run(["nft", "-j", "list", "table", "inet", "anex_test_hs"]).stdout
    for item in json.loads(out)["nftables"]:
        rule = item.get("rule")
        if rule:
            for expr in rule["expr"]:
                if "counter" in expr:
                    return expr["counter"]["packets"]
    raise AssertionError(f"no counter in {out}")


def test_an_idle_tunnel_sends_no_extra_handshakes(mesh, node):
    """Over a minute of an idle node (persistent keepalive every 25 s, nothing back from the
    gateway), the engine sends no handshake initiation of ours: at most one, WireGuard's own
    rekey (a session older than 120 s is renewed on the next send, whitepaper §6.2) or the
    one after the earlier tests' traffic (the node's last data packet, a TCP connection's last
    ACK, gets no answer: the gateway's passive keepalive that would answer it is cancelled by
    the handshake responses to the path watch's probes, and WireGuard initiates 15 s later,
    §6.5). The path watch probes the quiet node and then nudges the engine: with a data packet
    as the nudge, that same timer fired after every probe, about 3 times a minute; a
    keepalive starts no timer.

    The tests before this one restart the gateway: each restart reaches the node as a
    ``gateway_changed`` event, whose session reset sends initiations until a handshake. The count
    starts once every such reset has ended (its log line), so it holds the idle node alone."""

    def resets_settled() -> bool:
        text = node.log()
        started = text.count("watch: gateway_changed event")
        ended = text.count("gateway sessions reset: handshake after") + text.count("gateway sessions reset, but no")
        return started <= ended and node.status()["last_handshake_age"] is not None

    wait_until(resets_settled, 60, "the node's session resets after the gateway's restarts to end")
    status = node.status()
    ifname = status["interface"]
    port = node.ns.run(["wg", "show", ifname, "listen-port"]).stdout.strip()
    assert port.isdigit()
    node.ns.run(["nft", "-f", "-"], input=(
        "table inet anex_test_hs {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
        f"  udp sport {port} udp dport {WG_PORT} @th,64,8 1 counter\n }}\n}}\n"))
    try:
        detections = status["dead_peer"]["detections"]
        time.sleep(60)
        sent = _initiations_from(node.ns, ifname)
        after = node.status()
    finally:
        node.ns.run(["nft", "delete", "table", "inet", "anex_test_hs"], check=False)
    print(f"handshake initiations from the idle node in 60 s: {sent} (the session was "
          f"{status['last_handshake_age']:.0f} s old at the start, {after['last_handshake_age']:.0f} s at the end)")
    assert after["dead_peer"]["detections"] == detections
    assert sent <= 1


def test_a_second_coordinator_on_the_running_ones_state_dir_is_refused(mesh, node):
    from anex_agent.testing.mesh import COORDINATOR_PORT

    state_dir = mesh.workdir / "coordinator"
    before = _state_files(state_dir)
    second = mesh.gateway.run([*anex_argv(), "coordinator", "--listen", f"0.0.0.0:{COORDINATOR_PORT}",
                               "--state-dir", str(state_dir)], check=False, timeout=30,
                              env={**os.environ, "ANEX_ADMIN_TOKEN": mesh.admin_token})
    assert second.returncode == 2, second.stdout + second.stderr
    assert str(state_dir) in second.stderr and f"PID {mesh.coordinator_proc.pid}" in second.stderr, second.stderr
    assert mesh.coordinator_proc.poll() is None and mesh.admin("GET", "/v1/nodes") is not None
    after = _state_files(state_dir)
    assert after.keys() == before.keys() and all(after[k] == before[k] for k in after if not k.startswith("coordinator.db"))
