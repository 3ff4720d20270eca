"""The workload dies with its agent: a kill -9 of the agent (not PID 1) ends it, and a restarted
agent stops a previous run's workload that still runs. Real processes, no namespaces."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from anex_agent.agent.workload import Workload
from anex_agent.agent.workload_lifetime import WorkloadRecord, start_time
from tests.polling import wait_for

# the agent, as far as the workload is concerned: the real Workload started from its event loop
AGENT = (
    "import asyncio, json, sys\n"
    "from pathlib import Path\n"
    "from anex_agent.agent.workload import Workload\n"
    "from anex_agent.agent.workload_lifetime import WorkloadRecord\n"
    "account = None\n"
    "if sys.argv[2]:\n"
    "    from anex_agent.agent.workload import resolve_account\n"
    "    account = resolve_account(sys.argv[2], '--user', euid=0)\n"
    "async def main():\n"
    "    w = Workload(['sleep', '300'], account=account, record=WorkloadRecord(Path(sys.argv[1])))\n"
    "    await w.start()\n"
    "    print(w.proc.pid, flush=True)\n"
    "    await w.wait()\n"
    "asyncio.run(main())\n"
)


def start_agent(record: Path, user: str = "") -> tuple[subprocess.Popen, int]:
    agent = subprocess.Popen([sys.executable, "-c", AGENT, str(record), user], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(Path.cwd())})
    workload = int(agent.stdout.readline())
    assert start_time(workload) is not None
    return agent, workload


@pytest.mark.parametrize("user", ["", "nobody"])
def test_kill_9_of_the_agent_ends_its_workload(tmp_path, user):
    if user and os.geteuid() != 0:
        pytest.skip("switching users needs root")
    agent, workload = start_agent(tmp_path / "workload.json", user)
    assert json.loads((tmp_path / "workload.json").read_text())["pid"] == workload
    agent.kill()  # SIGKILL: no teardown runs
    agent.wait(timeout=30)
    wait_for(lambda: start_time(workload) is None, timeout=30, what=f"the workload (pid {workload}) to end")


def sleeper() -> subprocess.Popen:
    """A workload a previous run left behind: in a process group of its own, as the agent starts it."""
    return subprocess.Popen(["sleep", "300"], process_group=0)


async def test_a_restarted_agent_stops_the_previous_runs_workload_first(tmp_path):
    left = sleeper()
    try:
        record = WorkloadRecord(tmp_path / "workload.json")
        record.save(left.pid)
        w = Workload(["true"], grace=30, record=record)
        await w.start()
        assert left.poll() == -signal.SIGTERM  # stopped (and reaped: it is this test's child) before the new start
        assert await w.wait() == 0
        assert not record.path.exists()  # the new workload ended: nothing recorded any more
    finally:
        left.kill()
        left.wait()


async def test_a_record_whose_pid_is_now_another_process_is_left_alone(tmp_path):
    other = sleeper()
    try:
        record = WorkloadRecord(tmp_path / "workload.json")
        record.path.write_text(json.dumps({"pid": other.pid, "start_time": start_time(other.pid) - 1}))
        w = Workload(["true"], record=record)
        await w.start()
        assert await w.wait() == 0
        assert other.poll() is None  # a reused pid: not the workload it recorded
    finally:
        other.kill()
        other.wait()
