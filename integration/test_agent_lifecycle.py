"""The agent as users run it: `anex-agent run -- CMD`, bad input, unreachable coordinator, teardown.

Each test starts the real CLI in a node namespace of the session mesh.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, anex_argv, wait_until
from integration.conftest import finish, ns_state, read_until, run_agent
from integration.netns import read_line

FETCH = (
    "import json,sys,urllib.request\n"
    "opener=urllib.request.build_opener(urllib.request.ProxyHandler({'http':'http://127.0.0.1:3128'}))\n"
    f"body=json.loads(opener.open('http://{SERVICE_NAME}:{HTTP_PORT}/from-workload',timeout=10).read())\n"
    "print('WORKLOAD-GOT', body['service'], body['path'], flush=True)\n"
    "sys.exit(int(sys.argv[1]))\n"
)


def test_run_starts_the_workload_after_the_mesh_exits_with_its_status_and_leaves_nothing(mesh, fresh_node):
    env = mesh.agent_env(fresh_node)
    out = run_agent(fresh_node, env, ["--", sys.executable, "-c", FETCH, "7"])
    text = out.stdout + out.stderr
    assert out.returncode == 7, text
    assert "WORKLOAD-GOT echo /from-workload" in text
    assert text.index("mesh up") < text.index("WORKLOAD-GOT")
    assert "Traceback" not in text
    left = ns_state(fresh_node.ns)
    assert left == {"interfaces": [], "routes": [], "nft_tables": [], "pids": []}, left


def test_sigterm_is_forwarded_to_the_workload_and_its_status_returned(mesh, fresh_node):
    script = (
        "import signal,sys,time\n"
        "signal.signal(signal.SIGTERM, lambda *a: (print('WORKLOAD-TERM', flush=True), sys.exit(42)))\n"
        "print('WORKLOAD-UP', flush=True)\n"
        "time.sleep(120)\n"
    )
    env = mesh.agent_env(fresh_node)
    proc = fresh_node.ns.popen([*anex_argv(), "run", "--", sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = read_until(proc, lambda ls: any(l.startswith("WORKLOAD-UP") for l in ls), 45)
    assert any(l.startswith("WORKLOAD-UP") for l in lines), "".join(lines)
    # `ip netns exec` execs the command, so proc is the agent itself
    proc.send_signal(signal.SIGTERM)
    _, rest = finish(fresh_node.ns, proc)
    text = "".join(lines) + rest
    assert proc.returncode == 42, text
    assert "WORKLOAD-TERM" in text
    assert ns_state(fresh_node.ns)["interfaces"] == []


def test_restart_reuses_the_identity_without_the_join_token(mesh, fresh_node):
    env = mesh.agent_env(fresh_node)
    mesh.start_agent(fresh_node, env)
    first = fresh_node.status()
    mesh.stop_agent(fresh_node)
    env2 = {**env, "ANEX_JOIN_TOKEN": ""}  # single-use token already spent: must not be needed
    mesh.start_agent(fresh_node, env2)
    second = fresh_node.status()
    assert second["node_id"] == first["node_id"] and second["address"] == first["address"]


@pytest.mark.parametrize(
    "name,value,needle",
    [("GW_TUNNEL_70000", "svc:80", "GW_TUNNEL_70000"), ("GW_TUNNEL_5000", "no-port-here", "GW_TUNNEL_5000")],
)
def test_bad_gw_tunnel_stops_before_the_workload(mesh, fresh_node, tmp_path, name, value, needle):
    marker = tmp_path / "workload-ran"
    env = mesh.agent_env(fresh_node, token="unused", **{name: value})
    out = run_agent(fresh_node, env, ["--", "touch", str(marker)], timeout=30)
    assert out.returncode == 2
    assert needle in out.stderr and "<host>:<port>" in out.stderr
    assert "Traceback" not in out.stderr
    assert not marker.exists()


def test_gw_tunnel_port_in_use_stops_before_the_workload(mesh, fresh_node, tmp_path):
    marker = tmp_path / "workload-ran"
    holder = fresh_node.ns.popen([sys.executable, "-c", "import socket,time;s=socket.socket();s.bind(('127.0.0.1',15432));s.listen();print('ready',flush=True);time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    assert read_line(holder, 30, "port holder ready").strip() == "ready"
    env = mesh.agent_env(fresh_node, token="unused", GW_TUNNEL_15432="db.default.svc.cluster.local:5432")
    out = run_agent(fresh_node, env, ["--", "touch", str(marker)], timeout=30)
    holder.kill()
    assert out.returncode == 2
    assert "GW_TUNNEL_15432" in out.stderr and "already in use" in out.stderr
    assert not marker.exists()


def test_unreachable_coordinator_prints_retrying_not_a_traceback(mesh, fresh_node):
    env = mesh.agent_env(fresh_node, token="whatever", ANEX_COORDINATOR_URL="http://192.168.100.1:1")
    proc = fresh_node.ns.popen([*anex_argv(), "daemon"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = read_until(proc, lambda ls: sum("retrying in" in l for l in ls) >= 2, 20)
    proc.send_signal(signal.SIGTERM)
    _, rest = finish(fresh_node.ns, proc)
    text = "".join(seen) + rest
    assert "unreachable" in text and "retrying in" in text, text
    assert "Traceback" not in text
    assert proc.returncode == 128 + signal.SIGTERM  # stopped cleanly during the retries
    assert ns_state(fresh_node.ns)["interfaces"] == []


def test_proxy_authorization_when_configured(mesh, fresh_node):
    script = (
        "import base64,http.client,sys\n"
        "def get(auth):\n"
        "    c=http.client.HTTPConnection('127.0.0.1',3128,timeout=10)\n"
        "    h={'Proxy-Authorization':'Basic '+base64.b64encode(auth.encode()).decode()} if auth else {}\n"
        f"    c.request('GET','http://{SERVICE_NAME}:{HTTP_PORT}/auth',headers=h)\n"
        "    return c.getresponse().status\n"
        "print('STATUSES', get(''), get('u:wrong'), get('u:pw'), flush=True)\n"
    )
    env = mesh.agent_env(fresh_node, ANEX_PROXY_AUTH="u:pw")
    out = run_agent(fresh_node, env, ["--", sys.executable, "-c", script])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "STATUSES 407 407 200" in out.stdout


def test_kill_9_of_the_agent_ends_its_workload_and_a_restart_runs_one_copy(mesh, fresh_node):
    import json
    import os

    from anex_agent.agent.workload_lifetime import start_time

    def sleepers() -> list[int]:
        return [pid for pid in fresh_node.ns.pids() if Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:2]
                == [b"sleep", b"300"] and start_time(pid) is not None]

    env = mesh.agent_env(fresh_node)
    agent = mesh.start_agent(fresh_node, env, ["sleep", "300"])  # not PID 1: under the test, as under systemd
    workload = json.loads((fresh_node.state_dir / "workload.json").read_text())["pid"]
    assert sleepers() == [workload]
    agent.kill()  # kill -9: no teardown runs
    agent.wait(timeout=30)
    fresh_node.proc = None
    wait_until(lambda: start_time(workload) is None, 30, f"the workload (pid {workload}) to end with its agent")
    try:
        mesh.start_agent(fresh_node, env, ["sleep", "300"])
        assert len(sleepers()) == 1 and workload not in sleepers()
    finally:
        mesh.stop_agent(fresh_node)
        for pid in fresh_node.ns.pids():  # what the killed agent left (its wireguard-go), not the test's concern
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
