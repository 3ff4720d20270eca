"""The single-file agent in a Debian root filesystem without Python, as PID 1 of a new PID
namespace (``unshare --pid --fork --mount-proc`` + ``chroot``) inside a node's network
namespace: it joins the real coordinator, serves the proxy and a ``GW_TUNNEL_*`` forward,
reaps an orphan of its workload, forwards SIGTERM and exits with the workload's status. And the
provisioning bootstrap in the same root filesystem: the start script downloads the agent from
the coordinator (``GET /v1/agent/<arch>``, started with ``--agent-binary``), checks its hash,
joins with a provision's single-use token and runs the workload; another hash is refused.

Needs what ``scripts/test-single-file`` prepares and names in the environment:
``ANEX_SINGLE_FILE`` (the agent built by ``images/build-single-file``) and ``ANEX_TEST_ROOTFS``
(``debootstrap --variant=minbase``: no Python). Skipped, with the reason, without them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME
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


def _reaches_the_cluster(node, tag: str) -> None:
    """The workload's two ways into the cluster work: the HTTP proxy and the GW_TUNNEL forward."""
    got = client(node.ns, "get", f"http://{SERVICE_NAME}:{HTTP_PORT}/{tag}", "--proxy", "127.0.0.1:3128")
    assert got.get("status") == 200, got
    got = client(node.ns, "get", f"http://127.0.0.1:{TUNNEL}/{tag}-tunnel")
    assert got.get("status") == 200, got


@contextlib.contextmanager
def _killed_on_failure(proc: subprocess.Popen):
    """Kill ``proc`` when the block fails (a test that failed leaves no namespace's PID 1 behind)."""
    try:
        yield
    except BaseException:
        if proc.poll() is None:
            proc.kill()
        raise


def _terminate(proc: subprocess.Popen, pid: int, seen: str) -> str:
    """SIGTERM to ``pid`` (the namespace's PID 1); all that ``proc`` printed, ``seen`` first."""
    os.kill(pid, signal.SIGTERM)
    rest, _ = proc.communicate(timeout=60)
    return seen + rest.decode(errors="replace")


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
    with _killed_on_failure(proc):
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

        _reaches_the_cluster(node, "via-proxy")

        # the orphaned sleep exited and was reaped: no zombie left in the namespace
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(state == "Z" for _, _, state in _procs_in(ns_id)):
            time.sleep(0.2)
        assert not [p for p in _procs_in(ns_id) if p[2] == "Z"], _procs_in(ns_id)

        out = _terminate(proc, pid1, text)
    assert proc.returncode == 42, out
    assert "WORKLOAD-TERM" in out and "Traceback" not in out, out


# ---------------------------------------------------------------- bootstrap from the coordinator

BOOT_WORKLOAD = "echo BOOT-WORKLOAD-UP \"$#\"; trap 'echo BOOT-WORKLOAD-TERM; exit 43' TERM; while :; do sleep 0.1; done"
HOSTILE_ARGS = ["it's", '"$HOME" `id` $(id)', "a;b && c", "new\nline", ""]


async def _in_coordinator_db(mesh, fn):
    """``fn(tx)`` in a transaction on the mesh coordinator's SQLite database (what its provisioning
    loop does inside the coordinator)."""
    from anex_agent.coordinator.db import open_database

    db = await open_database(f"sqlite:///{mesh.workdir / 'coordinator' / 'coordinator.db'}")
    try:
        async with db.transaction() as tx:
            return await fn(tx)
    finally:
        await db.close()


def _issue(mesh, provision_id: str):
    from anex_agent.coordinator.provisioning import bootstrap

    now = time.time()
    return asyncio.run(_in_coordinator_db(
        mesh, lambda tx: bootstrap.issue(tx, provision_id, expires_at=now + 300, now=now, provider="vastai")))


def _node_of(mesh, provision_id: str):
    from anex_agent.coordinator.provisioning import bootstrap

    return asyncio.run(_in_coordinator_db(mesh, lambda tx: bootstrap.node_of_provision(tx, provision_id)))


