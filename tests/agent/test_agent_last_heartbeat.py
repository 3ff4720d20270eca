"""The workload's end reaches the coordinator: ``anex-agent run`` sends one last heartbeat
with the terminated state before it exits, and a coordinator that does not answer never
holds the exit.

Real processes, as in test_agent_wireproxy.py (no privileges): the coordinator on loopback,
``anex-agent run --engine wireproxy`` with the stand-in wireproxy on PATH, and a workload
that ends when the test writes to its FIFO. The ``SIGTERM`` way is checked in
test_agent_init_e2e.py."""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import sys
import time

import pytest

from anex_agent.client.rest import proven_body
from anex_agent.wire.keys import KeyPair, generate_private_key
from anex_agent.wire.gateways import GatewayRegisterRequest
from tests.agent.test_agent_wireproxy import ADMIN_TOKEN, fake_on_path, free_port, http, wait_for  # noqa: F401
from tests.polling import wait_for as wait_while_alive

WORKLOAD = "import sys\nopen(sys.argv[1]).read()\nprint('WORKLOAD-DONE', flush=True)\n"


@pytest.fixture
def coordinator_proc(tmp_path):
    port = free_port()
    log = open(tmp_path / "coordinator.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
                             "--state-dir", str(tmp_path / "coord")], env={**os.environ, "ANEX_ADMIN_TOKEN": ADMIN_TOKEN},
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: http("GET", f"{url}/v1/nodes", token=ADMIN_TOKEN)[0] == 200, 30, "the coordinator")
        yield url, proc
    finally:
        proc.send_signal(signal.SIGCONT)
        proc.kill()
        proc.wait()
        log.close()


def _start(tmp_path, url: str, bindir, control) -> tuple[subprocess.Popen, str]:
    """A gateway registered (through the API only: the fake wireproxy does no WireGuard), then the agent."""
    _, gw_token = http("POST", f"{url}/v1/join-tokens", {"kind": "gateway"}, ADMIN_TOKEN)
    _, info = http("GET", f"{url}/v1/coordinator")
    status, _ = http("POST", f"{url}/v1/gateways", proven_body(GatewayRegisterRequest, {
        "token": gw_token["token"], "name": "gw", "endpoint": "127.0.0.1:51820", "routes": ["10.96.0.0/12"]},
        KeyPair(generate_private_key()), info["public_key"]))
    assert status in (200, 201)
    _, token = http("POST", f"{url}/v1/join-tokens", {"kind": "node"}, ADMIN_TOKEN)
    fifo = str(tmp_path / "release")
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    env.update({
        "PATH": f"{bindir}{os.pathsep}{env.get('PATH', '')}", "FAKE_WIREPROXY_DIR": str(control),
        "ANEX_COORDINATOR_URL": url, "ANEX_JOIN_TOKEN": token["token"], "ANEX_STATE_DIR": str(tmp_path / "state"),
        "ANEX_PROXY_LISTEN": f"127.0.0.1:{free_port()}", "ANEX_API_LISTEN": f"127.0.0.1:{free_port()}",
        "ANEX_NODE_NAME": "last-beat", "ANEX_WAIT_READY": "0",
    })
    agent = subprocess.Popen([sys.executable, "-m", "anex_agent", "run", "--engine", "wireproxy", "--",
                              sys.executable, "-c", WORKLOAD, fifo],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return agent, fifo


def _release(fifo: str) -> None:
    """Let the workload end: open its FIFO for writing once it reads it (ENXIO until then), close it."""
    def opened():
        try:
            return os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        except OSError as err:
            if err.errno == errno.ENXIO:
                return None
            raise
    os.close(wait_while_alive(opened, 60, "the workload reading its FIFO"))


def _wait_running(agent: subprocess.Popen, url: str) -> None:
    def running():
        assert agent.poll() is None, "the agent exited"
        try:
            return (_node(url).get("status") or {}).get("workload")
        except StopIteration:  # not joined yet
            return None
    wait_while_alive(running, 60, "the workload running at the coordinator")


def _stop(agent: subprocess.Popen) -> None:
    """Kill the agent (the test failed) and show what it said."""
    if agent.poll() is None:
        agent.kill()
    out, err = agent.communicate()
    print("--- agent\n" + out[-3000:] + "\n" + err[-6000:])


def _node(url: str, name: str = "last-beat") -> dict:
    _, nodes = http("GET", f"{url}/v1/nodes", token=ADMIN_TOKEN)
    node = next(n for n in nodes["nodes"] if n["name"] == name)
    return http("GET", f"{url}/v1/nodes/{node['id']}", token=ADMIN_TOKEN)[1]


def test_the_workload_s_end_reaches_the_coordinator_before_the_agent_exits(tmp_path, coordinator_proc, fake_on_path):  # noqa: F811
    url, _ = coordinator_proc
    agent, fifo = _start(tmp_path, url, *fake_on_path)
    try:
        _wait_running(agent, url)
        _release(fifo)
        out, err = agent.communicate(timeout=60)
    except BaseException:
        _stop(agent)
        raise
    assert agent.returncode == 0, err
    assert "WORKLOAD-DONE" in out
    workload = _node(url)["status"]["workload"]  # read after the agent exited: nothing is sent any more
    assert workload["state"] == "terminated", workload
    assert workload["reason"] == "Completed" and workload["exit_code"] == 0 and workload["finished_at"], workload


def test_a_coordinator_that_does_not_answer_never_holds_the_exit(tmp_path, coordinator_proc, fake_on_path):  # noqa: F811
    url, coordinator = coordinator_proc
    agent, fifo = _start(tmp_path, url, *fake_on_path)
    try:
        _wait_running(agent, url)
        coordinator.send_signal(signal.SIGSTOP)  # connections still open (the kernel accepts), nothing answers
        _release(fifo)
        released = time.monotonic()
        out, err = agent.communicate(timeout=60)
        took = time.monotonic() - released
    except BaseException:
        _stop(agent)
        raise
    assert agent.returncode == 0, err
    assert "last heartbeat: no answer from the coordinator" in err, err
    assert "stopping did not finish in time" not in err, err  # the exit deadline was not needed
    assert took < 9.0, (took, err)  # the last heartbeat's bound (2 s) and the teardown, well inside the 10 s deadline
