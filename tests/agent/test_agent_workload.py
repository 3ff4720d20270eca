"""The workload: real child processes, exit statuses, signal forwarding."""

import asyncio
import os
import shutil
import signal
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

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
    w = Workload([sys.executable, "-c", "import signal,time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                                        "print('up',flush=True)\ntime.sleep(60)"])
    w.proc = await asyncio.create_subprocess_exec(*w.argv, stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"  # SIGTERM is ignored from here on
    await w.terminate(grace=0.5)
    assert w.proc.returncode == -signal.SIGKILL


# ---------------------------------------------------------------- --user


def test_unknown_user_is_a_config_error_naming_the_source():
    from anex_agent.agent.workload import resolve_account

    for source in ("--user", "ANEX_WORKLOAD_USER"):
        with pytest.raises(ConfigError) as info:
            resolve_account("no-such-user-anex", source, euid=0)
        assert info.value.source == source and "no user 'no-such-user-anex'" in str(info.value)


def test_switching_users_needs_root():
    from anex_agent.agent.workload import resolve_account

    with pytest.raises(ConfigError) as info:
        resolve_account("nobody", "--user", euid=1000)
    assert info.value.source == "--user" and "needs root" in str(info.value) and "uid 1000" in str(info.value)


def test_account_by_name_or_uid():
    import pwd

    from anex_agent.agent.workload import resolve_account

    entry = pwd.getpwnam("nobody")
    by_name = resolve_account("nobody", "--user", euid=0)
    assert (by_name.uid, by_name.gid, by_name.home) == (entry.pw_uid, entry.pw_gid, entry.pw_dir)
    assert entry.pw_gid in by_name.groups
    assert resolve_account(str(entry.pw_uid), "--user", euid=0) == by_name


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="switching users needs root")
async def test_workload_runs_as_the_account(tmp_path):
    import tempfile

    from anex_agent.agent.workload import resolve_account
    from anex_agent.host.childenv import workload_env

    account = resolve_account("nobody", "--user", euid=0)
    shared = Path(tempfile.mkdtemp(prefix="anex-user-"))  # /tmp itself: nobody may enter
    try:
        shared.chmod(0o777)
        out = shared / "out"
        env = workload_env({"PATH": "/usr/bin:/bin", "ANEX_JOIN_TOKEN": "anexjt_x"}, account)
        script = f'echo "$(id -u) $(id -g) $HOME $USER $LOGNAME ${{ANEX_JOIN_TOKEN:-none}}" > {out}; cat {tmp_path}/x'
        (tmp_path / "x").write_text("root only")
        w = Workload(["/bin/sh", "-c", script], env=env, account=account)
        await w.start()
        assert await w.wait() != 0  # cat of a root-only directory's file failed
        uid, gid, home, user, logname, token = out.read_text().split()
        assert (int(uid), int(gid)) == (account.uid, account.gid)
        assert (home, user, logname, token) == (account.home, "nobody", "nobody", "none")
    finally:
        shutil.rmtree(shared)


async def test_a_command_that_cannot_be_executed_is_a_config_error(tmp_path):
    script = tmp_path / "not-executable"
    script.write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError) as info:
        await Workload([str(script)]).start()
    assert info.value.source == "CMD" and "cannot run" in str(info.value)


def test_cli_bad_user_stops_before_anything_with_one_line(tmp_path):
    import subprocess

    base = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "GW_TUNNEL_"))}
    base.update(ANEX_COORDINATOR_URL="http://127.0.0.1:9", ANEX_STATE_DIR=str(tmp_path / "state"))
    cases = ((["--user", "no-such-user-anex"], {}, "--user"),
             ([], {"ANEX_WORKLOAD_USER": "no-such-user-anex"}, "ANEX_WORKLOAD_USER"))
    with ThreadPoolExecutor(max_workers=len(cases)) as pool:  # two independent processes, side by side
        runs = [(pool.submit(subprocess.run, [sys.executable, "-m", "anex_agent", "run", *flags, "--", "true"],
                             env={**base, **extra}, capture_output=True, text=True, timeout=60), source)
                for flags, extra, source in cases]
    for run, source in runs:
        out = run.result()
        lines = [line for line in out.stderr.splitlines() if line.strip()]
        assert out.returncode == 2 and len(lines) == 1, out
        assert lines[0].startswith(f"anex-agent run: {source}: no user 'no-such-user-anex'"), lines
        assert not (tmp_path / "state").exists()  # nothing started
