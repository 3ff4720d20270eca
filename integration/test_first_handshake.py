"""A node whose first handshake reaches the gateway before the gateway knows it does not wait
WireGuard's 5 s retry: the agent asks its engine for new initiations (with a back-off) until the
gateway answers.

The session mesh's gateway is paused (SIGSTOP: its hub keeps running, but it applies no watch
event) while the agent starts, registers and sends its first initiation; the gateway then resumes,
applies ``peer_added``, and the node's next extra initiation gets the answer. Each engine the
agent drives as root (wireguard-go) and unprivileged (the built-in userspace engine).
"""

from __future__ import annotations

import json
import os
import re
import signal

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, wait_until
from integration.conftest import client

PROXY = "127.0.0.1:3128"


@pytest.mark.parametrize("engine", ["wireguard-go", "userspace"])
def test_the_first_handshake_is_asked_again_when_the_gateway_learns_late(mesh, fresh_node, engine):
    node = fresh_node
    # UDP only: with ``auto`` and a gateway that offers a relay, the agent first probes UDP with a
    # handshake that only a gateway knowing the node answers (and falls back to the relay), so its
    # tunnel's first initiation would not race the gateway
    env = mesh.agent_env(node, ANEX_ENGINE=engine, ANEX_PATH="udp")
    gateway = mesh.gateway_proc
    os.kill(gateway.pid, signal.SIGSTOP)
    try:
        mesh.start_agent(node, env, wait_ready=False)
        # the status API comes after the data plane: the tunnel is up and its first initiation sent
        wait_until(lambda: _status(node), 60, "the agent's status API")
        assert "first handshake with gateway" not in node.log()
    finally:
        os.kill(gateway.pid, signal.SIGCONT)
    mesh.wait_agent_ready(node, timeout=60)
    line = wait_until(lambda: re.search(r"first handshake with gateway \S+ after [\d.]+ s \((\d+) extra", node.log()),
                      30, "the first-handshake log line")
    assert int(line.group(1)) >= 1, line.group(0)  # answered an extra initiation, not WireGuard's own retry
    result = client(node.ns, "get", f"http://{SERVICE_NAME}:{HTTP_PORT}/first", "--proxy", PROXY)
    assert result.get("status") == 200, result
    assert json.loads(result["body"])["path"] == "/first"


def _status(node) -> dict | None:
    try:
        return node.status()
    except Exception:
        return None
