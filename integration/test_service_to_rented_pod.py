"""A Service whose endpoint is a rented pod, reached at its cluster IP, end to end.

The fixtures of :mod:`integration.test_virtual_node` (the shared control plane, whose
controller manager runs the EndpointSlice controller; the simulated Vast.AI mesh; the virtual
node with its ServiceAccount's token), and a real ``kube-proxy`` (nftables mode) in the
gateway's network namespace, as on a cluster node that runs the gateway: it reaches the API
server through a Unix socket bridged by ``socat`` and authenticates as ``system:kube-proxy``
(the ``system:node-proxier`` role). The cluster namespace routes the Service network to the
gateway, as a cluster's nodes route the mesh network there.

Checked: a pod on ``anex-vastai`` selected by a ClusterIP Service is listed in the Service's
EndpointSlice at its mesh address (ready, serving, not terminating; its Node and the pod as
target); ``curl`` from the cluster namespace to the cluster IP gets the workload's answer
through kube-proxy's DNAT and the gateway's WireGuard hub, for a machine whose agent runs
wireguard-go and for one whose agent runs unprivileged (the built-in engine: the container's
ports are its inbound ports); the pod's readiness probe failing makes the endpoint not ready
and the cluster IP stops answering, passing again brings both back; the pod deleted, the slice
lists it as terminating (while a finalizer of the test's holds the pod) and then no more. A
Service's UDP port reaches a pod's UDP container port the same way, on both engines: two cluster
clients asking the cluster IP at once each get the answer to their own question.

The gateway routes the Service network to the mesh too: a rented pod reaches the cluster IP of
a Service whose endpoint is in the cluster (the cluster's echo service), and gets no answer
from the cluster IP of a Service whose endpoint is another rented pod (mesh to mesh stays
dropped at the gateway, after a Service's DNAT too), which the cluster reaches.
"""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import yaml

from anex_agent.demo.provision import Boot
from anex_agent.testing.mesh import CLUSTER_GW, CLUSTER_IP, HTTP_PORT, ProcessDied, wait_until
from anex_agent.testing.netlab import missing_prerequisites, stop_processes
from integration.conftest import client
from integration.kube import SERVICE_CIDR, find_program
from integration.test_virtual_node import SEED_POD, WAIT, _pod, _wait_pod, simulated, virtual_node  # noqa: F401

WEB_PORT = 8000  # the workload's port (containerPort and the Service's targetPort)
SERVICE_PORT = 80
GATEWAY_NODE = "anex-gateway"  # kube-proxy's --hostname-override: the node the gateway runs on
HOLD = "anex.sh/test-hold"  # a finalizer of the test's


