"""``anex-agent run`` with ``ANEX_POD_FILES``: the workload waits for the pod's files and its
variables from Secrets, pushed on the agent API (as the virtual node pushes them through the
coordinator), then runs with them; a stop signal while it waits ends the agent with the shell's
status. Real processes, as in test_agent_last_heartbeat.py; root, since the agent creates
``/run/anex-pod`` (skipped otherwise)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request

import pytest

from anex_agent.wire.pod import COMPLETE, ENV_FILE
from tests.agent.test_agent_last_heartbeat import _node, _stop, coordinator_proc  # noqa: F401
from tests.agent.test_agent_wireproxy import ADMIN_TOKEN, fake_on_path, free_port, http  # noqa: F401
from tests.polling import wait_for

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the agent creates /run/anex-pod: needs root")

WORKLOAD = ("import os, sys\nprint('SAW', os.environ.get('DB_PASSWORD'), os.environ.get('URL'), "
            "open(sys.argv[1]).read(), flush=True)\n")


def _start(tmp_path, url: str, bindir, control, name: str) -> tuple[subprocess.Popen, int]:
    _, gw_token = http("POST", f"{url}/v1/join-tokens", {"kind": "gateway"}, ADMIN_TOKEN)
    from anex_agent.client.rest import proven_body
    from anex_agent.wire.keys import KeyPair, generate_private_key
    from anex_agent.wire.gateways import GatewayRegisterRequest
    _, info = http("GET", f"{url}/v1/coordinator")
    http("POST", f"{url}/v1/gateways", proven_body(GatewayRegisterRequest, {
        "token": gw_token["token"], "name": "gw", "endpoint": "127.0.0.1:51820", "routes": ["10.96.0.0/12"]},
        KeyPair(generate_private_key()), info["public_key"]))
    _, token = http("POST", f"{url}/v1/join-tokens", {"kind": "node"}, ADMIN_TOKEN)
    api_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "FAKE_WIREPROXY_DIR": str(control),
        "ANEX_COORDINATOR_URL": url, "ANEX_JOIN_TOKEN": token["token"], "ANEX_STATE_DIR": str(tmp_path / "state"),
        "ANEX_PROXY_LISTEN": f"127.0.0.1:{free_port()}", "ANEX_API_LISTEN": f"127.0.0.1:{api_port}",
        "ANEX_NODE_NAME": name, "ANEX_WAIT_READY": "0", "URL": "db://u:$(DB_PASSWORD)@h",
        "ANEX_POD_FILES": json.dumps({"dirs": [str(tmp_path / "cfg")]}),
    })
    agent = subprocess.Popen([sys.executable, "-m", "anex_agent", "run", "--engine", "wireproxy", "--",
                              sys.executable, "-c", WORKLOAD, str(tmp_path / "cfg" / "app.conf")],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return agent, api_port


def _waiting(agent: subprocess.Popen, url: str, name: str) -> str:
    def waiting():
        assert agent.poll() is None, "the agent exited"
        try:
            node = _node(url, name)
        except StopIteration:
            return None
        workload = (node.get("status") or {}).get("workload") or {}
        return node["id"] if workload.get("state") == "waiting" else None
    return wait_for(waiting, 60, "the agent joined, its workload waiting")


def _push(url: str, node_id: str, api_port: int, path: str, data: bytes, mode: str = "0600") -> None:
    _, token = http("POST", f"{url}/v1/nodes/{node_id}/access-token", token=ADMIN_TOKEN)
    request = urllib.request.Request(f"http://127.0.0.1:{api_port}/files?path={path}&mode={mode}", data=data,
                                     method="PUT", headers={"Authorization": f"Bearer {token['token']}"})
    with urllib.request.urlopen(request, timeout=30) as answer:
        assert answer.status == 201


def test_the_workload_starts_once_its_files_and_secret_variables_are_pushed(tmp_path, coordinator_proc,  # noqa: F811
                                                                          fake_on_path):  # noqa: F811
    url, _ = coordinator_proc
    agent, api_port = _start(tmp_path, url, *fake_on_path, name="pod-files")
    try:
        node_id = _waiting(agent, url, "pod-files")
        assert (tmp_path / "cfg").is_dir()  # made by the agent before anything was pushed
        _push(url, node_id, api_port, str(tmp_path / "cfg" / "app.conf"), b"threads=4", "0640")
        _push(url, node_id, api_port, ENV_FILE, json.dumps([["DB_PASSWORD", "s3cret", False],
                                                            ["URL", "db://u:$(DB_PASSWORD)@h", True]]).encode())
        assert agent.poll() is None and (_node(url, "pod-files")["status"]["workload"]["state"]) == "waiting"
        _push(url, node_id, api_port, COMPLETE, b"")
        out, err = agent.communicate(timeout=60)
    except BaseException:
        _stop(agent)
        raise
    assert agent.returncode == 0, err
    assert "SAW s3cret db://u:s3cret@h threads=4" in out
    assert not os.path.exists(ENV_FILE) and not os.path.exists(COMPLETE)
    assert (tmp_path / "cfg" / "app.conf").stat().st_mode & 0o777 == 0o640


def test_a_stop_signal_while_waiting_for_the_files_ends_with_the_shells_status(tmp_path, coordinator_proc,  # noqa: F811
                                                                             fake_on_path):  # noqa: F811
    url, _ = coordinator_proc
    agent, _api_port = _start(tmp_path, url, *fake_on_path, name="pod-files-stop")
    try:
        _waiting(agent, url, "pod-files-stop")
        agent.send_signal(signal.SIGTERM)
        out, err = agent.communicate(timeout=60)
    except BaseException:
        _stop(agent)
        raise
    assert agent.returncode == 128 + signal.SIGTERM, err
    assert "SAW" not in out
