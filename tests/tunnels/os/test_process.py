"""PR_SET_PDEATHSIG, set once and fork-safely, for every engine that starts a child process.

Real processes: a parent (a Python process running the engine, as the agent does) is
killed with SIGKILL, and the engine's child must die with it.
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from anex_agent.tunnels.os import process
from tests.polling import wait_for

ROOT = Path(__file__).resolve().parents[2]
FAKE_WIREPROXY = Path(__file__).resolve().parents[1] / "fake_wireproxy.py"
FAKE_WIREGUARD_GO = """\
#!/bin/sh
# stands in for wireguard-go: records its pid, then waits (it never opens a UAPI socket)
echo $$ > "$PIDFILE"
exec sleep 600
"""


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:  # a zombie waiting for its new parent to reap it is dead for our purpose
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] == "Z"
    except OSError:
        return True


def run_parent(tmp_path: Path, body: str, env: dict[str, str]) -> subprocess.Popen:
    """A parent process running ``body`` (async, with ``tasks`` in scope) forever, like the agent."""
    script = tmp_path / "parent.py"
    script.write_text("import asyncio, sys\nfrom anex_agent.tasks import Tasks\n\n"
                      "async def main():\n    async with asyncio.TaskGroup() as tg:\n        tasks = Tasks(tg, role='test')\n"
                      + textwrap.indent(textwrap.dedent(body), " " * 8)
                      + "        await asyncio.sleep(600)\n\nasyncio.run(main())\n")
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **env}
    return subprocess.Popen([sys.executable, str(script)], env=full_env, stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "parent.log", "wb"))


def assert_child_dies_with_parent(parent: subprocess.Popen, child_pid: Callable[[], int | None], what: str) -> None:
    """Wait (15 s) for ``child_pid()`` to name the child ``parent`` started (``what``), check it runs,
    SIGKILL the parent and wait (10 s) for the child to be gone. The parent never outlives the call."""
    try:
        child = wait_for(child_pid, 15, what)
        assert not gone(child)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        wait_for(lambda: gone(child), 10, f"child {child} to die with its parent")
    finally:
        if parent.poll() is None:
            parent.kill()


def test_spawn_sets_pdeathsig_and_the_child_dies_with_its_parent(tmp_path):
    pidfile = tmp_path / "child.pid"
    parent = run_parent(tmp_path, f"""
        from anex_agent.tunnels.os.process import spawn
        child = await spawn("sleep", "600")
        open({str(pidfile)!r}, "w").write(str(child.pid))
    """, {})
    assert_child_dies_with_parent(parent, lambda: pidfile.exists() and int(pidfile.read_text() or 0), "the child")


def test_without_pdeathsig_the_child_would_outlive_its_parent(tmp_path):
    """The control: the same parent with a plain create_subprocess_exec leaves the child running."""
    pidfile = tmp_path / "child.pid"
    parent = run_parent(tmp_path, f"""
        child = await asyncio.create_subprocess_exec("sleep", "600")
        open({str(pidfile)!r}, "w").write(str(child.pid))
    """, {})
    child = int(wait_for(lambda: pidfile.exists() and pidfile.read_text(), 15, "the child"))
    try:
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        time.sleep(0.5)
        assert not gone(child)
    finally:
        os.kill(child, signal.SIGKILL)


def test_wireguard_go_child_dies_with_the_agent(tmp_path):
    pidfile = tmp_path / "wg.pid"
    fake = tmp_path / "wireguard-go"  # engines give their child a minimal environment: the pid file rides here
    fake.write_text(FAKE_WIREGUARD_GO.replace('"$PIDFILE"', f'"{pidfile}"'))
    fake.chmod(0o755)
    parent = run_parent(tmp_path, f"""
        from anex_agent.tunnels.engines.wireguard_go import WireguardGoEngine
        engine = WireguardGoEngine(ifname="anxpdtest", binary={str(fake)!r}, socket_dir={str(tmp_path)!r})
        tasks.spawn("start", lambda: engine.start(tasks))
    """, {})
    assert_child_dies_with_parent(parent, lambda: pidfile.exists() and int(pidfile.read_text().strip() or 0),
                                  "wireguard-go started")


def test_wireproxy_child_dies_with_the_agent(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    wrapper = tmp_path / "wireproxy"  # engines give their child a minimal environment: the control dir rides here
    wrapper.write_text(f"#!/bin/sh\nFAKE_WIREPROXY_DIR={control} exec {sys.executable} {FAKE_WIREPROXY} \"$@\"\n")
    wrapper.chmod(0o755)
    parent = run_parent(tmp_path, f"""
        from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
        from anex_agent.tunnels.engines.wireproxy import WireproxyEngine
        engine = WireproxyEngine(binary={str(wrapper)!r}, state_dir={str(tmp_path / "state")!r})
        await engine.start(tasks)
        await engine.apply(DesiredConfig(private_key=bytes(range(32)), listen_port=None, address="10.254.0.5/16",
                                         mtu=1400, peers=(PeerConfig(public_key="{'A' * 43}=", endpoint="192.0.2.1:51820",
                                                                     allowed_ips=("10.254.0.0/16",)),)))
    """, {})
    starts = control / "starts.jsonl"
    assert_child_dies_with_parent(
        parent, lambda: starts.exists() and (line := starts.read_text().strip()) and json.loads(line.splitlines()[0])["pid"],
        "wireproxy started")


def test_every_engine_starts_its_children_through_spawn():
    """No engine calls the subprocess APIs itself: process.spawn (with the death signal) is the only way.
    (``cleanup.py`` runs ``nft`` to completion, synchronously: nothing there can outlive us.)"""
    forbidden = {"create_subprocess_exec", "create_subprocess_shell", "Popen", "run", "call", "check_call",
                 "check_output", "fork", "posix_spawn", "spawnv", "system"}
    found = []
    for path in (ROOT / "anex_agent" / "tunnels").glob("*.py"):
        if path.name in ("process.py", "cleanup.py"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in forbidden:
                base = node.func.value
                if isinstance(base, ast.Name) and base.id in ("asyncio", "subprocess", "os"):
                    found.append(f"{path.name}:{node.lineno} {base.id}.{node.func.attr}")
    assert found == []


def test_preexec_is_prepared_in_the_parent():
    preexec = process.pdeathsig_preexec()
    assert preexec.pdeathsig == signal.SIGTERM
    assert "ctypes" not in preexec.__code__.co_names  # nothing to import between fork and exec
    with pytest.raises(TypeError):
        import asyncio

        asyncio.run(process.spawn("true", preexec_fn=lambda: None))
