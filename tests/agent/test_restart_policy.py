"""Restarts in place by the workload's restart policy: the policy, the kubelet's back-off, the
workload started again with its state (CrashLoopBackOff, restart_count) and ANEX_RESTART_POLICY."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys

import pytest

from anex_agent.agent import run_options
from anex_agent.agent.restart_policy import CrashLoopBackoff, parse_policy, restarts
from anex_agent.agent.workload import Workload
from anex_agent.errors import ConfigError


def test_which_exits_restart():
    assert not restarts("Never", 1) and not restarts("Never", 0)
    assert restarts("OnFailure", 1) and restarts("OnFailure", 137) and not restarts("OnFailure", 0)
    assert restarts("Always", 0) and restarts("Always", 3)


def test_the_backoff_doubles_from_10_s_to_5_min_and_resets_after_10_min_running():
    backoff = CrashLoopBackoff()
    assert [backoff.next_delay(1.0) for _ in range(7)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff.next_delay(599.0) == 300
    assert backoff.next_delay(600.0) == 10 and backoff.next_delay(5.0) == 20


def test_the_policy_is_parsed_once_naming_the_variable():
    args = argparse.Namespace(grace_period=None, wait_ready=None)
    assert run_options.from_args(args, {}).restart_policy == "Never"
    assert run_options.from_args(args, {"ANEX_RESTART_POLICY": "OnFailure"}).restart_policy == "OnFailure"
    with pytest.raises(ConfigError) as err:
        run_options.from_args(args, {"ANEX_RESTART_POLICY": "always"})
    assert err.value.source == "ANEX_RESTART_POLICY" and "Never, OnFailure, Always" in str(err.value)
    assert parse_policy("Always") == "Always"


class Recorded(CrashLoopBackoff):
    """The back-off, its delays recorded and made tiny (the test waits for the workload's end, not a time)."""

    def __init__(self) -> None:
        super().__init__()
        self.delays: list[float] = []

    def next_delay(self, ran_for: float) -> float:
        self.delays.append(super().next_delay(ran_for))
        return 0.01


async def test_on_failure_restarts_in_place_until_it_succeeds(tmp_path):
    counter = tmp_path / "runs"
    script = f"p='{counter}'\nimport os,sys\nn=int(open(p).read()) if os.path.exists(p) else 0\n" \
             f"open(p,'w').write(str(n+1))\nsys.exit(0 if n == 2 else 3)"
    backoff = Recorded()
    w = Workload([sys.executable, "-c", script], restart_policy="OnFailure", backoff=backoff)
    seen = []
    real = w.tracker.backing_off

    def backing_off():
        seen.append(real())
        return seen[-1]

    w.tracker.backing_off = backing_off
    await w.start()
    assert await w.wait() == 0
    assert counter.read_text() == "3" and backoff.delays == [10, 20]
    assert [(s.state, s.reason, s.exit_code, s.restart_count) for s in seen] == [
        ("waiting", "CrashLoopBackOff", 3, 0), ("waiting", "CrashLoopBackOff", 3, 1)]
    assert w.state.state == "terminated" and w.state.reason == "Completed" and w.state.restart_count == 2


async def test_never_ends_with_the_workload_and_a_forwarded_stop_is_not_restarted():
    w = Workload([sys.executable, "-c", "import sys; sys.exit(3)"])
    await w.start()
    assert await w.wait() == 3 and w.state.restart_count == 0
    script = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up',flush=True)\n" \
             "time.sleep(60)"
    always = Workload([sys.executable, "-c", script], restart_policy="Always", backoff=Recorded())
    await always.start(stdout=asyncio.subprocess.PIPE)
    assert (await always.proc.stdout.readline()).strip() == b"up"
    always.forward(signal.SIGTERM)
    assert await always.wait() == 0 and always.state.restart_count == 0 and always.backoff.delays == []
