"""The real ``anex-agent daemon`` (wireguard-go, telemetry on) imports only what its role and engine use.

The agent runs as users start it, with ``PYTHONPROFILEIMPORTTIME=1``: Python itself writes
every module it imports to the agent's log. After a proxied answer (by IP: no cluster name
lookup) and a heartbeat, the list must hold none of the other roles' modules and none of
the libraries the agent imports only where used (see tests/agent/test_startup_imports.py),
aiohttp included, with the agent API serving.
"""

from __future__ import annotations

import re
import time

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT
from integration.conftest import client
from tests.agent.test_startup_imports import LAZY, NEVER, offending

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|(\s*)(\S+)\s*$")


def test_daemon_imports_neither_other_roles_nor_unused_libraries(mesh, fresh_node):
    env = mesh.agent_env(fresh_node, PYTHONPROFILEIMPORTTIME="1")
    mesh.start_agent(fresh_node, env)
    result = client(fresh_node.ns, "get", f"http://{CLUSTER_IP}:{HTTP_PORT}/footprint", "--proxy", "127.0.0.1:3128")
    assert result.get("status") == 200, result
    time.sleep(2)  # past the first heartbeat and telemetry sample
    assert fresh_node.status()["engine"] == "wireguard-go"
    mesh.stop_agent(fresh_node)
    modules = {m.group(2) for line in fresh_node.log().splitlines() if (m := IMPORTED.match(line))}
    assert {"anex_agent.agent.supervisor", "anex_agent.frontends.proxy", "anex_agent.tunnels.os.rtnl",
            "anex_agent.agent.api", "anex_agent.net.http.server", "anex_agent.client.rest"} <= modules  # the API is up
    assert offending(modules, NEVER) == []
    assert offending(modules, LAZY) == []
