"""One instance per state directory (anex_agent.host.statelock)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from anex_agent.host import statelock
from anex_agent.errors import ConfigError

HOLD = (
    "import sys, time\n"
    "from anex_agent.host import statelock\n"
    "lock = statelock.acquire(sys.argv[1], 'gateway')\n"
    "print('held', flush=True)\n"
    "time.sleep(60)\n"
)


def _holder(state_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(state_dir)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "held"
    return proc


def test_second_instance_is_refused_naming_the_dir_and_the_pid(tmp_path):
    proc = _holder(tmp_path)
    try:
        with pytest.raises(statelock.StateDirInUse) as err:
            statelock.acquire(tmp_path, "gateway")
        assert isinstance(err.value, ConfigError)  # the CLI exits 2 without a traceback
        text = str(err.value)
        assert str(tmp_path) in text and f"PID {proc.pid}" in text and "anex-agent gateway" in text
        # the refused instance did not overwrite the holder's record
        assert (tmp_path / statelock.LOCK_NAME).read_text().split()[0] == str(proc.pid)
    finally:
        proc.kill()
        proc.wait()


def test_a_sigkilled_instance_does_not_block_a_restart(tmp_path):
    proc = _holder(tmp_path)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    lock = statelock.acquire(tmp_path, "agent")
    try:
        assert (tmp_path / statelock.LOCK_NAME).read_text() == f"{os.getpid()} agent\n"
    finally:
        lock.release()


def test_release_lets_the_next_one_in_and_the_lock_is_exclusive_within_a_process(tmp_path):
    first = statelock.acquire(tmp_path / "new", "coordinator")
    assert oct((tmp_path / "new").stat().st_mode & 0o777) == "0o700"
    with pytest.raises(statelock.StateDirInUse):
        statelock.acquire(tmp_path / "new", "coordinator")
    first.release()
    first.release()  # twice is fine
    statelock.acquire(tmp_path / "new", "coordinator").release()


def test_children_do_not_inherit_the_lock(tmp_path):
    """A child left behind (the workload, wireguard-go) must not keep a dead instance's lock."""
    lock = statelock.acquire(tmp_path, "agent")
    child = subprocess.Popen(["sleep", "30"])
    try:
        lock.release()
        start = time.monotonic()
        statelock.acquire(tmp_path, "agent").release()
        assert time.monotonic() - start < 1
    finally:
        child.kill()
        child.wait()


def test_a_dropped_lock_is_released(tmp_path):
    """A role's entry that returns (in-process callers, tests) does not keep the state dir locked."""
    def entry():
        lock = statelock.acquire(tmp_path, "daemon")  # noqa: F841 - held until the function returns
        with pytest.raises(statelock.StateDirInUse):
            statelock.acquire(tmp_path, "daemon")
    entry()
    statelock.acquire(tmp_path, "daemon").release()
