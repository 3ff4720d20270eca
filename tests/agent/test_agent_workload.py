"""The workload: real child processes, exit statuses, signal forwarding."""

import asyncio
import signal
import sys

import pytest

from anex_agent.agent.workload import Workload, check_command, exit_status
from anex_agent.errors import ConfigError


def test_exit_status_shell_style():
    assert exit_status(0) == 0 and exit_status(7) == 7 and exit_status(-signal.SIGTERM) == 143


def test_check_command():
    check_command([sys.executable, "-c", "pass"])
    check_command(["sh", "-c", "true"])
    for bad in ([], ["/nonexistent/prog"], ["no-such-command-anex"]):
        with pytest.raises(ConfigError) as info:
            check_command(bad)
        assert info.value.source == "CMD"


async def test_status_is_returned():
    w = Workload([sys.executable, "-c", "import sys; sys.exit(5)"])
    await w.start()
    assert await w.wait() == 5


async def test_signal_forwarded_then_second_kills():
    script = "import signal,sys,time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(42))\nprint('up',flush=True)\ntime.sleep(60)"
    w = Workload([sys.executable, "-c", script])
    w.proc = await asyncio.create_subprocess_exec(*w.argv, stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"
    w.forward(signal.SIGTERM)
    assert await w.wait() == 42

    stubborn = "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nprint('up',flush=True)\ntime.sleep(60)"
    w2 = Workload([sys.executable, "-c", stubborn])
    w2.proc = await asyncio.create_subprocess_exec(*w2.argv, stdout=asyncio.subprocess.PIPE)
    assert (await w2.proc.stdout.readline()).strip() == b"up"
    w2.forward(signal.SIGTERM)
    w2.forward(signal.SIGINT)  # second terminating signal: kill
    assert await asyncio.wait_for(w2.wait(), 10) == 128 + signal.SIGKILL


async def test_terminate_escalates():
    w = Workload([sys.executable, "-c", "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\ntime.sleep(60)"])
    await w.start()
    await asyncio.sleep(0.3)
    await w.terminate(grace=0.5)
    assert w.proc.returncode == -signal.SIGKILL
