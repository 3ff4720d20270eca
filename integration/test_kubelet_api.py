"""The virtual node's kubelet port against a real API server, end to end.

Its own control plane (the shared fixture's controllers, the node lifecycle controller among
them, plus the CSR signer: ``kubernetes.io/kubelet-serving`` certificates are signed by the cluster CA, the
CA the API server's ``--kubelet-certificate-authority`` names), the simulated Vast.AI mesh of
:mod:`integration.test_virtual_node`, and ``anex-agent virtual-node`` with its ServiceAccount's
token, the RBAC of deploy/ (rbac.yaml and kubelet-rbac.yaml), ``--kubelet-client-ca-file`` the
cluster CA, and no serving certificate: it asks the CSR API for one, which the test approves as
admin (``kubectl certificate approve``), as an admin would.

The Node's InternalIP is an address added to this host's ``lo`` (the API server's node proxy
refuses loopback addresses such as 127.0.0.1), removed afterwards.

Checked: ``kubectl logs`` with ``--tail``, ``--timestamps``, ``--since``, ``--since-time``,
``--limit-bytes`` and ``-f`` on a pod that runs on a rented machine; ``--previous`` answered as
the kubelet answers when there is none; ``/stats/summary``, ``/metrics/resource`` and ``/pods``
through the API server's node proxy; ``kubectl top pod`` and ``kubectl top node`` through
metrics-server (a process, registered as metrics.k8s.io; skipped where ``scripts/install-tools
metrics-server`` has not built it); a user without RBAC refused by the API server itself; on the
port itself: no certificate 401, a certificate of another CA refused in the handshake, a
cluster-CA certificate of a user without RBAC 403, a ServiceAccount token with and without
``nodes/proxy``, the API server's kubelet client certificate let in.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import ssl
import subprocess
import tempfile
import urllib.error
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from anex_agent.testing.mesh import anex_argv, wait_until
from integration.kube import DEFAULT_CONTROLLERS, ControlPlane, find_program, free_port, kube_skip_reason
from integration.test_virtual_node import REPO, _apply, _wait_pod, simulated  # noqa: F401  (a fixture)

NODE = "anex-vastai"
CONTROLLERS = tuple(dict.fromkeys((*DEFAULT_CONTROLLERS, "node-lifecycle-controller",
                                   "certificatesigningrequest-signing-controller")))
TICKER = ["sh", "-c", "i=0; while true; do i=$((i+1)); echo line $i; sleep 0.5; done"]


@pytest.fixture(scope="module")
def node_address():
    """An address of this host's namespace that is not a loopback address (the API server's node
    proxy refuses those), added to ``lo`` as a /32 and removed afterwards."""
    if os.geteuid() != 0:
        pytest.skip("needs root (an address for the Node's InternalIP)")
    address = f"198.18.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 2}"
    subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", "lo"], check=True)
    try:
        yield address
    finally:
        subprocess.run(["ip", "addr", "del", f"{address}/32", "dev", "lo"], check=False)


class _ControlPlane(ControlPlane):
    """The API server routes aggregated APIs (metrics.k8s.io) to their endpoints' addresses: there
    is no kube-proxy to carry a Service's cluster IP."""

    def _popen(self, name: str, args: list[str]) -> subprocess.Popen:
        if name == "kube-apiserver":
            args = [*args, "--enable-aggregator-routing=true"]
        return super()._popen(name, args)

    def start_metrics_server(self, address: str) -> None:
        """metrics-server on ``address`` (a process, with the admin's credentials, which the kubelet
        port lets in as any client certificate of the cluster CA), registered as metrics.k8s.io."""
        port = free_port()
        self._popen("metrics-server", [
            f"--secure-port={port}", f"--bind-address={address}", f"--cert-dir={self.workdir / 'metrics-server'}",
            f"--kubeconfig={self.kubeconfig}", f"--authentication-kubeconfig={self.kubeconfig}",
            f"--authorization-kubeconfig={self.kubeconfig}", "--kubelet-preferred-address-types=InternalIP",
            "--kubelet-use-node-status-port", f"--kubelet-certificate-authority={self.ca_file}",
            "--metric-resolution=15s"])
        objects = [
            {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "metrics-server", "namespace": "kube-system"},
             "spec": {"ports": [{"name": "https", "port": 443, "targetPort": port}]}},
            {"apiVersion": "v1", "kind": "Endpoints", "metadata": {"name": "metrics-server", "namespace": "kube-system"},
             "subsets": [{"addresses": [{"ip": address}], "ports": [{"name": "https", "port": port}]}]},
            {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
             "metadata": {"name": "metrics-server-1", "namespace": "kube-system",
                          "labels": {"kubernetes.io/service-name": "metrics-server"}},
             "addressType": "IPv4", "endpoints": [{"addresses": [address], "conditions": {"ready": True}}],
             "ports": [{"name": "https", "port": port, "protocol": "TCP"}]},
            {"apiVersion": "apiregistration.k8s.io/v1", "kind": "APIService",
             "metadata": {"name": "v1beta1.metrics.k8s.io"},
             "spec": {"service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
                      "group": "metrics.k8s.io", "version": "v1beta1", "insecureSkipTLSVerify": True,
                      "groupPriorityMinimum": 100, "versionPriority": 100}}]
        self.kubectl("apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))


@pytest.fixture(scope="module")
def cluster():
    reason = kube_skip_reason()
    if reason:
        pytest.skip(reason)
    with _ControlPlane(Path(tempfile.mkdtemp(prefix="anex-kl-cp-")), controllers=CONTROLLERS) as cp:
        yield cp


@pytest.fixture(scope="module")
def kubelet(cluster, simulated, node_address):  # noqa: F811
    """The virtual node, its serving certificate approved, the Node Ready; (cp, namespace, port, log)."""
    mesh, _provider, url = simulated
    cp = cluster
    rbac = [str(REPO / "deploy" / f) for f in ("namespace.yaml", "rbac.yaml", "kubelet-rbac.yaml")]
    cp.kubectl("apply", *(x for f in rbac for x in ("-f", f)))
    workdir = Path(tempfile.mkdtemp(prefix="anex-kl-"))
    kubeconfig = cp.service_account_kubeconfig(workdir / "kubeconfig", "anex-system", "anex-virtual-node")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
    env["ANEX_ADMIN_TOKEN"] = mesh.admin_token
    log_path = workdir / "virtual-node.log"
    log = open(log_path, "ab", buffering=0)
    proc = subprocess.Popen([*anex_argv(), "virtual-node", "--kubeconfig", str(kubeconfig), "--coordinator", url,
                             "--providers", "vastai", "--internal-ip", node_address, "--poll-interval", "0.5",
                             "--kubelet-port", str(port), "--kubelet-address", node_address,
                             "--kubelet-client-ca-file", str(cp.ca_file), "--kubelet-cert-dir", str(workdir)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)

    def alive():
        assert proc.poll() is None, log_path.read_text()[-3000:]

    def pending_csr():
        alive()
        for csr in cp.kubectl_json("get", "csr", "-l", f"anex.sh/node={NODE}")["items"]:
            if not (csr.get("status") or {}).get("conditions"):
                return csr["metadata"]["name"]
        return None

    def node_ready() -> bool:
        alive()
        node = cp.kubectl_json("get", "node", NODE)
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    namespace = f"kl-{secrets.token_hex(4)}"
    try:
        name = wait_until(pending_csr, 60, "the virtual node's serving certificate request")
        csr = cp.kubectl_json("get", "csr", name)
        assert csr["spec"]["signerName"] == "kubernetes.io/kubelet-serving"
        assert csr["spec"]["username"] == "system:serviceaccount:anex-system:anex-virtual-node"
        cp.kubectl("certificate", "approve", name)
        wait_until(lambda: (workdir / f"{NODE}.crt").exists(), 60, "the signed serving certificate kept")
        wait_until(node_ready, 60, "the node anex-vastai Ready")
        cp.create_namespace(namespace)
        yield cp, namespace, node_address, port, log_path
        cp.kubectl("-n", namespace, "delete", "pods", "--all", "--wait=false")
        wait_until(lambda: not cp.kubectl_json("-n", namespace, "get", "pods")["items"], 60, "the test's pods gone")
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()


@pytest.fixture(scope="module")
def ticker(kubelet):
    """A pod printing ``line N`` twice a second on a rented machine, Running."""
    cp, namespace, _address, _port, log = kubelet
    _apply(cp, namespace, "ticker", TICKER)
    _wait_pod(cp, namespace, "ticker", lambda p: p["status"].get("phase") == "Running", "the ticker pod Running", log)
    logs = lambda *a: cp.kubectl("-n", namespace, "logs", "ticker", *a)  # noqa: E731
    wait_until(lambda: logs().stdout.count("\n") >= 3, 60, "three lines of the ticker's log")
    return cp, namespace, logs


def _numbers(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^line (\d+)$", text, re.M)]


def test_kubectl_logs_and_its_options(ticker):
    cp, namespace, logs = ticker
    everything = _numbers(logs().stdout)
    assert everything[:3] == [1, 2, 3] and everything == list(range(1, len(everything) + 1))
    assert len(logs("--tail=2").stdout.splitlines()) == 2
    assert logs("--limit-bytes=5").stdout == "line "
    stamped = logs("--timestamps", "--tail=1").stdout.strip()
    stamp, _, line = stamped.partition(" ")
    assert re.fullmatch(r"line \d+", line)
    assert abs(datetime.fromisoformat(stamp.replace("Z", "+00:00")) - datetime.now(timezone.utc)) < timedelta(minutes=5)
    assert _numbers(logs("--since=1h").stdout)[0] == 1
    # line 1 is at least 5.5 s old once line 12 is written (a line every 0.5 s or slower)
    wait_until(lambda: len(_numbers(logs().stdout)) >= 12, 60, "twelve lines of the ticker's log")
    recent = _numbers(logs("--since=2s").stdout)
    assert recent and recent[0] > 1  # not from the start
    # --since-time goes to the API server as a whole second: the first line of that second on
    stamps = [datetime.fromisoformat(row.split()[0].replace("Z", "+00:00")[:19] + "+00:00")
              for row in logs("--timestamps").stdout.splitlines()]
    second = stamps[5]
    first = next(n for n, stamp in enumerate(stamps, 1) if stamp >= second)
    assert _numbers(logs(f"--since-time={second.strftime('%Y-%m-%dT%H:%M:%SZ')}").stdout)[0] == first > 1
    previous = cp.kubectl("-n", namespace, "logs", "ticker", "--previous", check=False)
    assert previous.returncode != 0
    assert 'previous terminated container "training" in pod "ticker" not found' in previous.stderr


def test_kubectl_logs_follow_streams_new_lines(ticker):
    cp, namespace, logs = ticker
    last = _numbers(logs().stdout)[-1]
    follow = subprocess.Popen([cp._program("kubectl"), f"--kubeconfig={cp.kubeconfig}", "-n", namespace, "logs", "-f",
                               "ticker"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        seen = []
        for raw in follow.stdout:  # blocks on the open stream; the ticker writes twice a second
            seen += _numbers(raw)
            if seen and seen[-1] > last + 2:
                break
        assert seen[-1] > last + 2, follow.stderr.read() if follow.poll() is not None else seen
    finally:
        follow.terminate()
        follow.wait(30)


def _raw(cp, path: str) -> str:
    return cp.kubectl("get", "--raw", f"/api/v1/nodes/{NODE}/proxy{path}").stdout


def test_stats_metrics_and_pods_through_the_api_servers_node_proxy(ticker):
    cp, namespace, _logs = ticker

    def summary():
        doc = json.loads(_raw(cp, "/stats/summary"))
        return doc if [p for p in doc["pods"] if p["podRef"]["name"] == "ticker"] else None

    doc = wait_until(summary, 90, "the ticker's machine in /stats/summary (its telemetry)", interval=1)
    assert doc["node"]["nodeName"] == NODE
    (pod,) = [p for p in doc["pods"] if p["podRef"]["name"] == "ticker"]
    assert pod["podRef"]["namespace"] == namespace
    (container,) = pod["containers"]
    assert container["name"] == "training"
    assert container["memory"]["workingSetBytes"] > 0 and "usageNanoCores" in container["cpu"]
    text = _raw(cp, "/metrics/resource")
    assert re.search(rf'^container_memory_working_set_bytes{{container="training",namespace="{namespace}",'
                     rf'pod="ticker"}} \d+ \d+$', text, re.M)
    assert re.search(r"^node_cpu_usage_seconds_total [0-9.]+ \d+$", text, re.M)
    assert text.rstrip().endswith("scrape_error 0")
    pods = json.loads(_raw(cp, "/pods"))
    assert pods["kind"] == "PodList" and "ticker" in [p["metadata"]["name"] for p in pods["items"]]


def test_kubectl_top_through_metrics_server(ticker, kubelet):
    cp, namespace, _logs = ticker
    if find_program("metrics-server") is None:
        pytest.skip("metrics-server is not built (scripts/install-tools metrics-server)")
    _cp, _namespace, address, _port, _log = kubelet
    cp.start_metrics_server(address)

    def top(*args: str) -> str | None:
        out = cp.kubectl("top", *args, "--no-headers", check=False)
        return out.stdout if out.returncode == 0 and out.stdout.strip() else None

    try:
        pods = wait_until(lambda: top("pod", "-n", namespace), 180, "kubectl top pod (two scrapes of the port)",
                          interval=2)
    except TimeoutError as err:
        raise AssertionError(f"{err}; metrics-server: {(cp.workdir / 'metrics-server.log').read_text()[-3000:]}")
    name, cpu, memory = pods.split()[:3]
    assert name == "ticker" and re.fullmatch(r"\d+m", cpu) and re.fullmatch(r"\d+Mi", memory)
    node = wait_until(lambda: top("node", NODE), 120, "kubectl top node", interval=2)
    assert node.split()[0] == NODE


def _get(url: str, ctx: ssl.SSLContext, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
    try:
        with urllib.request.urlopen(request, context=ctx, timeout=30) as answer:
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_who_may_use_the_port_itself(kubelet):
    cp, namespace, address, port, _log = kubelet
    url = f"https://{address}:{port}/pods"

    def context(cert=None):
        ctx = ssl.create_default_context(cafile=str(cp.ca_file))  # also checks the CSR-issued serving cert
        if cert:
            ctx.load_cert_chain(str(cert[0]), str(cert[1]))
        return ctx

    assert _get(url, context()) == (401, "Unauthorized")
    status, _ = _get(url, context(cp.kubelet_client_cert))
    assert status == 200  # the API server's kubelet client certificate

    from integration.kube import Certs
    stranger = Certs(Path(tempfile.mkdtemp(prefix="anex-kl-other-ca-")), "other-ca") \
        .issue("stranger", "kube-apiserver-kubelet-client", ["system:masters"])
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _get(url, context(stranger))

    dev = cp.issue_cert("kl-dev", "kl-dev", ["kl-developers"])
    status, text = _get(url, context(dev))
    assert status == 403 and "user=kl-dev, verb=get, resource=nodes, subresource(s)=[pods proxy]" in text

    # through the API server, the same user is refused by the API server's own RBAC first
    for args in (("get", "--raw", f"/api/v1/nodes/{NODE}/proxy/pods"), ("-n", namespace, "logs", "ticker")):
        refused = cp.kubectl("--as", "kl-dev", "--as-group", "kl-developers", *args, check=False)
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower()

    cp.kubectl("-n", namespace, "create", "serviceaccount", "reader")
    reader = cp.kubectl("-n", namespace, "create", "token", "reader").stdout.strip()
    assert _get(url, context(), reader)[0] == 403
    cp.kubectl("create", "clusterrole", f"{namespace}-proxy", "--verb=get", "--resource=nodes/proxy")
    try:
        cp.kubectl("create", "clusterrolebinding", f"{namespace}-proxy", f"--clusterrole={namespace}-proxy",
                   f"--serviceaccount={namespace}:reader")
        # the denial is cached 30 s, as a kubelet caches it: wait for the allowed answer
        wait_until(lambda: _get(url, context(), reader)[0] == 200, 90, "the reader let in once granted", interval=1)
    finally:
        cp.kubectl("delete", "clusterrolebinding", f"{namespace}-proxy", "--ignore-not-found", check=False)
        cp.kubectl("delete", "clusterrole", f"{namespace}-proxy", "--ignore-not-found", check=False)
