"""The agent as PID 1 of a container: orphans reaped, signals forwarded, grace period, exit
codes, the container state (Completed/Error/OOMKilled) and the run options. Real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from anex_agent.agent import run_options
from anex_agent.agent.container_state import StateTracker, oom_counter_path, oom_kills
from anex_agent.agent.reaper import zombie_children
from anex_agent.agent.workload import FORWARDED, Workload
from anex_agent.errors import ConfigError
from anex_agent.testing.memcg import make_group, memory_controller
from anex_agent.wire.heartbeat import ContainerState, Heartbeat, TransportStatus

ROOT = Path(__file__).resolve().parents[2]

# A subreaper whose workload leaves an orphan behind (a background job of a shell that exits).
ORPHAN_SCRIPT = textwrap.dedent("""
    import asyncio, os, sys, time
    from anex_agent.agent.reaper import Reaper, become_subreaper, zombie_children
    REAP = sys.argv[1] == "reap"

    async def main():
        assert become_subreaper()
        shell = await asyncio.create_subprocess_exec("sh", "-c", "sleep 0.3 & echo $!", stdout=asyncio.subprocess.PIPE)
        orphan = int((await shell.stdout.readline()).strip())
        assert await shell.wait() == 0          # the shell (asyncio's own child) is reaped by asyncio
        reaper = Reaper(interval=0.05, settle=0.2)
        task = asyncio.create_task(reaper.run(), name="reaper") if REAP else None
        deadline = time.monotonic() + 30        # the orphan exits after 0.3 s: wait for what follows
        done = (lambda: reaper.reaped) if REAP else (lambda: orphan in zombie_children(os.getpid()))
        while not done() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        print(orphan, reaper.reaped, zombie_children(os.getpid()), flush=True)
        if task: task.cancel()

    asyncio.run(main())
""")


def _orphan_run(mode: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", ORPHAN_SCRIPT, mode], capture_output=True, text=True, timeout=60,
                         cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(maxsplit=2)


def test_an_orphaned_grandchild_is_reaped_by_the_subreaper():
    orphan, reaped, zombies = _orphan_run("reap")
    assert reaped == "1" and zombies == "[]"


def test_without_the_reaper_the_orphan_stays_a_zombie():
    # the control: the orphan did come to the subreaper, and only the reaper removes it
    orphan, reaped, zombies = _orphan_run("none")
    assert zombies == f"[{orphan}]"


def test_zombie_children_parses_comm_with_spaces_and_parentheses(tmp_path):
    for pid, stat in ((11, "11 (a b) c) Z 7 1"), (12, "12 (ok) S 7 1"), (13, "13 (x) Z 8 1")):
        (tmp_path / str(pid)).mkdir()
        (tmp_path / str(pid) / "stat").write_text(stat)
    (tmp_path / "self").mkdir()
    assert zombie_children(7, str(tmp_path)) == [11]


# ---------------------------------------------------------------- signals, grace, exit codes

TRAP_ALL = textwrap.dedent("""
    import signal, sys, time
    def seen(n, f):
        print(signal.Signals(n).name, flush=True)
        if n == signal.SIGQUIT:
            sys.exit(3)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH):
        signal.signal(s, seen)
    print("up", flush=True)
    while True:
        time.sleep(0.05)