@pytest.fixture
def bare_rootfs():
    """The root filesystem with wireguard-go but without the agent: the start script fetches it."""
    root = Path(ROOTFS)
    assert not any((root / p).exists() for p in ("usr/bin/python3", "usr/bin/python", "usr/local/bin/python3"))
    bindir = root / "usr" / "local" / "bin"
    (bindir / "anex-agent").unlink(missing_ok=True)
    shutil.copy2(shutil.which("wireguard-go"), bindir / "wireguard-go")
    state = root / "var" / "lib" / "anex-agent"
    shutil.rmtree(state, ignore_errors=True)
    yield root
    shutil.rmtree(state, ignore_errors=True)
    (root / "root" / "onstart.sh").unlink(missing_ok=True)


def _run_start_script(node, root: Path, script: str) -> subprocess.Popen:
    (root / "root" / "onstart.sh").write_text(script)
    mount, chroot, unshare = (shutil.which(tool) for tool in ("mount", "chroot", "unshare"))
    inner = f"{mount} --bind /dev {root}/dev && exec {chroot} {root} /bin/sh /root/onstart.sh"
    env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/root", "ANEX_GRACE_PERIOD": "10"}
    return node.ns.popen([unshare, "--pid", "--fork", "--mount", f"--mount-proc={root}/proc", "sh", "-c", inner],
                         env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=False)


def test_start_script_boots_the_agent_from_the_coordinator_without_python_curl_or_wget(mesh, bare_rootfs):
    """The provisioning bootstrap for real: the start script downloads the single-file agent from
    the coordinator (bash /dev/tcp: minbase has neither curl nor wget), checks its SHA-256, joins
    with the provision's single-use token and runs the workload, whose argv arrives intact."""
    from anex_agent.coordinator.provisioning import bootstrap

    root = bare_rootfs
    assert not (root / "usr/bin/curl").exists() and not (root / "usr/bin/wget").exists(), \
        "this test exercises the start script's bash /dev/tcp download"
    node = mesh.add_node_namespace()
    creds = _issue(mesh, "pr-single-file")
    sha = hashlib.sha256(Path(SINGLE_FILE).read_bytes()).hexdigest()
    script = bootstrap.start_script(
        mesh.coordinator_url_for(node), creds.secret, sha, ["/bin/sh", "-c", BOOT_WORKLOAD, "sh", *HOSTILE_ARGS],
        env={"ANEX_ENGINE": "wireguard-go", "ANEX_PROVIDER": "vastai", "ANEX_NODE_NAME": "rented-single-file",
             f"GW_TUNNEL_{TUNNEL}": f"{SERVICE_NAME}:{HTTP_PORT}"})
    proc = _run_start_script(node, root, script)
    with _killed_on_failure(proc):
        lines = read_until(proc, lambda ls: any(l.startswith("BOOT-WORKLOAD-UP") for l in ls), 120)
        text = "".join(lines)
        assert f"BOOT-WORKLOAD-UP {len(HOSTILE_ARGS)}" in text, text
        assert "mesh up" in text, text
        agent = root / "var/lib/anex-agent/anex-agent"
        assert hashlib.sha256(agent.read_bytes()).hexdigest() == sha
        node_id = _node_of(mesh, "pr-single-file")
        assert node_id, "the node did not join with the provision's token"
        view = mesh.admin("GET", f"/v1/nodes/{node_id}")
        assert view["labels"][bootstrap.PROVISION_LABEL] == "pr-single-file" and view["provider"] == "vastai"
        _reaches_the_cluster(node, "via-boot")
        children = [int(p) for p in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
        out = _terminate(proc, children[0], text)  # PID 1 of the namespace: the agent the script exec'd
    assert proc.returncode == 43, out
    assert creds.secret not in out and "Traceback" not in out, out


def test_start_script_in_the_rootfs_refuses_an_agent_with_another_hash(mesh, bare_rootfs):
    from anex_agent.coordinator.provisioning import bootstrap

    node = mesh.add_node_namespace()
    creds = _issue(mesh, "pr-tampered")
    script = bootstrap.start_script(mesh.coordinator_url_for(node), creds.secret, "0" * 64, ["/bin/true"])
    proc = _run_start_script(node, bare_rootfs, script)
    out, _ = proc.communicate(timeout=60)
    text = out.decode(errors="replace")
    assert proc.returncode == 1 and "checksum mismatch" in text, text
    assert not (bare_rootfs / "var/lib/anex-agent/anex-agent").exists()
    assert _node_of(mesh, "pr-tampered") is None
