"""Remote access through the real mesh with the real OpenSSH client (ssh, scp, sftp, script).

One mesh; node A runs ``anex-agent run`` (wireguard-go engine) with a workload serving HTTP on
port 8090; node B an unprivileged ``anex-agent daemon`` on the built-in user-space engine (its SSH
server is served through the stack's inbound path). Every client runs in the cluster namespace,
which reaches the mesh through the gateway, with ``StrictHostKeyChecking=yes`` and only the
coordinator's ``@cert-authority`` line in its known_hosts.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from anex_agent.testing.mesh import CLUSTER_GW, COORDINATOR_PORT, anex_argv, wait_until
from integration.conftest import client

pytestmark = pytest.mark.skipif(not (shutil.which("ssh") and shutil.which("script")),
                                reason="the OpenSSH client (openssh-client) and script (util-linux) are needed")

WORKLOAD_PORT = 8090
SSH_PORT = 2222


class Nodes:
    def __init__(self, mesh, a, b, work: Path) -> None:
        self.mesh, self.a, self.b, self.work = mesh, a, b, work
        self.ca = mesh.admin("GET", "/v1/ssh/ca")
        (work / "known_hosts").write_text("".join(line + "\n" for line in self.ca["known_hosts"]))
        self._keys = 0

    def info(self, node) -> tuple[str, str]:
        status = node.status()
        return status["node_id"], status["address"]

    def key(self, node, *, validity: int | None = None, features=None, certify: bool = True) -> tuple[Path, dict]:
        """A fresh key pair (ssh-keygen) and, with ``certify``, its certificate for ``node``."""
        self._keys += 1
        path = self.work / f"id{self._keys}"
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)
        if not certify:
            return path, {}
        body = {"public_key": Path(f"{path}.pub").read_text().strip(), "requested_for": "integration"}
        if validity is not None:
            body["validity"] = validity
        if features is not None:
            body["features"] = features
        cert = self.mesh.admin("POST", f"/v1/nodes/{self.info(node)[0]}/ssh-certificates", body)
        Path(f"{path}-cert.pub").write_text(cert["certificate"] + "\n")
        return path, cert

    def options(self, key: Path, known_hosts: Path | None = None) -> list[str]:
        return ["-F", "/dev/null", "-i", str(key), "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
                "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={known_hosts or self.work / 'known_hosts'}",
                "-o", "GlobalKnownHostsFile=/dev/null", "-o", "ConnectTimeout=10", "-o", "LogLevel=ERROR"]

    def ssh(self, node, key: Path, *command: str, user: str | None = None, known_hosts: Path | None = None,
            timeout: float = 30, **kw) -> subprocess.CompletedProcess:
        node_id, address = self.info(node)
        return self.mesh.cluster.run(["ssh", *self.options(key, known_hosts), "-p", str(SSH_PORT),
                                      f"{user or node_id}@{address}", *command], check=False, timeout=timeout, **kw)


@pytest.fixture(scope="module")
def nodes(mesh):
    a = mesh.add_node_namespace()
    env = mesh.agent_env(a, ANEX_NODE_NAME="ssh-a", WORKLOAD_MARK="from-the-workload")
    mesh.start_agent(a, env, [sys.executable, "-m", "anex_agent.testing.services", "http", "--listen",
                              f"0.0.0.0:{WORKLOAD_PORT}", "--name", "workload"])
    b = mesh.add_node_namespace()
    mesh.start_agent(b, mesh.agent_env(b, ANEX_NODE_NAME="ssh-b", ANEX_ENGINE="userspace"), unprivileged=True)
    work = Path(tempfile.mkdtemp(prefix="anex-ssh-it-"))
    built = Nodes(mesh, a, b, work)
    for node in (a, b):  # the host certificate is asked for right after the start
        wait_until(lambda n=node: n.status()["ssh"]["host_certificate"], 30, "the node's host certificate")
    yield built
    for node in (a, b):
        mesh.stop_agent(node)
    shutil.rmtree(work, ignore_errors=True)


def test_exec_with_exit_status_in_the_workload_context_on_both_engines(nodes):
    key, _ = nodes.key(nodes.a)
    result = nodes.ssh(nodes.a, key, "echo $WORKLOAD_MARK; env | grep -c ^ANEX_JOIN_TOKEN; exit 3")
    assert result.returncode == 3, result.stderr
    assert result.stdout.split() == ["from-the-workload", "0"]
    key_b, _ = nodes.key(nodes.b)
    result = nodes.ssh(nodes.b, key_b, "id -u")  # the user-space engine, unprivileged agent: its account
    assert (result.returncode, result.stdout.strip()) == (0, "65534"), result.stderr


def test_pty_session_driven_by_script_sees_the_terminal_size(nodes):
    key, _ = nodes.key(nodes.a)
    node_id, address = nodes.info(nodes.a)
    inner = " ".join(["stty rows 33 cols 101;", "ssh", "-tt", *nodes.options(key), "-p", str(SSH_PORT),
                      f"{node_id}@{address}", "'stty size; tty; exit 4'"])
    result = nodes.mesh.cluster.run(["script", "-qec", inner, "/dev/null"], check=False, timeout=30)
    lines = [line.strip() for line in result.stdout.replace("\r", "").splitlines() if line.strip()]
    # (the remote terminal echoes what script's end of input sends, e.g. ^@, before a line of
    # the output: the first or another one, as the timing goes)
    assert any(line.endswith("33 101") for line in lines), (result.stdout, result.stderr)
    assert any(re.search(r"/dev/pts/[0-9]+$", line) for line in lines), (result.stdout, result.stderr)
    assert result.returncode == 4


def test_pty_takes_the_terminal_modes_of_the_openssh_client(nodes):
    key, _ = nodes.key(nodes.a)
    node_id, address = nodes.info(nodes.a)
    inner = " ".join(["stty erase ^X -echoctl -iutf8;", "ssh", "-tt", *nodes.options(key), "-p", str(SSH_PORT),
                      f"{node_id}@{address}", "'stty -a'"])
    result = nodes.mesh.cluster.run(["script", "-qec", inner, "/dev/null"], check=False, timeout=30)
    words = result.stdout.replace("\r", "").replace(";", " ").split()
    assert "erase = ^X" in " ".join(words), (result.stdout, result.stderr)  # sent by ssh, set on the node's PTY
    assert "-echoctl" in words and "-iutf8" in words


def test_files_both_ways_with_scp_and_sftp(nodes):
    key, _ = nodes.key(nodes.a)
    node_id, address = nodes.info(nodes.a)
    local = nodes.work / "payload.bin"
    local.write_bytes(os.urandom(3 * 1024 * 1024 + 5))
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    remote = f"/tmp/anex-ssh-{os.getpid()}.bin"
    up = nodes.mesh.cluster.run(["scp", *nodes.options(key), "-P", str(SSH_PORT), str(local),
                                 f"{node_id}@{address}:{remote}"], check=False, timeout=60)
    assert up.returncode == 0, up.stderr
    assert nodes.ssh(nodes.a, key, f"sha256sum {remote}").stdout.split()[0] == digest
    back = nodes.work / "back.bin"
    batch = nodes.work / "batch"
    batch.write_text(f"get {remote} {back}\nrm {remote}\n")
    down = nodes.mesh.cluster.run(["sftp", *nodes.options(key), "-P", str(SSH_PORT), "-b", str(batch),
                                   f"{node_id}@{address}"], check=False, timeout=60)
    assert down.returncode == 0, down.stderr
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    assert nodes.ssh(nodes.a, key, f"test -e {remote}").returncode == 1  # removed over SFTP


def test_local_port_forward_to_a_workload_port(nodes):
    key, _ = nodes.key(nodes.a)
    node_id, address = nodes.info(nodes.a)
    forward = nodes.mesh.cluster.popen(
        ["ssh", *nodes.options(key), "-p", str(SSH_PORT), "-N", "-o", "ExitOnForwardFailure=yes",
         "-L", f"127.0.0.1:19555:127.0.0.1:{WORKLOAD_PORT}", f"{node_id}@{address}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        result = wait_until(lambda: (r := client(nodes.mesh.cluster, "get", "http://127.0.0.1:19555/forwarded",
                                                 timeout=10)).get("status") == 200 and r, 20, "the forward")
        body = json.loads(result["body"])
        assert body["service"] == "workload" and body["path"] == "/forwarded"
        assert body["peer"] == "127.0.0.1"  # delivered on the node itself
    finally:
        forward.terminate()
        forward.wait(timeout=10)


def test_refused_another_nodes_certificate_an_expired_one_and_a_plain_key(nodes):
    key_b, cert_b = nodes.key(nodes.b)
    node_b = cert_b["node_id"]
    for user in (None, node_b):  # on node A, as A's id or as B's
        result = nodes.ssh(nodes.a, key_b, "true", user=user)
        assert result.returncode == 255 and "Permission denied" in result.stderr
    short, _ = nodes.key(nodes.a, validity=1)
    time.sleep(2.2)
    result = nodes.ssh(nodes.a, short, "true")
    assert result.returncode == 255 and "Permission denied" in result.stderr
    plain, _ = nodes.key(nodes.a, certify=False)
    result = nodes.ssh(nodes.a, plain, "true")
    assert result.returncode == 255 and "Permission denied" in result.stderr


def test_host_certificate_is_checked_strictly(nodes):
    key, _ = nodes.key(nodes.a)
    other_ca = nodes.work / "other-ca"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other_ca)], check=True)
    wrong = nodes.work / "known_hosts_wrong"
    wrong.write_text(f"@cert-authority * {Path(f'{other_ca}.pub').read_text().strip()}\n")
    result = nodes.ssh(nodes.a, key, "true", known_hosts=wrong)
    assert result.returncode == 255 and "Host key verification failed" in result.stderr
    assert nodes.ssh(nodes.a, key, "true").returncode == 0


def test_revoked_serial_refused_within_one_watch_round_trip(nodes):
    key, cert = nodes.key(nodes.a)
    assert nodes.ssh(nodes.a, key, "true").returncode == 0
    revoked_at = time.monotonic()
    nodes.mesh.admin("POST", f"/v1/ssh/certificates/{cert['serial']}/revoke")
    wait_until(lambda: f"certificate {cert['serial']} revoked" in nodes.a.log(), 2.0, "the revocation on the node")
    assert time.monotonic() - revoked_at < 2.0
    result = nodes.ssh(nodes.a, key, "true")
    assert result.returncode == 255 and "Permission denied" in result.stderr
    audit = nodes.mesh.admin("GET", f"/v1/ssh/certificates?node_id={cert['node_id']}")
    [record] = [r for r in audit["certificates"] if r["serial"] == cert["serial"]]
    assert record["revoked_at"] and record["requested_for"] == "integration"


def test_anex_agent_ssh_and_cp_and_sessions_at_the_coordinator(nodes):
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")},
           "ANEX_COORDINATOR_URL": f"http://{CLUSTER_GW}:{COORDINATOR_PORT}", "ANEX_ADMIN_TOKEN": nodes.mesh.admin_token}
    run = nodes.mesh.cluster.run
    result = run([*anex_argv(), "ssh", "ssh-a", "--", "sh", "-c", "echo via-cli; exit 5"], check=False, timeout=60,
                 env=env, stdin=subprocess.DEVNULL)
    assert (result.returncode, result.stdout.strip()) == (5, "via-cli"), result.stderr
    argv = " ".join([*anex_argv(), "ssh", "-t", "ssh-a", "--", "stty", "size"])
    tty = run(["script", "-qec", f"stty rows 21 cols 77; {argv}", "/dev/null"], check=False, timeout=60, env=env)
    assert any(line.strip().endswith("21 77") for line in tty.stdout.replace("\r", "").splitlines()), \
        (tty.stdout, tty.stderr)
    local = nodes.work / "cp.bin"
    local.write_bytes(os.urandom(100_000))
    remote = f"/tmp/anex-cp-{os.getpid()}.bin"
    assert run([*anex_argv(), "cp", str(local), f"ssh-a:{remote}"], check=False, timeout=60, env=env).returncode == 0
    back = nodes.work / "cp-back.bin"
    assert run([*anex_argv(), "cp", f"ssh-a:{remote}", str(back)], check=False, timeout=60, env=env).returncode == 0
    assert back.read_bytes() == local.read_bytes()
    node_id, _ = nodes.info(nodes.a)

    def reported():
        sessions = nodes.mesh.admin("GET", f"/v1/ssh/sessions?node_id={node_id}")["sessions"]
        return any(s["session"]["command"] == "sh -c 'echo via-cli; exit 5'" and s["session"].get("exit_status") == 5
                   for s in sessions)

    wait_until(reported, 15, "the session summary at the coordinator")


@pytest.fixture(scope="module")
def user_node(mesh, nodes):
    """A third node whose workload runs as ``nobody`` (``--user``), and two directories: one that
    account owns, one beside it that only root may write."""
    c = mesh.add_node_namespace()
    env = mesh.agent_env(c, ANEX_NODE_NAME="ssh-c", ANEX_WORKLOAD_USER="nobody")
    mesh.start_agent(c, env, ["sleep", "3600"])
    wait_until(lambda: c.status()["ssh"]["host_certificate"], 30, "the node's host certificate")
    base = Path(tempfile.mkdtemp(prefix="anex-ssh-user-"))
    base.chmod(0o755)
    own, foreign = base / "own", base / "foreign"
    own.mkdir()
    foreign.mkdir(mode=0o755)
    os.chown(own, 65534, 65534)
    yield c, own, foreign
    mesh.stop_agent(c)
    shutil.rmtree(base, ignore_errors=True)


def test_scp_and_sftp_as_the_workload_account(nodes, user_node):
    node, own, foreign = user_node
    key, _ = nodes.key(node)
    node_id, address = nodes.info(node)
    local = nodes.work / "as-user.bin"
    local.write_bytes(os.urandom(2 * 1024 * 1024 + 3))
    digest = hashlib.sha256(local.read_bytes()).hexdigest()
    up = nodes.mesh.cluster.run(["scp", *nodes.options(key), "-P", str(SSH_PORT), str(local),
                                 f"{node_id}@{address}:{own}/up.bin"], check=False, timeout=60)
    assert up.returncode == 0, up.stderr
    written = (own / "up.bin").stat()
    assert (written.st_uid, written.st_gid) == (65534, 65534)  # the workload's account, not the agent's root
    assert hashlib.sha256((own / "up.bin").read_bytes()).hexdigest() == digest
    back = nodes.work / "as-user-back.bin"
    batch = nodes.work / "as-user-batch"
    batch.write_text(f"pwd\nget {own}/up.bin {back}\n")
    down = nodes.mesh.cluster.run(["sftp", *nodes.options(key), "-P", str(SSH_PORT), "-b", str(batch),
                                   f"{node_id}@{address}"], check=False, timeout=60)
    assert down.returncode == 0, down.stderr
    assert f"Remote working directory: {os.getcwd()}" in down.stdout  # the workload's directory
    assert hashlib.sha256(back.read_bytes()).hexdigest() == digest
    refused = nodes.mesh.cluster.run(["scp", *nodes.options(key), "-P", str(SSH_PORT), str(local),
                                      f"{node_id}@{address}:{foreign}/up.bin"], check=False, timeout=60)
    assert refused.returncode != 0 and "Permission denied" in refused.stderr, (refused.stdout, refused.stderr)
    assert not (foreign / "up.bin").exists()
    assert nodes.ssh(node, key, "id -u").stdout.strip() == "65534"