""")


async def test_each_forwarded_signal_reaches_the_workload():
    w = Workload([sys.executable, "-c", TRAP_ALL], grace=30)
    await w.start(stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"
    order = [signal.SIGUSR1, signal.SIGUSR2, signal.SIGWINCH, signal.SIGHUP, signal.SIGTERM, signal.SIGQUIT]
    assert set(order) | {signal.SIGINT} == set(FORWARDED)
    for signum in order:
        w.forward(signum)
        line = await asyncio.wait_for(w.proc.stdout.readline(), 10)
        assert line.strip().decode() == signal.Signals(signum).name
    assert await asyncio.wait_for(w.wait(), 10) == 3
    assert w.state.state == "terminated" and w.state.reason == "Error" and w.state.exit_code == 3


async def test_sigint_is_forwarded_too():
    w = Workload([sys.executable, "-c", TRAP_ALL])
    await w.start(stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"
    w.forward(signal.SIGINT)
    assert (await asyncio.wait_for(w.proc.stdout.readline(), 10)).strip() == b"SIGINT"
    await w.terminate(grace=0.2)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def test_grace_period_then_the_whole_process_group_is_killed():
    # the workload and a child it started both ignore SIGTERM
    script = ("trap '' TERM; sh -c \"trap '' TERM; echo \\$\\$; while :; do sleep 0.05; done\" & "
              "while :; do sleep 0.05; done")
    w = Workload(["sh", "-c", script], grace=0.5)
    await w.start(stdout=asyncio.subprocess.PIPE)
    child = int((await asyncio.wait_for(w.proc.stdout.readline(), 10)).strip())
    assert os.getpgid(child) == w.proc.pid  # same process group, the workload leads it
    started = time.monotonic()
    w.forward(signal.SIGTERM)
    assert await asyncio.wait_for(w.wait(), 10) == 128 + signal.SIGKILL
    assert 0.45 <= time.monotonic() - started < 5
    for _ in range(100):
        if not _alive(child):
            break
        await asyncio.sleep(0.05)
    assert not _alive(child)
    assert w.state.signal == signal.SIGKILL and w.state.exit_code == 137 and w.state.reason == "Error"


async def test_a_workload_that_exits_within_the_grace_is_not_killed():
    script = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\nprint('up',flush=True)\ntime.sleep(60)"
    w = Workload([sys.executable, "-c", script], grace=0.3)
    await w.start(stdout=asyncio.subprocess.PIPE)
    await w.proc.stdout.readline()
    w.forward(signal.SIGTERM)
    assert await asyncio.wait_for(w.wait(), 10) == 0
    assert w.state.reason == "Completed" and w.state.exit_code == 0 and w.state.signal is None
    assert w.state.finished_at >= w.state.started_at


async def test_exit_codes_and_signal_deaths():
    w = Workload(["sh", "-c", "exit 7"])
    assert w.state.state == "waiting" and w.state.reason == "ContainerCreating"
    await w.start()
    assert w.state.state == "running" and w.state.started_at is not None
    assert await w.wait() == 7
    w = Workload(["sh", "-c", "kill -USR1 $$"])
    await w.start()
    assert await w.wait() == 128 + signal.SIGUSR1
    assert w.state.signal == signal.SIGUSR1 and w.state.exit_code == 138


# ---------------------------------------------------------------- container state, OOMKilled

def test_oomkilled_from_the_memory_events_counter(tmp_path):
    events = tmp_path / "memory.events"
    events.write_text("low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\n")
    tracker = StateTracker(events)
    tracker.started()
    events.write_text("low 0\nhigh 0\nmax 9\noom 2\noom_kill 2\n")
    assert tracker.terminated(-signal.SIGKILL).reason == "OOMKilled"
    tracker.started()  # a restart
    assert tracker.state.restart_count == 1
    assert tracker.terminated(-signal.SIGKILL).reason == "Error"  # killed, but no new OOM kill
    tracker.started()
    events.write_text("oom_kill 5\n")
    assert tracker.terminated(1).reason == "Error"  # exited by itself
    assert tracker.state.restart_count == 2


def test_oom_counter_path(tmp_path):
    (tmp_path / "kubepods" / "pod1").mkdir(parents=True)
    (tmp_path / "kubepods" / "pod1" / "memory.events").write_text("oom_kill 0\n")
    assert oom_counter_path("0::/kubepods/pod1\n", tmp_path) == tmp_path / "kubepods" / "pod1" / "memory.events"
    assert oom_counter_path("4:memory:/x\n0::/\n", tmp_path) is None  # no v2 file at the root, no v1 file
    assert oom_counter_path("4:memory:/x\n", tmp_path) is None
    assert oom_kills(None) is None and oom_kills(tmp_path / "nope") is None
    # cgroup v1: the memory controller's memory.oom_control, when it carries the counter (kernel 4.13+)
    v1 = tmp_path / "memory" / "docker" / "c1" / "memory.oom_control"
    v1.parent.mkdir(parents=True)
    v1.write_text("oom_kill_disable 0\nunder_oom 0\n")
    assert oom_counter_path("5:memory:/docker/c1\n0::/\n", tmp_path) is None  # an old kernel: no counter
    v1.write_text("oom_kill_disable 0\nunder_oom 0\noom_kill 2\n")
    assert oom_counter_path("9:pids:/docker/c1\n5:memory:/docker/c1\n0::/\n", tmp_path) == v1
    assert oom_kills(v1) == 2
    assert oom_counter_path("5:cpuacct,memory:/docker/c1\n", tmp_path) == v1  # co-mounted controllers


@pytest.mark.skipif(memory_controller() is None,
                    reason="no writable memory controller with an OOM-kill counter here (cgroup v2, or cgroup v1 "
                           "on kernel 4.13+): a memory limit cannot be set to provoke an OOM kill")
async def test_a_real_oom_kill_is_reported_as_oomkilled():
    group = make_group(32 << 20)
    try:
        hog = "x = []\nwhile True:\n    x.append(bytearray(1 << 20))"
        w = Workload([*group.enter_argv(), sys.executable, "-c", hog], tracker=StateTracker(group.counter))
        await w.start()
        assert await asyncio.wait_for(w.wait(), 60) == 137
        assert w.state.reason == "OOMKilled"
    finally:
        group.remove()


def test_container_state_travels_in_the_heartbeat():
    state = ContainerState(state="terminated", reason="OOMKilled", exit_code=137, signal=9, restart_count=1)
    beat = Heartbeat(status=TransportStatus(engine="kernel", workload=state))
    again = Heartbeat.model_validate_json(beat.model_dump_json())
    assert again.status.workload == state
    with pytest.raises(ValueError):
        ContainerState(state="sleeping")
    with pytest.raises(ValueError):
        ContainerState(state="terminated", exit_code=300)


# ---------------------------------------------------------------- run options

def _args(*argv):
    import argparse

    from anex_agent.agent import cli_run

    parser = argparse.ArgumentParser()
    cli_run.configure(parser)
    return parser.parse_args([*argv, "--", "true"])


def test_run_options_defaults_flags_and_variables():
    assert run_options.from_args(_args(), {}) == run_options.RunOptions(grace=30.0, wait_ready=None, proxy_env=False)
    got = run_options.from_args(_args("--grace-period", "5"), {"ANEX_GRACE_PERIOD": "9", "ANEX_WAIT_READY": "2.5",
                                                               "ANEX_PROXY_ENV": "1"})
    assert got == run_options.RunOptions(grace=5.0, wait_ready=2.5, proxy_env=True)


@pytest.mark.parametrize("argv, env, source", [
    (("--grace-period", "-1"), {}, "--grace-period"),
    (("--grace-period", "1e3"), {}, "--grace-period"),
    ((), {"ANEX_GRACE_PERIOD": "٣"}, "ANEX_GRACE_PERIOD"),
    (("--wait-ready", "3601"), {}, "--wait-ready"),
    ((), {"ANEX_PROXY_ENV": "maybe"}, "ANEX_PROXY_ENV"),
    ((), {"ANEX_LOGS": "2"}, "ANEX_LOGS"),
    ((), {"ANEX_PUSH_DIRS": "relative/dir"}, "ANEX_PUSH_DIRS"),
    ((), {"ANEX_PUSH_DIRS": "/srv/in:/srv/../etc"}, "ANEX_PUSH_DIRS"),
])
def test_run_options_refused(argv, env, source):
    with pytest.raises(ConfigError) as info:
        run_options.from_args(_args(*argv), env)
    assert info.value.source == source


def test_proxy_variables_both_cases():
    env = run_options.proxy_variables("127.0.0.1", 3128)
    assert env["HTTP_PROXY"] == env["https_proxy"] == "http://127.0.0.1:3128"
    assert env["no_proxy"] == env["NO_PROXY"] and "127.0.0.1" in env["NO_PROXY"]
    assert run_options.proxy_variables("::1", 8080)["HTTPS_PROXY"] == "http://[::1]:8080"


def test_push_dirs_are_resolved(tmp_path):
    (tmp_path / "real").mkdir()
    os.symlink(tmp_path / "real", tmp_path / "link")
    got = run_options.from_args(_args(), {"ANEX_PUSH_DIRS": f"{tmp_path}/link::/srv/inbox"})
    assert got.push_dirs == (str(tmp_path / "real"), "/srv/inbox")
