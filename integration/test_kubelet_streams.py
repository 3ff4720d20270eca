"""kubectl exec, attach's cousins, port-forward and cp on a rented pod, through the real API server.

The fixtures of :mod:`integration.test_kubelet_api` (its control plane, the simulated Vast.AI
mesh, ``anex-agent virtual-node`` serving the kubelet port to the API server) and the real
``kubectl``: kubectl speaks WebSocket to the API server, which speaks SPDY to our kubelet port
(exec, cp) or tunnels kubectl's SPDY to it (port-forward); the virtual node bridges each stream
to the pod's machine through the machine's SSH server at its mesh address.

The virtual node runs in this host's namespace, which the demo mesh does not route to: a veth
to the mesh's cluster namespace (masqueraded there to the cluster address the gateway serves)
and a /32 route to the pod's mesh address give it the way a cluster host has through a
gateway. The pod's machine is a namespace of this host: its files are this host's files.

Checked, on two pods (the ``web`` fixture's parameters): one whose machine runs the agent with
NET_ADMIN (wireguard-go, UDP), and one whose machine runs it unprivileged (nobody, no
capabilities: the built-in user-space engine) with every outgoing UDP datagram dropped, so that
it reaches the mesh only through the gateway's WebSocket relay (checked in its agent's status):
``kubectl exec`` of a command exiting 7 (kubectl exits 7); ``exec -i`` piping 10 MiB through
``sha256sum``; ``exec -it`` under ``script`` seeing the local terminal's size (``stty size``);
``port-forward`` then HTTP GETs through it to ``python3 -m http.server``, the pod's workload,
bound to the machine's loopback, one of them a 6 MiB file checked by its SHA-256; ``logs -f``
showing a line the workload writes after it started; ``kubectl cp`` both ways; a killed
``kubectl exec`` leaving no process on the machine.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from anex_agent.testing.mesh import wait_until
from anex_agent.demo.provision import Boot
from anex_agent.testing.netlab import missing_prerequisites, unique
from integration.test_kubelet_api import cluster, kubelet, node_address  # noqa: F401  (fixtures)
from integration.test_virtual_node import _apply, _wait_pod, simulated  # noqa: F401  (a fixture)

WEB_PORT = 8000


@pytest.fixture(scope="module")
def mesh_way(simulated):  # noqa: F811
    """(add_route, host address): a veth from this namespace to the mesh's cluster namespace, which
    masquerades what comes from it; ``add_route(ip)`` routes one mesh address through it."""
    reason = missing_prerequisites("nft", "script", "tar")
    if reason:
        pytest.skip(reason)
    mesh, _provider, _url = simulated
    net = f"198.19.{secrets.randbelow(250) + 1}.{4 * secrets.randbelow(60)}"
    base = [int(x) for x in net.split(".")]
    host_ip = ".".join(map(str, base[:3] + [base[3] + 1]))
    cluster_ip = ".".join(map(str, base[:3] + [base[3] + 2]))
    host_end, cluster_end = unique("anxkh"), unique("anxkc")
    subprocess.run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", cluster_end], check=True)
    routes: list[str] = []
    try:
        subprocess.run(["ip", "link", "set", cluster_end, "netns", mesh.cluster.name], check=True)
        subprocess.run(["ip", "addr", "add", f"{host_ip}/30", "dev", host_end], check=True)
        subprocess.run(["ip", "link", "set", host_end, "up"], check=True)
        mesh.cluster.run(["ip", "addr", "add", f"{cluster_ip}/30", "dev", cluster_end])
        mesh.cluster.run(["ip", "link", "set", cluster_end, "up"])
        mesh.cluster.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        mesh.cluster.run(["nft", f"add table ip anexkl; add chain ip anexkl post {{ type nat hook postrouting "
                                 f"priority 100; }}; add rule ip anexkl post ip saddr {host_ip} masquerade"])

        def add_route(address: str) -> None:
            subprocess.run(["ip", "route", "add", f"{address}/32", "via", cluster_ip, "dev", host_end], check=True)
            routes.append(address)

        yield add_route
    finally:
        for address in routes:
            subprocess.run(["ip", "route", "del", f"{address}/32", "via", cluster_ip], check=False)
        subprocess.run(["ip", "link", "del", host_end], check=False)


@dataclass
class Web:
    cp: object
    namespace: str
    name: str  # the pod's
    files: Path  # the directory it serves (the machine's files are this host's)
    log: Path  # the virtual node's


CONFINED = Boot(unprivileged=True, udp_blocked=True)


@pytest.fixture(scope="module", params=["wireguard-go", "unprivileged-websocket"])
def web(request, kubelet, mesh_way, simulated):  # noqa: F811
    """A pod serving its directory over HTTP on the machine's loopback, Running, reachable; its
    machine booted as the parameter says (see the module docstring)."""
    cp, namespace, _address, _port, log = kubelet
    _mesh, provider, _url = simulated
    confined = request.param == "unprivileged-websocket"
    if confined and missing_prerequisites("setpriv"):
        pytest.skip(missing_prerequisites("setpriv"))
    files = Path(tempfile.mkdtemp(prefix=f"anex-ks-{request.param}-"))
    files.chmod(0o777)
    (files / "hello.txt").write_text("hello from the pod\n")
    name = "web" if not confined else "web-confined"
    command = ["python3", "-m", "http.server", str(WEB_PORT), "--bind", "127.0.0.1", "--directory", str(files)]

    def ours(rental) -> bool:  # this pod's rental: its command names the pod's directory
        return str(files) in " ".join(rental.command)

    if confined:  # this pod's rental boots confined; the others as before
        provider.boot_for = lambda rental: CONFINED if ours(rental) else Boot()
    try:
        _apply(cp, namespace, name, command)
        pod = _wait_pod(cp, namespace, name, lambda p: p["status"].get("phase") == "Running",
                        f"the {name} pod Running", log)
    finally:
        provider.boot_for = lambda rental: Boot()
    if confined:
        (node,) = [provider.nodes[r] for r, rental in provider.rentals.items() if ours(rental)]
        status = wait_until(lambda: (st := node.status()).get("path") == "websocket" and st, 60,
                            "the confined machine's agent on the WebSocket path")
        assert status["engine"] == "userspace", status
    mesh_way(pod["status"]["podIP"])
    yield Web(cp, namespace, name, files, log)
    shutil.rmtree(files, ignore_errors=True)


def _kubectl(cp, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", *args], capture_output=True,
                          timeout=kw.pop("timeout", 120), **kw)


def _explain(result: subprocess.CompletedProcess, log: Path) -> str:
    return f"kubectl: {result.stderr!r}; virtual node log: {log.read_text(errors='replace')[-3000:]}"


def test_kubectl_exec_exit_status_7(web):
    result = _kubectl(web.cp, "-n", web.namespace, "exec", web.name, "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert result.returncode == 7, _explain(result, web.log)
    assert result.stdout == b"out\n" and b"err\n" in result.stderr
    ok = _kubectl(web.cp, "-n", web.namespace, "exec", web.name, "--", "true")
    assert ok.returncode == 0, _explain(ok, web.log)


def test_kubectl_exec_stdin_10_mib_through_sha256sum(web):
    payload = os.urandom(10 * 1024 * 1024)
    result = _kubectl(web.cp, "-n", web.namespace, "exec", "-i", web.name, "--", "sha256sum", input=payload)
    assert result.returncode == 0, _explain(result, web.log)
    assert result.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()


def test_kubectl_exec_tty_sees_the_terminal_size(web):
    inner = " ".join([f"stty rows 33 cols 101; {web.cp._program('kubectl')} --kubeconfig={web.cp.kubeconfig}",
                      f"-n {web.namespace} exec -it {web.name} -- sh -c 'stty size; exit 4'"])
    result = subprocess.run(["script", "-qec", inner, "/dev/null"], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert "33 101" in result.stdout, _explain(result, web.log)
    assert result.returncode == 4


def test_kubectl_port_forward_then_http_through_it(web):
    blob = os.urandom(6 * 1024 * 1024 + 3)
    (web.files / "blob.bin").write_bytes(blob)
    forward = subprocess.Popen([web.cp._program("kubectl"), f"--kubeconfig={web.cp.kubeconfig}", "-n", web.namespace,
                                "port-forward", f"pod/{web.name}", f":{WEB_PORT}"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> 8000"
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8000", line)
        assert match, f"{line!r} {forward.stderr.read() if forward.poll() is not None else ''}"
        url = f"http://127.0.0.1:{match.group(1)}"
        for _ in range(3):  # each GET is a connection of its own: a new stream pair
            with urllib.request.urlopen(f"{url}/hello.txt", timeout=60) as answer:
                assert answer.read() == b"hello from the pod\n"
        with urllib.request.urlopen(f"{url}/blob.bin", timeout=120) as answer:
            assert hashlib.sha256(answer.read()).hexdigest() == hashlib.sha256(blob).hexdigest()
    finally:
        forward.terminate()
        forward.wait(30)


def test_kubectl_logs_follow_shows_a_line_written_after_it_started(web):
    """The workload (python3 -m http.server) logs each request on its stderr: a GET of a path of
    our own, made once ``logs -f`` shows what the pod wrote before, must show up in the follow."""
    marker = f"/follow-{secrets.token_hex(6)}"
    def get(path: str) -> subprocess.CompletedProcess:  # on the machine: the workload logs it (404 or not)
        return _kubectl(web.cp, "-n", web.namespace, "exec", web.name, "--", "python3", "-c",
                        f"import urllib.request as u\ntry: u.urlopen('http://127.0.0.1:{WEB_PORT}{path}')\n"
                        "except Exception: pass")

    before = get("/before")  # at least one line before the follow starts
    assert before.returncode == 0, _explain(before, web.log)
    follow = subprocess.Popen([web.cp._program("kubectl"), f"--kubeconfig={web.cp.kubeconfig}", "-n", web.namespace,
                               "logs", "-f", web.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        first = follow.stdout.readline()  # the follow is open once the old lines come
        assert first, follow.stderr.read() if follow.poll() is not None else "no line"
        asked = get(marker)
        assert asked.returncode == 0, _explain(asked, web.log)
        for line in follow.stdout:  # blocks on the open stream until the workload writes the line
            if f"GET {marker} " in line:
                break
        else:
            raise AssertionError(f"logs -f ended without {marker}: {follow.stderr.read()}")
    finally:
        follow.terminate()
        follow.wait(30)


def test_kubectl_cp_both_ways(web):
    local = Path(tempfile.mkdtemp(prefix="anex-ks-cp-"))
    try:
        up = local / "up.bin"
        up.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
        result = _kubectl(web.cp, "-n", web.namespace, "cp", str(up), f"{web.name}:{web.files}/up.bin")
        assert result.returncode == 0, _explain(result, web.log)
        assert (web.files / "up.bin").read_bytes() == up.read_bytes()  # the machine's files are this host's
        (web.files / "down.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))
        result = _kubectl(web.cp, "-n", web.namespace, "cp", f"{web.name}:{web.files}/down.bin",
                          str(local / "down.bin"))
        assert result.returncode == 0, _explain(result, web.log)
        assert (local / "down.bin").read_bytes() == (web.files / "down.bin").read_bytes()
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_a_killed_kubectl_exec_leaves_no_process_on_the_machine(web):
    marker = web.files / f"pid-{secrets.token_hex(4)}"
    exec_ = subprocess.Popen([web.cp._program("kubectl"), f"--kubeconfig={web.cp.kubeconfig}", "-n", web.namespace,
                              "exec", web.name, "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 600"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        pid = int(wait_until(lambda: marker.exists() and marker.read_text().strip(), 60, "the command's pid"))
    finally:
        exec_.kill()
        exec_.wait(30)

    def gone() -> bool:
        try:
            os.kill(pid, 0)  # the machine's processes are this host's
        except ProcessLookupError:
            return True
        return False

    wait_until(gone, 60, "the command hung up once kubectl went away")


def test_kubectl_attach_streams_the_workloads_output(kubelet, mesh_way):  # noqa: F811
    cp, namespace, _address, _port, log = kubelet
    _apply(cp, namespace, "ticker", ["sh", "-c", "i=0; while true; do i=$((i+1)); echo tick $i; sleep 0.5; done"])
    _wait_pod(cp, namespace, "ticker", lambda p: p["status"].get("phase") == "Running", "the ticker pod Running", log)
    refused = _kubectl(cp, "-n", namespace, "attach", "-i", "ticker", timeout=60, stdin=subprocess.DEVNULL)
    assert refused.returncode != 0 and b"stdin cannot be attached" in refused.stderr, _explain(refused, log)
    attach = subprocess.Popen([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", "-n", namespace, "attach",
                               "ticker"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for line in attach.stdout:  # blocks on the open stream; the ticker writes twice a second
            seen += re.findall(r"^tick (\d+)$", line, re.M)
            if len(seen) >= 3:
                break
        assert len(seen) >= 3, attach.stderr.read() if attach.poll() is not None else seen
        assert [int(n) for n in seen] == list(range(int(seen[0]), int(seen[0]) + len(seen)))  # new lines, in order
    finally:
        attach.terminate()
        attach.wait(30)