@pytest.fixture(scope="module")
def kube_proxy(control_plane, simulated):  # noqa: F811
    """kube-proxy in the gateway's namespace, synced; the cluster namespace routes the Service
    network to the gateway. Yields the kube-proxy's log path."""
    reason = missing_prerequisites("curl", "socat")
    if reason:
        pytest.skip(reason)
    program = find_program("kube-proxy")
    if program is None:
        pytest.skip("needs kube-proxy (build it with scripts/install-tools kube)")
    cp = control_plane
    mesh, _provider, _url = simulated
    workdir = Path(tempfile.mkdtemp(prefix="anex-kp-"))
    name = f"kube-proxy-{secrets.token_hex(3)}"
    cert, key = cp.issue_cert(name, "system:kube-proxy")  # bound to system:node-proxier by the API server
    kubeconfig = cp.write_kubeconfig(workdir / "kubeconfig", cert, key)
    port = cp.server.rsplit(":", 1)[1]
    sock = workdir / "apiserver.sock"
    procs: list[subprocess.Popen] = []
    log_path = workdir / "kube-proxy.log"
    try:
        # the API server, from the gateway's namespace: at the same 127.0.0.1:PORT (the kubeconfig and
        # the serving certificate's 127.0.0.1 hold there too), through a Unix socket
        procs.append(subprocess.Popen(["socat", f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:127.0.0.1:{port}"],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        wait_until(sock.exists, 10, "the API server's socket")
        procs.append(mesh.gateway.popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                                         f"UNIX-CONNECT:{sock}"], stdout=subprocess.DEVNULL,
                                        stderr=subprocess.DEVNULL))
        mesh.cluster.run(["ip", "route", "add", SERVICE_CIDR, "via", CLUSTER_GW])
        # the gateway routes the Service network to the mesh too: rented pods may call cluster IPs
        mesh.stop_gateway()
        mesh.gateway_routes.append(SERVICE_CIDR)
        mesh.start_gateway()
        # kube-proxy serves its node's proxy (its /healthz says so only once that Node exists): the
        # gateway's host as a cluster node, without a kubelet here, so tainted against any pod
        cp.kubectl("apply", "-f", "-", input=json.dumps(
            {"apiVersion": "v1", "kind": "Node", "metadata": {"name": GATEWAY_NODE},
             "spec": {"taints": [{"key": "anex.sh/test-gateway", "value": "true", "effect": "NoSchedule"}]}}))
        with open(log_path, "ab", buffering=0) as log:
            proxy = mesh.gateway.popen([
                program, f"--kubeconfig={kubeconfig}", "--proxy-mode=nftables",
                f"--hostname-override={GATEWAY_NODE}", f"--bind-address={CLUSTER_GW}",
                "--healthz-bind-address=127.0.0.1:10256", "--metrics-bind-address=127.0.0.1:10249",
                # the namespace's conntrack settings stay as they are (the table's size is the host's)
                "--conntrack-max-per-core=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0"], stdout=log, stderr=subprocess.STDOUT)
        procs.append(proxy)

        def synced() -> bool:
            if proxy.poll() is not None:
                raise ProcessDied(f"kube-proxy exited with {proxy.returncode}")
            out = mesh.gateway.run(["curl", "-s", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "3",
                                    "http://127.0.0.1:10256/healthz"], check=False)
            return out.stdout.strip() == "200"

        try:
            wait_until(synced, WAIT, "kube-proxy synced (its /healthz)", interval=0.3)
        except (ProcessDied, TimeoutError) as err:
            raise AssertionError(f"{err}: {log_path.read_text(errors='replace')[-3000:]}") from None
        yield log_path
    finally:
        stop_processes(list(reversed(procs)))
        cp.kubectl("delete", "node", GATEWAY_NODE, "--ignore-not-found", "--wait=false", check=False)
        mesh.cluster.run(["ip", "route", "del", SERVICE_CIDR, "via", CLUSTER_GW], check=False)
        shutil.rmtree(workdir, ignore_errors=True)


def _web_pod(name: str, label: str, files: Path, flag: Path) -> dict:
    """The seed's pod serving ``files`` on :data:`WEB_PORT`, ready while ``flag`` exists."""
    pod = yaml.safe_load(SEED_POD.format(name=name, extra_annotation="", command=json.dumps(
        ["python3", "-m", "http.server", str(WEB_PORT), "--bind", "0.0.0.0", "--directory", str(files)])))
    pod["metadata"]["labels"] = {"app": label}
    container = pod["spec"]["containers"][0]
    container["ports"] = [{"name": "http", "containerPort": WEB_PORT}]
    container["readinessProbe"] = {"exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 1,
                                   "failureThreshold": 1}
    return pod


def _service(name: str, label: str) -> dict:
    return {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
            "spec": {"selector": {"app": label}, "ports": [{"name": "http", "port": SERVICE_PORT,
                                                           "targetPort": WEB_PORT}]}}


def _apply_list(cp, namespace: str, items: list[dict]) -> None:
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps({"apiVersion": "v1", "kind": "List",
                                                                      "items": items}))


def _endpoints(cp, namespace: str, service: str) -> list[dict]:
    slices = cp.kubectl_json("-n", namespace, "get", "endpointslices", "-l", f"kubernetes.io/service-name={service}")
    return [e for s in slices["items"] for e in s.get("endpoints") or []]


def _wait_endpoints(cp, namespace: str, service: str, predicate, what: str, log: Path) -> list[dict]:
    try:
        return wait_until(lambda: predicate(e := _endpoints(cp, namespace, service)) and (e or [{}]), WAIT, what,
                          interval=0.3)
    except TimeoutError as err:
        raise AssertionError(f"{err}; endpoints: {_endpoints(cp, namespace, service)}; virtual node log: "
                             f"{log.read_text(errors='replace')[-3000:]}") from None


