"""`anex-agent run` as a container's init, end to end, as users start it (no privileges).

Real processes, as in test_agent_wireproxy.py: the coordinator, the agent with the wireproxy
engine (the stand-in on PATH), a workload. Checked: systemd's notify protocol (READY=1 once
the tunnel answers, watchdog pings) on a real NOTIFY_SOCKET, the workload's output passed
through and served at GET /logs, an orphan of the workload reaped, the workload state in
/status and in the coordinator's node view, the proxy variables, SIGTERM forwarded and the
workload's status returned, and its terminated state in the node view once the agent stopped."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from anex_agent.client.rest import proven_body
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.wire.gateways import GatewayRegisterRequest
from tests.agent.test_agent_wireproxy import ADMIN_TOKEN, alive, coordinator, fake_on_path, free_port, http, wait_for  # noqa: F401

WORKLOAD = r"""
import json, os, signal, subprocess, sys, time
marker = sys.argv[1]
print("hello stdout", flush=True)
print("hello stderr", file=sys.stderr, flush=True)
open(marker + ".env", "w").write(json.dumps(dict(os.environ)))
subprocess.run(["sh", "-c", "sleep 0.3 & echo $! > " + marker + ".orphan"])
def term(n, f):
    print("got SIGTERM", flush=True)
    sys.exit(7)
signal.signal(signal.SIGTERM, term)
while True:
    time.sleep(0.1)
"""


def _zombie_children(parent: int) -> list[int]:
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] == "Z" and int(fields[1]) == parent:
                out.append(int(name))
    return out


def test_run_as_init(tmp_path, coordinator, fake_on_path):  # noqa: F811
    bindir, control = fake_on_path
    gw_key = KeyPair(generate_private_key())
    _, token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "gateway"}, ADMIN_TOKEN)
    _, info = http("GET", f"{coordinator}/v1/coordinator")
    status, _ = http("POST", f"{coordinator}/v1/gateways", proven_body(GatewayRegisterRequest, {
        "token": token["token"], "name": "gw", "endpoint": "127.0.0.1:51820", "routes": ["10.96.0.0/12"]},
        gw_key, info["public_key"]))
    assert status in (200, 201)
    _, node_token = http("POST", f"{coordinator}/v1/join-tokens", {"kind": "node"}, ADMIN_TOKEN)

    notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    notify.bind(str(tmp_path / "notify"))
    notify.settimeout(0.2)
    proxy, api = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    marker = tmp_path / "w"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "FAKE_WIREPROXY_DIR": str(control),
        "ANEX_COORDINATOR_URL": coordinator, "ANEX_JOIN_TOKEN": node_token["token"],
        "ANEX_STATE_DIR": str(tmp_path / "state"), "ANEX_PROXY_LISTEN": proxy, "ANEX_API_LISTEN": api,
        "ANEX_NODE_NAME": "init-node", "ANEX_PROXY_ENV": "1",
        "NOTIFY_SOCKET": str(tmp_path / "notify"), "WATCHDOG_USEC": "1000000",
    })
    agent = subprocess.Popen([sys.executable, "-m", "anex_agent", "run", "--engine", "wireproxy", "--grace-period", "20",
                              "--", sys.executable, "-c", WORKLOAD, str(marker)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    messages: list[str] = []

    def notified(text: str) -> bool:
        try:
            while True:
                messages.append(notify.recv(4096).decode())
        except (TimeoutError, BlockingIOError):
            pass
        return any(text in m for m in messages)

    try:
        wait_for(lambda: notified("READY=1"), 60, "READY=1 on the notify socket")
        ready = next(m for m in messages if "READY=1" in m)
        assert "STATUS=tunnel up" in ready
        assert any(m.startswith("STATUS=joining") for m in messages)
        wait_for(lambda: notified("WATCHDOG=1"), 10, "a watchdog ping")

        logs = wait_for(lambda: (t := http("GET", f"http://{api}/logs")[1].get("text", "")).count("hello") == 2 and t,
                        30, "the workload's logs")
        assert logs.splitlines() == ["hello stdout", "hello stderr"] or sorted(logs.splitlines()) == ["hello stderr", "hello stdout"]
        assert http("GET", f"http://{api}/logs?stream=stderr")[1]["text"] == "hello stderr\n"
        assert (tmp_path / "state" / "logs" / "workload.log").read_text().count("hello") == 2

        seen = json.loads(Path(f"{marker}.env").read_text())
        assert seen["HTTP_PROXY"] == seen["https_proxy"] == f"http://{proxy}"
        assert not {"NOTIFY_SOCKET", "WATCHDOG_USEC", "ANEX_JOIN_TOKEN"} & set(seen)

        orphan = int(wait_for(lambda: Path(f"{marker}.orphan").read_text().strip(), 10, "the orphan's pid"))
        wait_for(lambda: not Path(f"/proc/{orphan}").exists(), 10, "the orphan reaped by the agent")
        assert _zombie_children(agent.pid) == []

        doc = http("GET", f"http://{api}/status")[1]
        assert doc["workload"]["state"] == "running" and doc["workload"]["started_at"]
        _, nodes = http("GET", f"{coordinator}/v1/nodes", token=ADMIN_TOKEN)
        node = next(n for n in nodes["nodes"] if n["name"] == "init-node")
        view = wait_for(lambda: (v := http("GET", f"{coordinator}/v1/nodes/{node['id']}", token=ADMIN_TOKEN)[1])
                        ["status"] and v["status"].get("workload") and v, 30, "the workload state at the coordinator")
        assert view["status"]["workload"]["state"] == "running"

        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=60)
        notified("STOPPING=1")
    except BaseException:
        if agent.poll() is None:
            agent.kill()
        out, err = agent.communicate()
        print("--- agent\n" + out[-4000:] + "\n" + err[-6000:])
        raise
    finally:
        notify.close()
    assert agent.returncode == 7, err
    assert "hello stdout\n" in out and "got SIGTERM\n" in out and "hello stderr\n" in err  # passed through
    assert "Traceback" not in err, err
    assert any("STOPPING=1" in m for m in messages)
    # the last heartbeat carried the workload's end: the coordinator's view is true after the exit
    ended = http("GET", f"{coordinator}/v1/nodes/{node['id']}", token=ADMIN_TOKEN)[1]["status"]["workload"]
    assert ended["state"] == "terminated" and ended["exit_code"] == 7 and ended["finished_at"] and ended["reason"] == "Error", ended
