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

Checked: ``kubectl exec`` of a command exiting 7 (kubectl exits 7); ``exec -i`` piping 10 MiB
through ``sha256sum``; ``exec -it`` under ``script`` seeing the local terminal's size
(``stty size``); ``port-forward`` then an HTTP GET through it to ``python3 -m http.server``,
the pod's workload, bound to the machine's loopback; ``kubectl cp`` both ways.
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
from pathlib import Path

import pytest

from anex_agent.testing.mesh import wait_until
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


@pytest.fixture(scope="module")
def web(kubelet, mesh_way):  # noqa: F811
    """A pod serving its directory over HTTP on the machine's loopback, Running, reachable."""
    cp, namespace, _address, _port, log = kubelet
    files = Path(tempfile.mkdtemp(prefix="anex-ks-files-"))
    files.chmod(0o777)
    (files / "hello.txt").write_text("hello from the pod\n")
    _apply(cp, namespace, "web", ["python3", "-m", "http.server", str(WEB_PORT), "--bind", "127.0.0.1",
                                  "--directory", str(files)])
    pod = _wait_pod(cp, namespace, "web", lambda p: p["status"].get("phase") == "Running", "the web pod Running", log)
    mesh_way(pod["status"]["podIP"])
    yield cp, namespace, files, log
    shutil.rmtree(files, ignore_errors=True)


def _kubectl(cp, *args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", *args], capture_output=True,
                          timeout=kw.pop("timeout", 120), **kw)


def _explain(result: subprocess.CompletedProcess, log: Path) -> str:
    return f"kubectl: {result.stderr!r}; virtual node log: {log.read_text(errors='replace')[-3000:]}"


def test_kubectl_exec_exit_status_7(web):
    cp, namespace, _files, log = web
    result = _kubectl(cp, "-n", namespace, "exec", "web", "--", "sh", "-c", "echo out; echo err >&2; exit 7")
    assert result.returncode == 7, _explain(result, log)
    assert result.stdout == b"out\n" and b"err\n" in result.stderr
    ok = _kubectl(cp, "-n", namespace, "exec", "web", "--", "true")
    assert ok.returncode == 0, _explain(ok, log)


def test_kubectl_exec_stdin_10_mib_through_sha256sum(web):
    cp, namespace, _files, log = web
    payload = os.urandom(10 * 1024 * 1024)
    result = _kubectl(cp, "-n", namespace, "exec", "-i", "web", "--", "sha256sum", input=payload)
    assert result.returncode == 0, _explain(result, log)
    assert result.stdout.split()[0].decode() == hashlib.sha256(payload).hexdigest()


def test_kubectl_exec_tty_sees_the_terminal_size(web):
    cp, namespace, _files, log = web
    inner = " ".join([f"stty rows 33 cols 101; {cp._program('kubectl')} --kubeconfig={cp.kubeconfig}",
                      f"-n {namespace} exec -it web -- sh -c 'stty size; exit 4'"])
    result = subprocess.run(["script", "-qec", inner, "/dev/null"], capture_output=True, text=True, timeout=120,
                            stdin=subprocess.DEVNULL)
    assert "33 101" in result.stdout, _explain(result, log)
    assert result.returncode == 4


def test_kubectl_port_forward_then_http_through_it(web):
    cp, namespace, _files, log = web
    forward = subprocess.Popen([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", "-n", namespace,
                                "port-forward", "pod/web", f":{WEB_PORT}"], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    try:
        line = forward.stdout.readline()  # "Forwarding from 127.0.0.1:NNNNN -> 8000"
        match = re.search(r"127\.0\.0\.1:(\d+) -> 8000", line)
        assert match, f"{line!r} {forward.stderr.read() if forward.poll() is not None else ''}"
        url = f"http://127.0.0.1:{match.group(1)}/hello.txt"
        for _ in range(3):  # each GET is a connection of its own: a new stream pair
            with urllib.request.urlopen(url, timeout=60) as answer:
                assert answer.read() == b"hello from the pod\n"
    finally:
        forward.terminate()
        forward.wait(30)


def test_kubectl_cp_both_ways(web):
    cp, namespace, files, log = web
    local = Path(tempfile.mkdtemp(prefix="anex-ks-cp-"))
    try:
        up = local / "up.bin"
        up.write_bytes(os.urandom(3 * 1024 * 1024 + 17))
        result = _kubectl(cp, "-n", namespace, "cp", str(up), f"web:{files}/up.bin")
        assert result.returncode == 0, _explain(result, log)
        assert (files / "up.bin").read_bytes() == up.read_bytes()  # the machine's files are this host's
        (files / "down.bin").write_bytes(os.urandom(2 * 1024 * 1024 + 5))
        result = _kubectl(cp, "-n", namespace, "cp", f"web:{files}/down.bin", str(local / "down.bin"))
        assert result.returncode == 0, _explain(result, log)
        assert (local / "down.bin").read_bytes() == (files / "down.bin").read_bytes()
    finally:
        shutil.rmtree(local, ignore_errors=True)


def test_a_killed_kubectl_exec_leaves_no_process_on_the_machine(web):
    cp, namespace, files, log = web
    marker = files / f"pid-{secrets.token_hex(4)}"
    exec_ = subprocess.Popen([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", "-n", namespace, "exec",
                              "web", "--", "sh", "-c", f"echo $$ > {marker}; exec sleep 600"],
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
