"""1,000 idle ``GW_TUNNEL_*`` connections on the user-space engine cost the agent little memory.

A root agent on ``ANEX_ENGINE=userspace`` forwards a port to the cluster's HTTP echo service;
a client in the node's namespace opens :data:`IDLE` connections through it, one GET on each,
and keeps them idle. The agent's RSS (``VmRSS``) is read before and after; the growth per
idle forward must stay under :data:`BUDGET`.

With ``ANEX_IT_FOOTPRINT_BASELINE=/path/to/an/older/tree`` (a directory holding an
``anex_agent`` package) the same is first measured with that code on ``PYTHONPATH`` and
both figures are printed, for comparing before/after in one run.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT
from integration.conftest import client

HERE = Path(__file__).parent
TUNNEL = 18090
IDLE = 1000
#: agent RSS growth allowed per idle forward (the relay's old fixed buffers alone were 512 KiB)
BUDGET = 64 * 1024


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def _per_idle_forward(mesh, **extra_env: str) -> float:
    node = mesh.add_node_namespace()
    env = mesh.agent_env(node, ANEX_ENGINE="userspace", **{f"GW_TUNNEL_{TUNNEL}": f"{CLUSTER_IP}:{HTTP_PORT}"},
                         **extra_env)
    mesh.start_agent(node, env)
    idle = None
    try:
        assert node.status()["engine"] == "userspace"
        warm = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL}/warm")  # first-use allocations before measuring
        assert warm.get("status") == 200, warm
        before = _rss(node.proc.pid)
        idle = node.ns.popen([sys.executable, str(HERE / "idle_clients.py"), str(TUNNEL), str(IDLE)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = idle.stdout.readline().strip()  # blocks until every connection got its answer
        assert line == "ready", f"idle clients: {line!r} (exit {idle.poll()})"
        after = _rss(node.proc.pid)
    finally:
        if idle is not None:
            idle.stdin.close()
            idle.wait(timeout=60)
        mesh.stop_agent(node)
    per = (after - before) / IDLE
    print(f"agent RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB with {IDLE} idle forwards: "
          f"{per / 1024:.1f} KiB each" + (f" ({extra_env})" if extra_env else ""))
    return per


def test_thousand_idle_forwards_on_the_userspace_engine(mesh):
    baseline = os.environ.get("ANEX_IT_FOOTPRINT_BASELINE", "")
    if baseline:
        if not (Path(baseline) / "anex_agent").is_dir():
            pytest.fail(f"ANEX_IT_FOOTPRINT_BASELINE={baseline}: expected a directory holding anex_agent/")
        _per_idle_forward(mesh, PYTHONPATH=baseline)
    per = _per_idle_forward(mesh)
    assert per < BUDGET, f"{per / 1024:.1f} KiB of agent RSS per idle forward"