def _release(cp, namespace: str, name: str) -> None:
    """Take the test's finalizer off the pod (when it still has it)."""
    finalizers = ((_pod(cp, namespace, name) or {}).get("metadata") or {}).get("finalizers") or []
    if HOLD in finalizers:
        at = finalizers.index(HOLD)
        cp.kubectl("-n", namespace, "patch", "pod", name, "--type=json", "-p", json.dumps([
            {"op": "test", "path": f"/metadata/finalizers/{at}", "value": HOLD},
            {"op": "remove", "path": f"/metadata/finalizers/{at}"}]))


def _curl(ns, url: str) -> subprocess.CompletedProcess:
    return ns.run(["curl", "-sS", "--max-time", "5", url], check=False, timeout=30)


CONFINED = Boot(unprivileged=True)


@pytest.mark.parametrize("engine", ["wireguard-go", "unprivileged"])
def test_a_service_reaches_a_rented_pod_at_its_cluster_ip_while_it_is_ready(engine, virtual_node, simulated,
                                                                              kube_proxy):  # noqa: F811
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    if engine == "unprivileged" and missing_prerequisites("setpriv"):
        pytest.skip(missing_prerequisites("setpriv"))
    files = Path(tempfile.mkdtemp(prefix=f"anex-svc-{engine}-"))  # node namespaces share the host's files
    files.chmod(0o755)
    answer = f"served by the rented pod {secrets.token_hex(6)}\n"
    (files / "whoami.txt").write_text(answer)
    flag = files / "ready"
    flag.touch()
    name, label = f"web-{engine}", f"web-{secrets.token_hex(3)}"

    def ours(rental) -> bool:  # this pod's rental: its command names the pod's directory
        return str(files) in " ".join(rental.command)

    if engine == "unprivileged":
        provider.boot_for = lambda rental: CONFINED if ours(rental) else Boot()
    try:
        _apply_list(cp, namespace, [_web_pod(name, label, files, flag), _service(name, label)])
        running = _wait_pod(cp, namespace, name, lambda p: p["status"].get("phase") == "Running", "the pod Running",
                            log)
    finally:
        provider.boot_for = lambda rental: Boot()
    if engine == "unprivileged":
        (node,) = [provider.nodes[r] for r, rental in provider.rentals.items() if ours(rental)]
        assert wait_until(node.status, WAIT, "the confined machine's agent status")["engine"] == "userspace"
    address = running["status"]["podIP"]
    assert address.startswith("10.254.")

    [endpoint] = _wait_endpoints(cp, namespace, name, lambda e: len(e) == 1 and e[0]["conditions"].get("ready"),
                                 "the pod a ready endpoint of the Service", log)
    assert endpoint["addresses"] == [address] and endpoint["nodeName"] == "anex-vastai"
    assert endpoint["targetRef"]["kind"] == "Pod" and endpoint["targetRef"]["name"] == name
    assert endpoint["conditions"] == {"ready": True, "serving": True, "terminating": False}
    cluster_ip = cp.kubectl_json("-n", namespace, "get", "service", name)["spec"]["clusterIP"]
    url = f"http://{cluster_ip}:{SERVICE_PORT}/whoami.txt"

    def answers() -> bool:
        return _curl(mesh.cluster, url).stdout == answer

    wait_until(answers, WAIT, f"curl {url} from the cluster answered by the pod (kube-proxy: {kube_proxy})",
               interval=0.5)

    flag.unlink()  # its readiness probe fails: out of the Service
    [endpoint] = _wait_endpoints(cp, namespace, name, lambda e: len(e) == 1 and e[0]["conditions"]["ready"] is False,
                                 "the endpoint not ready", log)
    assert endpoint["addresses"] == [address] and endpoint["conditions"]["serving"] is False
    wait_until(lambda: _curl(mesh.cluster, url).returncode != 0, WAIT, "the cluster IP refusing (no ready endpoint)",
               interval=0.5)
    flag.touch()
    _wait_endpoints(cp, namespace, name, lambda e: len(e) == 1 and e[0]["conditions"].get("ready"),
                    "the endpoint ready again", log)
    wait_until(answers, WAIT, "the cluster IP answered by the pod again", interval=0.5)

    # a finalizer of the test's holds the deleted pod (the virtual node's own goes once the machine is released)
    cp.kubectl("-n", namespace, "patch", "pod", name, "--type=json", "-p",
               json.dumps([{"op": "add", "path": "/metadata/finalizers/-", "value": HOLD}]))
    try:
        cp.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
        [endpoint] = _wait_endpoints(cp, namespace, name,
                                     lambda e: len(e) == 1 and e[0]["conditions"].get("terminating"),
                                     "the endpoint terminating", log)
        assert endpoint["addresses"] == [address] and endpoint["conditions"]["ready"] is False
        wait_until(lambda: (_pod(cp, namespace, name) or {}).get("metadata", {}).get("finalizers") == [HOLD], WAIT,
                   "the virtual node's finalizer removed (the machine released)", interval=0.3)
    finally:
        _release(cp, namespace, name)
    _wait_endpoints(cp, namespace, name, lambda e: not e, "the pod gone from the Service's endpoints", log)
    wait_until(lambda: _pod(cp, namespace, name) is None, WAIT, "the pod gone", interval=0.3)
    cp.kubectl("-n", namespace, "delete", "service", name)
    shutil.rmtree(files, ignore_errors=True)


