"""Gateways that come later, and every way out of the agent bounded in time.

A mesh of its own (module scope): the coordinator first, with no gateway, heartbeats every
second.

* Agents that join before any gateway exists, as root (wireguard-go) and as ``nobody``
  without capabilities (``auto`` picks the built-in userspace engine): while no gateway
  exists they heartbeat (their heartbeats reach the coordinator: the node is ``ready``, its
  ``last_heartbeat_at`` moves on) and answer ``/healthz``; then the gateway starts, the
  agents pick it up from the watch and the proxy reaches the cluster.
* Every way out of ``run`` and ``daemon`` (the workload's exit, SIGTERM, SIGINT, a second
  SIGTERM while the workload ignores the first, SIGTERM with the coordinator blackholed,
  SIGTERM after the gateway was deleted), each several times: the agent exits within
  :data:`BOUND` s of the event with the expected status, its exit deadline unused, nothing
  of ours left in the namespace.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from urllib.parse import urlsplit

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, Mesh, anex_argv, wait_until
from integration.conftest import client, finish, mesh_skip_reason, ns_state, read_until

PROXY = "127.0.0.1:3128"
URL = f"http://{SERVICE_NAME}:{HTTP_PORT}/later"
#: Seconds from the event (signal, workload exit) to the agent's exit: the agent's own stop
#: margin (10 s, past which its exit deadline ends it) with a little slack for a busy machine.
BOUND = 12.0
#: The grace period of the runs below: long, so that an exit within BOUND proves a second
#: signal cut it short (and that nothing else waited for it).
GRACE = "60"
REPEAT = 3


@pytest.fixture(scope="module")
def bare(tmp_path_factory):
    """A mesh with the coordinator only (heartbeats every second); tests start the gateway."""
    reason = mesh_skip_reason()
    if reason:
        pytest.skip(reason)
    mesh = Mesh(tmp_path_factory.mktemp("gateway-later"))
    try:
        mesh.build_network()
        mesh.start_coordinator(heartbeat_interval=1.0)
        yield mesh
    finally:
        mesh.close()


@pytest.fixture
def gateway(bare):
    """The gateway up (started once, restarted when a test deleted it)."""
    if bare.gateway_proc is None or bare.gateway_proc.poll() is not None:
        if bare.gateway_proc is not None or (bare.workdir / "gateway").exists():  # deleted by a test: a new one
            bare.stop_gateway()
            shutil.rmtree(bare.workdir / "gateway", ignore_errors=True)
        bare.start_gateway()
    return bare


def _view(mesh: Mesh, node_id: str) -> dict:
    return mesh.admin("GET", f"/v1/nodes/{node_id}")


def _heartbeating(mesh: Mesh, node, beats: int = 2) -> dict:
    """Wait until ``beats`` heartbeats of the node's agent reached the coordinator; its view."""
    node_id = wait_until(lambda: node.status()["node_id"], 60, f"node {node.index}'s agent API")
    seen: set[str] = set()

    def beating():
        if node.proc is not None and node.proc.poll() is not None:
            raise AssertionError(f"the agent exited: {node.log()[-2000:]}")
        view = _view(mesh, node_id)
        if view["last_heartbeat_at"]:
            seen.add(view["last_heartbeat_at"])
        return len(seen) >= beats and view

    return wait_until(beating, 60, f"{beats} heartbeats of node {node.index}", interval=0.3)


def test_agents_that_join_before_any_gateway_heartbeat_and_pick_it_up(bare):
    if bare.gateway_proc is not None:
        pytest.skip("runs first in this module: the gateway must not exist yet")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is not installed")
    root, nobody = bare.add_node_namespace(), bare.add_node_namespace()
    bare.start_agent(root, bare.agent_env(root), ["sleep", "300"], wait_ready=False)
    bare.start_agent(nobody, bare.agent_env(nobody, ANEX_ENGINE="auto"), ["sleep", "300"], wait_ready=False,
                     unprivileged=True)
    try:
        for node, engine in ((root, "wireguard-go"), (nobody, "userspace")):
            view = _heartbeating(bare, node)
            assert view["state"] == "ready", view  # not pending: its heartbeats arrive
            assert view["status"]["engine"] == engine and view["status"]["workload"]["state"] == "running", view
            health = client(node.ns, "get", "http://127.0.0.1:9555/healthz", timeout=15)
            assert health.get("status") == 200, health
            status = node.status()
            assert status["gateways"] == [] and status["last_handshake_age"] is None, status

        bare.start_gateway()  # the gateway comes: the watch brings it to both agents

        for node in (root, nobody):
            bare.wait_agent_ready(node, timeout=60)
            result = client(node.ns, "get", URL, "--proxy", PROXY)
            assert result.get("status") == 200, result
            assert json.loads(result["body"])["path"] == "/later"
            assert "tunnel ready: a gateway answered" in node.log()
        assert "event loop stalled" not in root.log() + nobody.log()
    finally:
        codes = [bare.stop_agent(root), bare.stop_agent(nobody)]
    assert codes == [128 + signal.SIGTERM] * 2, (codes, root.log()[-2000:], nobody.log()[-2000:])


