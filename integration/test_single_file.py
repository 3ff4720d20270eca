"""The single-file agent in a Debian root filesystem without Python, as PID 1 of a new PID
namespace (``unshare --pid --fork --mount-proc`` + ``chroot``) inside a node's network
namespace: it joins the real coordinator, serves the proxy and a ``GW_TUNNEL_*`` forward,
reaps an orphan of its workload, forwards SIGTERM and exits with the workload's status.

Needs what ``scripts/test-single-file`` prepares and names in the environment:
``ANEX_SINGLE_FILE`` (the agent built by ``images/build-single-file``) and ``ANEX_TEST_ROOTFS``
(``debootstrap --variant=minbase``: no Python). Skipped, with the reason, without them.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from anex_agent.demo.mesh import HTTP_PORT, SERVICE_NAME
from integration.conftest import client, read_until

SINGLE_FILE = os.environ.get("ANEX_SINGLE_FILE", "")
ROOTFS = os.environ.get("ANEX_TEST_ROOTFS", "")
TUNNEL = 18095

pytestmark = pytest.mark.skipif(
    not (SINGLE_FILE and ROOTFS and Path(SINGLE_FILE).is_file() and Path(ROOTFS, "bin", "sh").exists()),
    reason="ANEX_SINGLE_FILE and ANEX_TEST_ROOTFS are not set (scripts/test-single-file builds and sets them)",
)

WORKLOAD = (
    "sh -c 'sleep 0.5 &'; "  # its parent exits at once: the sleep is orphaned, then exits
    "echo WORKLOAD-UP; trap 'echo WORKLOAD-TERM; exit 42' TERM; "
    "while :; do sleep 0.1; done"
)


def _pid_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return None


def _procs_in(ns_id: str) -> list[tuple[int, str, str]]:
    """(host pid, comm, state) of every process in the PID namespace ``ns_id``."""
    out = []
    for name in os.listdir("/proc"):
        if name.isdigit() and _pid_ns(int(name)) == ns_id:
            try:
                stat = Path(f"/proc/{name}/stat").read_text()
            except OSError:
                continue
            out.append((int(name), stat[stat.index("(") + 1:stat.rindex(")")], stat[stat.rindex(")") + 2]))
    return out


@pytest.fixture
def rootfs(tmp_path):
    root = Path(ROOTFS)
    assert not any((root / p).exists() for p in ("usr/bin/python3", "usr/bin/python", "usr/local/bin/python3")), \
        "the root filesystem must not have Python"
    bindir = root / "usr" / "local" / "bin"
    shutil.copy2(SINGLE_FILE, bindir / "anex-agent")
    wg = shutil.which("wireguard-go")
    assert wg, "wireguard-go is needed on the host"
    shutil.copy2(wg, bindir / "wireguard-go")
    state = root / "var" / "lib" / "anex-agent"
    shutil.rmtree(state, ignore_errors=True)
    yield root
    shutil.rmtree(state, ignore_errors=True)


def test_single_file_agent_as_pid1_without_python(mesh, rootfs):
    node = mesh.add_node_namespace()
    env = mesh.agent_env(node, **{f"GW_TUNNEL_{TUNNEL}": f"{SERVICE_NAME}:{HTTP_PORT}"})
    env.update({"ANEX_STATE_DIR": "/var/lib/anex-agent", "PATH": "/usr/local/bin:/usr/bin:/bin",
                "HOME": "/root", "ANEX_GRACE_PERIOD": "10"})
    env = {k: v for k, v in env.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    root = str(rootfs)
    # PID 1 of a new PID namespace (and mount namespace: /proc of that namespace, /dev for TUN)
    mount, chroot, unshare = (shutil.which(tool) for tool in ("mount", "chroot", "unshare"))
    inner = f"{mount} --bind /dev {root}/dev && exec {chroot} {root} /usr/local/bin/anex-agent run -- /bin/sh -c \"{WORKLOAD}\""
    proc = node.ns.popen([unshare, "--pid", "--fork", "--mount", f"--mount-proc={root}/proc", "sh", "-c", inner],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=False)
    try:
        lines = read_until(proc, lambda ls: any(l.startswith("WORKLOAD-UP") for l in ls), 90)
        text = "".join(lines)
        assert any(l.startswith("WORKLOAD-UP") for l in lines), text
        assert "mesh up" in text and "engine=wireguard-go" in text, text
        # the single file is PID 1 of the new namespace (the PyInstaller bootloader, its agent child)
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        assert len(children) == 1
        pid1 = children[0]
        ns_id = _pid_ns(pid1)
        assert ns_id != _pid_ns(os.getpid())
        nspid = [l for l in Path(f"/proc/{pid1}/status").read_text().splitlines() if l.startswith("NSpid:")][0]
        assert nspid.split()[-1] == "1", nspid
        assert os.readlink(f"/proc/{pid1}/exe").endswith("/usr/local/bin/anex-agent")

        got = client(node.ns, "get", f"http://{SERVICE_NAME}:{HTTP_PORT}/via-proxy", "--proxy", "127.0.0.1:3128")
        assert got.get("status") == 200, got
        got = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL}/via-tunnel")
        assert got.get("status") == 200, got

        # the orphaned sleep exited and was reaped: no zombie left in the namespace
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(state == "Z" for _, _, state in _procs_in(ns_id)):
            time.sleep(0.2)
        assert not [p for p in _procs_in(ns_id) if p[2] == "Z"], _procs_in(ns_id)

        os.kill(pid1, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise
    out = text + rest.decode(errors="replace")
    assert proc.returncode == 42, out
    assert "WORKLOAD-TERM" in out and "Traceback" not in out, out