UDP_PORT, UDP_SERVICE_PORT = 5300, 53
#: the workload of the UDP pod: answers each datagram with "pod <datagram>" (standard library only)
UDP_ECHO = ("import socket\ns = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            f"s.bind(('0.0.0.0', {UDP_PORT}))\n"
            "while True:\n    data, peer = s.recvfrom(65535)\n    s.sendto(b'pod ' + data, peer)\n")


@pytest.mark.parametrize("engine", ["wireguard-go", "unprivileged"])
def test_a_services_udp_port_reaches_a_rented_pod(engine, virtual_node, simulated, kube_proxy):  # noqa: F811
    """A pod's UDP container port (the virtual node passes it as ANEX_INBOUND_PORTS' PORT/udp) behind
    a Service's UDP port: two cluster clients asking the cluster IP at once each get their own answer,
    on wireguard-go (the OS serves every port) and on the built-in engine (its stack relays the port)."""
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    if engine == "unprivileged" and missing_prerequisites("setpriv"):
        pytest.skip(missing_prerequisites("setpriv"))
    name, label = f"udp-{engine}", f"udp-{secrets.token_hex(3)}"
    pod = yaml.safe_load(SEED_POD.format(name=name, extra_annotation="", command=json.dumps(["python3", "-c",
                                                                                             UDP_ECHO])))
    pod["metadata"]["labels"] = {"app": label}
    pod["spec"]["containers"][0]["ports"] = [{"name": "echo", "containerPort": UDP_PORT, "protocol": "UDP"}]
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": name},
               "spec": {"selector": {"app": label}, "ports": [{"name": "echo", "port": UDP_SERVICE_PORT,
                                                              "targetPort": UDP_PORT, "protocol": "UDP"}]}}

    def ours(rental) -> bool:
        return UDP_ECHO in " ".join(rental.command) and rental.env.get("ANEX_INBOUND_PORTS") == f"{UDP_PORT}/udp"

    if engine == "unprivileged":
        provider.boot_for = lambda rental: CONFINED if ours(rental) else Boot()
    try:
        _apply_list(cp, namespace, [pod, service])
        running = _wait_pod(cp, namespace, name, lambda p: p["status"].get("phase") == "Running", "the pod Running",
                            log)
    finally:
        provider.boot_for = lambda rental: Boot()
    (node,) = [provider.nodes[r] for r, rental in provider.rentals.items() if ours(rental)]
    status = wait_until(node.status, WAIT, "the machine's agent status")
    assert status["engine"] == ("userspace" if engine == "unprivileged" else "wireguard-go")
    _wait_endpoints(cp, namespace, name, lambda e: len(e) == 1 and e[0]["conditions"].get("ready"),
                    "the pod a ready endpoint of the Service", log)
    assert running["status"]["podIP"].startswith("10.254.")
    cluster_ip = cp.kubectl_json("-n", namespace, "get", "service", name)["spec"]["clusterIP"]
    result = wait_until(lambda: (r := client(mesh.cluster, "udp", f"{cluster_ip}:{UDP_SERVICE_PORT}", "--clients", "2",
                                            "--timeout", "5")).get("ok") and r, WAIT,
                        f"two UDP clients answered by the pod at {cluster_ip}:{UDP_SERVICE_PORT}", interval=0.5)
    assert [r["source"] for r in result["replies"]] == [f"{cluster_ip}:{UDP_SERVICE_PORT}"] * 2
    assert all(r["reply"] == f"pod {r['sent']}" for r in result["replies"])
    cp.kubectl("-n", namespace, "delete", "pod", name, "--wait=false")
    wait_until(lambda: _pod(cp, namespace, name) is None, WAIT, "the pod gone", interval=0.3)
    cp.kubectl("-n", namespace, "delete", "service", name)


