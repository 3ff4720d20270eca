"""Benchmark: the virtual node's kubelet port through the real API server and ``kubectl``, each
figure beside the same thing done without it, in one run. Prints one JSON document.

Needs root, wireguard-go, nftables, socat and the control-plane programs. The chain is the one of
``integration/test_kubelet_streams.py``: a real control plane (:mod:`integration.kube`, with the
CSR signer), the demo mesh with the simulated Vast.AI whose rentals are node namespaces running
the real agent, ``anex-agent virtual-node`` with its ServiceAccount's token and the kubelet port
(its serving certificate through the CSR API, approved here), and a veth from this host to the
mesh's cluster namespace with a /32 route to the pod's mesh address (the way a cluster host has
through a gateway). One pod runs; its workload serves a directory over HTTP on port 8000 and
prints ``T <unix time>`` every 100 ms.

* ``exec``: ``kubectl exec POD -- true``, ``--exec-runs`` times (p50/p99); beside it, the
  reference, ``anex-agent ssh NODE -- true`` from the cluster namespace straight to the node
  (a certificate from the coordinator, then SSH over the mesh), as ``bench/bench_ssh.py`` does.
* ``port_forward``: a ``--size`` MiB (default 64) download over HTTP through ``kubectl
  port-forward`` (kubectl -> API server -> kubelet port -> the machine's SSH -> the workload),
  and the same download from this host straight to the pod's mesh address (the reference);
  ``--rounds`` interleaved, medians, and ``port_forward / direct`` (the goal is >= 0.8); the CPU
  milliseconds per forwarded MiB of the virtual node, the API server and kubectl (from /proc),
  and of every process of the machine's namespace (agent with its SSH server, wireguard-go,
  workload) per MiB of each path, to see which hop a slow figure spends in.
* ``logs_follow``: ``kubectl logs -f POD``; for each ``T`` line written after the reader
  started, the time from the workload's timestamp until the line reaches this process
  (``--log-lines`` lines, p50/p99; the goal is p99 < 1 s). Workload and reader share a clock.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import re
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_GW, COORDINATOR_PORT, Mesh, anex_argv, wait_until  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites, unique  # noqa: E402
from integration.kube import free_port, kube_skip_reason  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
NODE = "anex-vastai"
WEB_PORT = 8000
MIB = 1 << 20
WORKLOAD = ("python3 -m http.server {port} --bind 0.0.0.0 --directory {files} >/dev/null 2>&1 & "
            "exec python3 -u -c 'import time\nwhile True:\n print(\"T %.6f\" % time.time(), flush=True)\n"
            " time.sleep(0.1)'")


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {"p50_s": round(statistics.median(ordered), 4), "p99_s": round(p99, 4), "max_s": round(ordered[-1], 4),
            "n": len(ordered)}


def pod_manifest(name: str, files: Path) -> str:
    return json.dumps({
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"restartPolicy": "Never", "nodeSelector": {"node-provider": "vastai"},
                 "containers": [{"name": "main", "image": "anex/agent",
                                 "command": ["sh", "-c", WORKLOAD.format(port=WEB_PORT, files=files)]}],
                 "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vastai",
                                  "effect": "NoSchedule"}]}})


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def namespace_cpu_seconds(name: str) -> float:
    """CPU seconds of every process now in network namespace ``name``."""
    total = 0.0
    for pid in subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout.split():
        with contextlib.suppress(OSError):
            total += cpu_seconds(int(pid))
    return total


def download(url: str, size: int) -> float:
    """MiB/s of one HTTP GET of ``url`` (``size`` bytes expected)."""
    start = time.perf_counter()
    got = 0
    with urllib.request.urlopen(url, timeout=300) as answer:
        while chunk := answer.read(MIB):
            got += len(chunk)
    seconds = time.perf_counter() - start
    assert got == size, f"{url}: {got} bytes of {size}"
    return size / MIB / seconds


def simulated(stack: contextlib.ExitStack, workdir: Path):
    """The demo mesh with the simulated Vast.AI; (mesh, provider, coordinator URL from this host)."""
    from anex_agent.demo.provision import SimulatedProvider

    mesh = stack.enter_context(Mesh(workdir / "mesh"))
    provider = SimulatedProvider(mesh)
    stack.callback(provider.stop)
    mesh.build_network()
    mesh.start_coordinator(extra_env=provider.start())
    mesh.start_gateway()
    sock = workdir / "coordinator.sock"
    mesh.gateway.popen(["socat", f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:127.0.0.1:{COORDINATOR_PORT}"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_until(sock.exists, 10, "the coordinator's socket")
    port = free_port()
    bridge = subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr", f"UNIX-CONNECT:{sock}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    stack.callback(bridge.wait, 10)
    stack.callback(bridge.terminate)
    url = f"http://127.0.0.1:{port}"
    wait_until(lambda: urllib.request.urlopen(f"{url}/v1/coordinator", timeout=3).status == 200, 15,
               "the coordinator through the bridge")
    return mesh, provider, url


def node_address(stack: contextlib.ExitStack) -> str:
    """A non-loopback address of this host for the Node's InternalIP (the API server's node proxy
    refuses loopback ones), on ``lo``."""
    address = f"198.18.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 2}"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    stack.callback(subprocess.run, ["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)
    return address


def mesh_way(stack: contextlib.ExitStack, mesh: Mesh):
    """A veth from this namespace to the cluster namespace (masqueraded there); returns add_route(ip)."""
    net = f"198.19.{secrets.randbelow(250) + 1}.{4 * secrets.randbelow(60)}"
    base = [int(x) for x in net.split(".")]
    host_ip = ".".join(map(str, base[:3] + [base[3] + 1]))
    cluster_ip = ".".join(map(str, base[:3] + [base[3] + 2]))
    host_end, cluster_end = unique("anxbh"), unique("anxbc")
    subprocess.run(["ip", "link", "add", host_end, "type", "veth", "peer", "name", cluster_end], check=True)
    stack.callback(subprocess.run, ["ip", "link", "del", host_end], check=False)
    subprocess.run(["ip", "link", "set", cluster_end, "netns", mesh.cluster.name], check=True)
    subprocess.run(["ip", "addr", "add", f"{host_ip}/30", "dev", host_end], check=True)
    subprocess.run(["ip", "link", "set", host_end, "up"], check=True)
    mesh.cluster.run(["ip", "addr", "add", f"{cluster_ip}/30", "dev", cluster_end])
    mesh.cluster.run(["ip", "link", "set", cluster_end, "up"])
    mesh.cluster.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    mesh.cluster.run(["nft", f"add table ip anexbk; add chain ip anexbk post {{ type nat hook postrouting "
                             f"priority 100; }}; add rule ip anexbk post ip saddr {host_ip} masquerade"])

    def add_route(address: str) -> None:
        subprocess.run(["ip", "route", "add", f"{address}/32", "via", cluster_ip, "dev", host_end], check=True)
        stack.callback(subprocess.run, ["ip", "route", "del", f"{address}/32", "via", cluster_ip], check=False)

    return add_route


def virtual_node(stack: contextlib.ExitStack, cp, mesh: Mesh, url: str, address: str,
                 workdir: Path) -> tuple[subprocess.Popen, Path]:
    """The virtual node with its ServiceAccount's token and the kubelet port; returns (its process,
    its log's path) once the Node is Ready (its serving certificate approved)."""
    rbac = [str(ROOT / "deploy" / f) for f in ("namespace.yaml", "rbac.yaml", "kubelet-rbac.yaml")]
    cp.kubectl("apply", *(x for f in rbac for x in ("-f", f)))
    kubeconfig = cp.service_account_kubeconfig(workdir / "vn.kubeconfig", "anex-system", "anex-virtual-node")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
    env["ANEX_ADMIN_TOKEN"] = mesh.admin_token
    log_path = workdir / "virtual-node.log"
    log = stack.enter_context(open(log_path, "ab", buffering=0))
    proc = subprocess.Popen([*anex_argv(), "virtual-node", "--kubeconfig", str(kubeconfig), "--coordinator", url,
                             "--providers", "vastai", "--internal-ip", address, "--kubelet-port", str(free_port()),
                             "--kubelet-address", address, "--kubelet-client-ca-file", str(cp.ca_file),
                             "--kubelet-cert-dir", str(workdir)], env=env, stdout=log, stderr=subprocess.STDOUT)
    stack.callback(proc.wait, 30)
    stack.callback(proc.terminate)

    def pending_csr():
        assert proc.poll() is None, log_path.read_text()[-3000:]
        for csr in cp.kubectl_json("get", "csr", "-l", f"anex.sh/node={NODE}")["items"]:
            if not (csr.get("status") or {}).get("conditions"):
                return csr["metadata"]["name"]
        return None

    cp.kubectl("certificate", "approve", wait_until(pending_csr, 60, "the serving certificate request"))
    wait_until(lambda: any(c["type"] == "Ready" and c["status"] == "True" for c in
                           cp.kubectl_json("get", "node", NODE)["status"].get("conditions", [])), 60, "the Node Ready")
    return proc, log_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--exec-runs", type=int, default=30)
    parser.add_argument("--size", type=int, default=64, help="MiB per download (default 64)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--log-lines", type=int, default=100, help="followed log lines to time (default 100)")
    args = parser.parse_args()
    from integration.conftest import mesh_skip_reason

    reason = (("needs root" if os.geteuid() != 0 else None) or mesh_skip_reason()
              or missing_prerequisites("socat", "wg", "nft") or kube_skip_reason())
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    from integration.test_kubelet_api import CONTROLLERS, _ControlPlane

    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-kubelet-"))
    with contextlib.ExitStack() as stack:
        stack.callback(shutil.rmtree, workdir, ignore_errors=True)
        mesh, provider, url = simulated(stack, workdir)
        cp = stack.enter_context(_ControlPlane(workdir / "kube", controllers=CONTROLLERS))
        address = node_address(stack)
        vn, log = virtual_node(stack, cp, mesh, url, address, workdir)
        add_route = mesh_way(stack, mesh)
        files = workdir / "files"
        files.mkdir()
        files.chmod(0o777)
        workdir.chmod(0o755)
        size = args.size * MIB
        with open(files / "blob.bin", "wb") as f:
            f.write(os.urandom(size))
        namespace = cp.create_namespace(f"bench-{secrets.token_hex(3)}")
        cp.kubectl("-n", namespace, "apply", "-f", "-", input=pod_manifest("bench", files))
        stack.callback(cp.kubectl, "-n", namespace, "delete", "pod", "bench", "--wait=true", "--timeout=60s",
                       check=False, timeout=90)
        try:
            pod = wait_until(lambda: (p := cp.kubectl_json("-n", namespace, "get", "pod", "bench"))["status"].get(
                "phase") == "Running" and p, 180, "the pod Running", interval=0.3)
        except TimeoutError:
            print(log.read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
        pod_ip = pod["status"]["podIP"]
        add_route(pod_ip)
        provision = next(p for p in mesh.admin("GET", "/v1/provisions")["provisions"]
                         if p["name"] == f"vk-{pod['metadata']['uid']}")
        node_id = provision["node_id"]
        direct_url = f"http://{pod_ip}:{WEB_PORT}/blob.bin"
        wait_until(lambda: urllib.request.urlopen(direct_url.replace("blob.bin", ""), timeout=5).status == 200, 60,
                   "the workload's HTTP server over the mesh")
        kubectl = [cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", "-n", namespace]
        result = {"benchmark": "kubelet", "machine": platform.machine(), "python": platform.python_version(),
                  "cpus": os.cpu_count(), "engine": "wireguard-go"}

        def timed(argv: list[str]) -> float:
            start = time.perf_counter()
            done = subprocess.run(argv, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
            took = time.perf_counter() - start
            if done.returncode != 0:
                raise SystemExit(f"{argv[-3:]} exited {done.returncode}: {done.stderr[-500:]}")
            return took

        ssh_env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")},
                   "ANEX_COORDINATOR_URL": f"http://{CLUSTER_GW}:{COORDINATOR_PORT}",
                   "ANEX_ADMIN_TOKEN": mesh.admin_token}
        exec_s = [timed([*kubectl, "exec", "bench", "--", "true"]) for _ in range(args.exec_runs)]
        ssh_s = []
        for _ in range(args.exec_runs):
            start = time.perf_counter()
            done = mesh.cluster.run([*anex_argv(), "ssh", node_id, "--", "true"], env=ssh_env, check=False,
                                    timeout=120, stdin=subprocess.DEVNULL)
            ssh_s.append(time.perf_counter() - start)
            if done.returncode != 0:
                raise SystemExit(f"anex-agent ssh exited {done.returncode}: {done.stderr[-500:]}")
        result["exec"] = {"kubectl_exec_true": quantiles(exec_s), "anex_ssh_true": quantiles(ssh_s),
                          "kubectl_over_ssh_p50": round(statistics.median(exec_s) / statistics.median(ssh_s), 3)}

        forward = subprocess.Popen([*kubectl, "port-forward", "pod/bench", f":{WEB_PORT}"], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            match = re.search(r"127\.0\.0\.1:(\d+) -> ", forward.stdout.readline())
            assert match, forward.stderr.read() if forward.poll() is not None else "no Forwarding line"
            forwarded_url = f"http://127.0.0.1:{match.group(1)}/blob.bin"
            through, direct = [], []
            hops = {"virtual_node": vn.pid, "kube_apiserver": cp.procs["kube-apiserver"].pid,
                    "kubectl_port_forward": forward.pid}
            (machine,) = provider.nodes.values()
            cpu = dict.fromkeys(hops, 0.0)
            machine_cpu = {"direct": 0.0, "port_forward": 0.0}
            for _ in range(args.rounds):
                before = namespace_cpu_seconds(machine.ns.name)
                direct.append(download(direct_url, size))
                machine_cpu["direct"] += namespace_cpu_seconds(machine.ns.name) - before
                machine_before = namespace_cpu_seconds(machine.ns.name)
                before = {hop: cpu_seconds(pid) for hop, pid in hops.items()}
                through.append(download(forwarded_url, size))
                for hop, pid in hops.items():
                    cpu[hop] += cpu_seconds(pid) - before[hop]
                machine_cpu["port_forward"] += namespace_cpu_seconds(machine.ns.name) - machine_before
        finally:
            forward.terminate()
            forward.wait(30)
        result["port_forward"] = {
            "size_mib": args.size, "rounds": args.rounds,
            "port_forward_mib_per_s": {"median": round(statistics.median(through), 1),
                                       "runs": [round(x, 1) for x in through]},
            "direct_mesh_mib_per_s": {"median": round(statistics.median(direct), 1),
                                      "runs": [round(x, 1) for x in direct]},
            "port_forward_over_direct": round(statistics.median(through) / statistics.median(direct), 3),
            "cpu_ms_per_forwarded_mib": {hop: round(seconds * 1000 / (args.rounds * args.size), 2)
                                         for hop, seconds in cpu.items()},
            "machine_cpu_ms_per_mib": {path: round(seconds * 1000 / (args.rounds * args.size), 2)
                                       for path, seconds in machine_cpu.items()},
            "goal_ratio": 0.8}

        follow = subprocess.Popen([*kubectl, "logs", "-f", "bench"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        try:
            started, delays = time.time(), []
            for line in follow.stdout:  # blocks on the open stream; the workload writes every 100 ms
                now = time.time()
                match = re.fullmatch(r"T (\d+\.\d+)\n", line)
                if match and float(match.group(1)) > started:
                    delays.append(now - float(match.group(1)))
                    if len(delays) >= args.log_lines:
                        break
            assert len(delays) >= args.log_lines, follow.stderr.read() if follow.poll() is not None else delays
        finally:
            follow.terminate()
            follow.wait(30)
        result["logs_follow"] = {**quantiles(delays), "goal_p99_s": 1.0}
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