# ---------------------------------------------------------------- every way out, bounded

WORKLOAD = (
    "import signal,sys\n"
    "mode=sys.argv[1]\n"
    "signal.signal(signal.SIGINT, signal.SIG_DFL)\n"
    "if mode=='ignore-term': signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
    "print('WORKLOAD-UP', flush=True)\n"
    "sys.stdin.read() if mode=='exit-on-eof' else signal.pause()\n"
    "print('WORKLOAD-DONE', flush=True)\n"
)

# way -> (workload mode or None for daemon, expected status)
WAYS = {
    "workload-exit": ("exit-on-eof", 0),
    "sigterm": ("default", 128 + signal.SIGTERM),
    "sigint": ("default", 128 + signal.SIGINT),
    "second-sigterm": ("ignore-term", 128 + signal.SIGKILL),
    "coordinator-lost": ("default", 128 + signal.SIGTERM),
    "gateway-deleted": ("default", 128 + signal.SIGTERM),
    "daemon-sigterm": (None, 0),
    "daemon-second-sigint": (None, 0),
}
CASES = [(way, engine) for way in WAYS for engine in ("wireguard-go", "userspace")
         if engine == "wireguard-go" or way in ("sigterm", "gateway-deleted", "workload-exit")]


@pytest.mark.parametrize("attempt", range(REPEAT))
@pytest.mark.parametrize("way,engine", CASES)
def test_every_way_out_ends_the_agent_within_the_bound(gateway, way, engine, attempt):
    mesh = gateway
    mode, expected = WAYS[way]
    node = mesh.add_node_namespace()
    env = mesh.agent_env(node, ANEX_ENGINE=engine, ANEX_GRACE_PERIOD=GRACE)
    argv = [*anex_argv(), "run", "--", sys.executable, "-c", WORKLOAD, mode] if mode else [*anex_argv(), "daemon"]
    node.proc = proc = node.ns.popen(argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    try:
        mesh.wait_agent_ready(node, timeout=60)
        if mode:
            lines += read_until(proc, lambda ls: any("WORKLOAD-UP" in l for l in ls), 30)
            assert any("WORKLOAD-UP" in l for l in lines), "".join(lines)
        if way == "coordinator-lost":
            _blackhole_coordinator(mesh, node)
        elif way == "gateway-deleted":
            mesh.stop_gateway()  # first: a running gateway registers again (a new one for the next test)
            for gw in mesh.admin("GET", "/v1/gateways")["gateways"]:
                mesh.admin("DELETE", f"/v1/gateways/{gw['id']}")
            wait_until(lambda: node.status()["gateways"] == [], 30, "the agent dropping the deleted gateway")

        started = time.monotonic()
        if way == "workload-exit":
            proc.stdin.close()  # the workload reads to the end of its input, then exits
            proc.stdin = None
        elif way in ("sigint",):
            proc.send_signal(signal.SIGINT)
        elif way in ("second-sigterm", "daemon-second-sigint"):
            sig = signal.SIGTERM if way == "second-sigterm" else signal.SIGINT
            proc.send_signal(sig)
            wanted = "forwarding SIGTERM" if way == "second-sigterm" else "received SIGINT: stopping"
            lines += read_until(proc, lambda ls: any(wanted in l for l in ls), 30)
            assert any(wanted in l for l in lines), "".join(lines)
            proc.send_signal(sig)
        else:
            proc.send_signal(signal.SIGTERM)
        code, rest = finish(node.ns, proc, timeout=BOUND + 30)
        took = time.monotonic() - started
    finally:
        if proc.poll() is None:
            finish(node.ns, proc, timeout=0.1)
        node.proc = None
    text = "".join(lines) + rest
    print(f"{way} ({engine}): status {code}, exited {took:.1f} s after the event")
    assert code == expected, (code, text[-4000:])
    assert took < BOUND, (took, text[-4000:])
    assert "stopping did not finish in time" not in text, text[-4000:]  # the deadline was not needed
    assert "Traceback" not in text, text[-4000:]
    if mode:
        assert "last heartbeat" in text, text[-4000:]
    left = ns_state(node.ns)
    assert left == {"interfaces": [], "routes": [], "nft_tables": [], "pids": []}, left


def _blackhole_coordinator(mesh: Mesh, node) -> None:
    """Drop the node's packets to the coordinator: calls hang (no refusal), as on a lost path."""
    where = urlsplit(mesh.coordinator_url_for(node))
    ruleset = ("table inet demo_lost_coordinator {\n chain out {\n  type filter hook output priority 0; policy accept;\n"
               f"  ip daddr {where.hostname} tcp dport {where.port} drop\n }}\n}}\n")
    node.ns.run(["nft", "-f", "-"], input=ruleset)