def _node_of(mesh, provider, pod: dict):
    """The node namespace (the machine) a running pod was rented as."""
    name = f"vk-{pod['metadata']['uid']}"
    [view] = [p for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"] if p["name"] == name]
    return provider.nodes[str(view["rental_id"])]


def test_a_rented_pod_reaches_a_service_in_the_cluster_but_not_one_whose_endpoint_is_another_rented_pod(
        virtual_node, simulated, kube_proxy):  # noqa: F811
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    files = Path(tempfile.mkdtemp(prefix="anex-svc-peer-"))
    files.chmod(0o755)
    (files / "whoami.txt").write_text("the other rented pod\n")
    (files / "ready").touch()
    label = f"peer-{secrets.token_hex(3)}"
    client = yaml.safe_load(SEED_POD.format(name="caller", extra_annotation="", command=json.dumps(["sleep", "3600"])))
    # a Service without a selector whose endpoint is the cluster's echo service (10.77.0.2:8080)
    in_cluster = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "in-cluster"},
                  "spec": {"ports": [{"name": "http", "port": SERVICE_PORT, "targetPort": HTTP_PORT}]}}
    in_cluster_slice = {
        "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
        "metadata": {"name": "in-cluster-1", "labels": {"kubernetes.io/service-name": "in-cluster"}},
        "addressType": "IPv4", "endpoints": [{"addresses": [CLUSTER_IP], "conditions": {"ready": True}}],
        "ports": [{"name": "http", "port": HTTP_PORT, "protocol": "TCP"}]}
    _apply_list(cp, namespace, [_web_pod("peer", label, files, files / "ready"), _service("peer", label), client,
                                in_cluster, in_cluster_slice])
    caller = _wait_pod(cp, namespace, "caller", lambda p: p["status"].get("phase") == "Running", "the caller Running",
                       log)
    _wait_endpoints(cp, namespace, "peer", lambda e: len(e) == 1 and e[0]["conditions"].get("ready"),
                    "the peer pod a ready endpoint", log)
    machine = _node_of(mesh, provider, caller).ns
    services = {name: cp.kubectl_json("-n", namespace, "get", "service", name)["spec"]["clusterIP"]
                for name in ("peer", "in-cluster")}
    peer_url = f"http://{services['peer']}:{SERVICE_PORT}/whoami.txt"
    in_cluster_url = f"http://{services['in-cluster']}:{SERVICE_PORT}/"
    # kube-proxy carries both Services: the cluster reaches the rented peer at its cluster IP
    wait_until(lambda: _curl(mesh.cluster, peer_url).stdout == "the other rented pod\n", WAIT,
               "the peer's cluster IP answering the cluster", interval=0.5)
    # the rented caller reaches a Service whose endpoint is in the cluster (through the gateway)
    answer = wait_until(lambda: (out := _curl(machine, in_cluster_url)).returncode == 0 and out.stdout, WAIT,
                        "the in-cluster Service's cluster IP answering the rented caller", interval=0.5)
    assert json.loads(answer)["service"] == "echo"
    # ... but not one whose endpoint is another rented pod: mesh to mesh is dropped, after the DNAT too
    refused = _curl(machine, peer_url)
    assert refused.returncode == 28 and not refused.stdout, refused  # 28: no answer within --max-time
    cp.kubectl("-n", namespace, "delete", "pod", "peer", "caller", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "peer") is None and _pod(cp, namespace, "caller") is None, WAIT,
               "the pods gone", interval=0.3)
    cp.kubectl("-n", namespace, "delete", "service", "peer", "in-cluster")
    shutil.rmtree(files, ignore_errors=True)
