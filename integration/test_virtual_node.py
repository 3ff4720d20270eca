"""The virtual node against a real control plane, end to end.

A real Kubernetes control plane (the ``control_plane`` fixture, :mod:`integration.kube`: etcd,
kube-apiserver, kube-scheduler, kube-controller-manager with the node lifecycle controller), the demo's mesh with the simulated
Vast.AI whose rentals are node namespaces running the real agent with the pod's command
(:class:`anex_agent.demo.provision.SimulatedProvider`), and ``anex-agent virtual-node`` as a
process with a token of its own ServiceAccount (deploy/rbac.yaml, through the TokenRequest
API: ``kubectl create token``), not as cluster admin. The coordinator, in the gateway
namespace, is reached from the host through a Unix socket bridged by ``socat``.

Checked, each state waited for with a deadline: the seed's example pod (its annotations and
scheduling fields unchanged; a short command) is scheduled by the real scheduler to
``anex-vastai``, rented, Running with the machine's mesh address as pod IP, then Succeeded
with exit code 0; ``exit 3`` gives Failed / Error / 3; ``kubectl delete pod`` of a running pod
leaves no rental and no pod; a virtual node SIGKILLed while the pod's machine is rented and
started again rents nothing more; a bad annotation fails the pod naming it, nothing rented;
50 pods applied at once (one ``kubectl apply`` of a List) all Succeeded on exactly 50 rentals,
none left afterwards; a pod whose rental vanishes at the provider Failed / ``MachineLost`` with
its Event; a virtual node whose role lacks ``patch pods/status`` says so in one line naming the
verb and resource, and keeps running; ``restartPolicy: OnFailure`` runs a failed workload again on
the same machine after the back-off (CrashLoopBackOff, restartCount 1, Succeeded, one rental); a
readiness probe run by the agent flips the pod's Ready condition both ways; a failed liveness probe
stops the container, which its ``restartPolicy: Always`` runs again on the same machine (lastState
exit code 143, restartCount counted).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

from anex_agent.testing.memcg import memory_controller
from anex_agent.testing.mesh import Mesh, anex_argv, wait_until
from anex_agent.testing.netlab import missing_prerequisites
from integration.conftest import mesh_skip_reason

REPO = Path(__file__).resolve().parent.parent
SEED_POD = """
apiVersion: v1
kind: Pod
metadata:
  name: {name}
  annotations:
    anex.sh/region: "europe"
    anex.sh/gpu-names: "RTX 4090,RTX 3090"
    anex.sh/gpu-count: "2"
    anex.sh/vram-min: "20480"
    anex.sh/cpu-min: "8"
    anex.sh/ram-min: "32768"
    anex.sh/price-max: "1.50"
    anex.sh/download-speed-min: "1000"
    vastai.anex.sh/verified-only: "true"
    vastai.anex.sh/datacenter-only: "true"{extra_annotation}
spec:
  restartPolicy: Never
  containers:
    - name: training
      image: pytorch/pytorch:latest
      command: {command}
  nodeSelector:
    node-provider: vastai
  tolerations:
    - key: "virtual-kubelet.io/provider"
      operator: "Equal"
      value: "vastai"
      effect: "NoSchedule"
    - key: "ignore-taint.cluster-autoscaler.kubernetes.io/manual-ignore"
      operator: "Equal"
      value: "true"
      effect: "NoSchedule"
"""
WAIT = 120.0  # seconds for a pod to reach a state (a rental boots an agent in a namespace)
MANY = 50  # pods applied at once
MANY_WAIT = 600.0  # seconds for all of them to succeed and be released (50 agents boot on a 2-core machine)
OFFERS = 64  # the simulated Vast.AI's offers: more than MANY, each rented once at a time


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    with urllib.request.urlopen(f"{url}/v1/coordinator", timeout=3) as answer:
        return answer.status == 200


@pytest.fixture(scope="module")
def simulated():
    """The mesh with provisioning from the simulated Vast.AI, its offers matching the seed pod's filters."""
    reason = mesh_skip_reason() or missing_prerequisites("socat", "wg")
    if reason:
        pytest.skip(reason)
    from anex_agent.testing.fake_providers import vast_bundle
    from anex_agent.demo.provision import SimulatedProvider

    workdir = Path(tempfile.mkdtemp(prefix="anex-vn-"))
    mesh = Mesh(workdir)
    provider = SimulatedProvider(mesh)
    # two GPUs, datacenter, verified, under $1.50/h: what the seed pod asks for (the pod is not changed)
    bundles = [vast_bundle(7001 + i, gpus=2, price=round(0.6 + i / 100, 2)) for i in range(OFFERS)]
    provider.fake.bundles[:] = bundles
    provider.fake.offers = {str(b["id"]) for b in bundles}
    provider.fake.machines = {str(b["id"]): b["machine_id"] for b in bundles}
    provider.fake.prices.update({str(b["id"]): b["dph_total"] for b in bundles})
    try:
        mesh.build_network()
        # MANY provisions at once race for the cheapest offers (a lost race is one attempt) and
        # their agents boot together on a small host (measured: some take over a minute from their
        # join to their first heartbeat): attempts and boot phase deadlines to spare, so that a
        # slow boot is not taken for a broken machine and rented again
        slow_host = {f"ANEX_PROVISION_DEADLINE_{phase}": "10m" for phase in ("RENT", "RUNNING", "JOIN", "HEARTBEAT",
                                                                            "WORKLOAD")}
        mesh.start_coordinator(extra_env={**provider.start(), **slow_host, "ANEX_PROVISION_BOOT_TIMEOUT": "600",
                                          "ANEX_PROVISION_MAX_ATTEMPTS": str(OFFERS)})
        mesh.start_gateway()
        sock = workdir / "coordinator.sock"  # the coordinator, from the host's namespace
        mesh.gateway.popen(["socat", f"UNIX-LISTEN:{sock},fork,mode=600", "TCP:127.0.0.1:8700"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(sock.exists, 10, "the coordinator's socket")
        port = _free_port()
        bridge = subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                                   f"UNIX-CONNECT:{sock}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: _answers(url), 15, "the coordinator through the bridge")
        yield mesh, provider, url
        bridge.terminate()
        bridge.wait(10)
    finally:
        provider.stop()
        mesh.close()


@pytest.fixture(scope="module")
def virtual_node(control_plane, simulated):
    """``anex-agent virtual-node`` with its ServiceAccount's token; the Node anex-vastai Ready."""
    mesh, _provider, url = simulated
    cp = control_plane  # its node lifecycle controller lifts the not-ready taint the API server puts on a new Node
    # another module's virtual node (this fixture, imported there) deleted anex-system without waiting
    wait_until(lambda: cp.kubectl("get", "namespace", "anex-system", "-o", "jsonpath={.status.phase}",
                                  check=False).stdout != "Terminating", WAIT, "the previous anex-system namespace gone",
               interval=0.3)
    cp.kubectl("apply", "-f", str(REPO / "deploy" / "namespace.yaml"), "-f", str(REPO / "deploy" / "rbac.yaml"))
    workdir = Path(tempfile.mkdtemp(prefix="anex-vn-kube-"))
    kubeconfig = cp.service_account_kubeconfig(workdir / "kubeconfig", "anex-system", "anex-virtual-node")
    env = _env(mesh)
    log = open(workdir / "virtual-node.log", "ab", buffering=0)
    procs: list[subprocess.Popen] = []

    def start() -> None:
        procs.append(subprocess.Popen(
            [*anex_argv(), "virtual-node", "--kubeconfig", str(kubeconfig), "--coordinator", url, "--providers",
             "vastai", "--internal-ip", "192.0.2.10", "--poll-interval", "0.5", "--volume-refresh", "1"],
            env=env, stdout=log, stderr=subprocess.STDOUT))

    def kill_and_start() -> None:
        """SIGKILL the virtual node (no clean-up of any kind) and start a fresh one."""
        procs[-1].kill()
        procs[-1].wait(10)
        start()

    start()

    def node_ready() -> bool:
        assert procs[-1].poll() is None, (workdir / "virtual-node.log").read_text()[-3000:]
        node = cp.kubectl_json("get", "node", "anex-vastai")
        return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

    namespace = f"vn-{secrets.token_hex(4)}"
    try:
        wait_until(node_ready, 60, "the node anex-vastai Ready")
        cp.kubectl("create", "namespace", namespace)
        yield cp, namespace, workdir / "virtual-node.log", kill_and_start
        # the pods carry our finalizer: the virtual node lets them go before it stops
        cp.kubectl("-n", namespace, "delete", "pods", "--all", "--wait=false")
        wait_until(lambda: not cp.kubectl_json("-n", namespace, "get", "pods")["items"], 60, "the test's pods gone")
    finally:
        procs[-1].terminate()
        procs[-1].wait(30)
        log.close()
        for args in (("delete", "namespace", namespace), ("delete", "node", "anex-vastai"),
                     ("delete", "-f", str(REPO / "deploy" / "rbac.yaml")),
                     ("delete", "-f", str(REPO / "deploy" / "namespace.yaml"))):
            cp.kubectl(*args, "--ignore-not-found", "--wait=false", check=False)


def _env(mesh) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
    env["ANEX_ADMIN_TOKEN"] = mesh.admin_token  # the environment, never argv
    return env


def _apply(cp, namespace: str, name: str, command: list[str], extra_annotation: str = "") -> None:
    cp.kubectl("-n", namespace, "apply", "-f", "-",
               input=SEED_POD.format(name=name, command=json.dumps(command), extra_annotation=extra_annotation))


def _pod(cp, namespace: str, name: str) -> dict | None:
    out = cp.kubectl("-n", namespace, "get", "pod", name, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _wait_pod(cp, namespace: str, name: str, predicate, what: str, log: Path) -> dict:
    try:
        return wait_until(lambda: (p := _pod(cp, namespace, name)) is not None and predicate(p) and p, WAIT, what,
                          interval=0.3)
    except TimeoutError as err:
        node = cp.kubectl("get", "node", "anex-vastai", "-o", "json", check=False).stdout
        raise AssertionError(f"{err}; pod: {_pod(cp, namespace, name)}; node: {node}; virtual node log: "
                             f"{log.read_text(errors='replace')[-3000:]}") from None


def _terminated(pod: dict) -> dict:
    return ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated") or {}


def test_the_seed_pod_runs_on_a_rented_machine_and_succeeds(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    _apply(cp, namespace, "seed", ["sh", "-c", "echo hello; sleep 5; exit 0"])
    running = _wait_pod(cp, namespace, "seed", lambda p: p["status"].get("phase") == "Running", "the seed pod Running",
                        log)
    assert running["spec"]["nodeName"] == "anex-vastai"  # the real scheduler chose our node
    provisions = (mesh.admin("GET", "/v1/provisions") or {})["provisions"]
    mine = [p for p in provisions if p["name"] == f"vk-{running['metadata']['uid']}"]
    assert len(mine) == 1 and running["status"]["podIP"] == mine[0]["address"]
    assert running["status"]["podIP"].startswith("10.254.")
    done = _wait_pod(cp, namespace, "seed", lambda p: p["status"].get("phase") == "Succeeded",
                     "the seed pod Succeeded", log)
    assert _terminated(done)["exitCode"] == 0 and _terminated(done)["reason"] == "Completed"
    events = cp.kubectl_json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=seed")
    assert {"Rented", "Started", "Completed"} <= {e["reason"] for e in events["items"]}
    wait_until(lambda: not provider.rentals, 60, "the machine released")


def test_exit_3_fails_the_pod_with_error_and_its_code(virtual_node):
    cp, namespace, log, _restart = virtual_node
    _apply(cp, namespace, "three", ["sh", "-c", "exit 3"])
    failed = _wait_pod(cp, namespace, "three", lambda p: p["status"].get("phase") == "Failed", "the pod Failed", log)
    assert _terminated(failed)["exitCode"] == 3 and _terminated(failed)["reason"] == "Error"


#: The machine's container memory in the OOM test: room for the agent, not for the workload's hog.
MACHINE_MEMORY = 384 << 20


@pytest.mark.skipif(memory_controller() is None,
                    reason="no writable memory controller with an OOM-kill counter here (cgroup v2, or cgroup v1 on "
                           "kernel 4.13+): the simulated machine cannot be given a memory limit")
def test_a_workload_that_outgrows_its_machines_memory_is_oomkilled(virtual_node, simulated):
    """The machine's container has a memory limit (a memory cgroup, as ``docker run --memory``
    makes); the workload grows past it and the kernel's OOM killer ends it: the pod shows what a
    kubelet shows, ``OOMKilled`` with exit code 137, read by the agent from the cgroup's counter."""
    from anex_agent.demo.provision import Boot

    cp, namespace, log, _restart = virtual_node
    _mesh, provider, _url = simulated
    tag = f"hog-{secrets.token_hex(4)}"  # in this pod's command: its rental boots with the limit
    hog = f"# {tag}\nx = []\nwhile True:\n    x.append(bytearray(1 << 20))"
    provider.boot_for = lambda rental: Boot(memory_limit=MACHINE_MEMORY) if tag in " ".join(rental.command) else Boot()
    try:
        _apply(cp, namespace, "hog", ["python3", "-c", hog])
        failed = _wait_pod(cp, namespace, "hog", lambda p: p["status"].get("phase") == "Failed", "the hog pod Failed",
                           log)
    finally:
        provider.boot_for = lambda rental: Boot()
    assert _terminated(failed)["reason"] == "OOMKilled" and _terminated(failed)["exitCode"] == 137, failed["status"]


def test_deleting_a_running_pod_leaves_no_rental_and_no_pod(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    _mesh, provider, _url = simulated
    _apply(cp, namespace, "long", ["sleep", "3600"])
    _wait_pod(cp, namespace, "long", lambda p: p["status"].get("phase") == "Running", "the long pod Running", log)
    assert provider.rentals
    cp.kubectl("-n", namespace, "delete", "pod", "long", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "long") is None, WAIT, "the pod gone", interval=0.3)
    assert not provider.rentals


def test_a_virtual_node_killed_while_renting_never_rents_twice(virtual_node, simulated):
    cp, namespace, log, kill_and_start = virtual_node
    mesh, provider, _url = simulated
    before = set(provider.rentals)
    _apply(cp, namespace, "again", ["sleep", "3600"])
    _wait_pod(cp, namespace, "again", lambda p: (p["status"].get("containerStatuses") or [{}])[0].get(
        "state", {}).get("waiting", {}).get("reason") in ("Renting", "Booting"), "the pod renting or booting", log)
    kill_and_start()  # SIGKILL: the new one finds the provision by the pod's uid
    running = _wait_pod(cp, namespace, "again", lambda p: p["status"].get("phase") == "Running",
                        "the pod Running after the restart", log)
    name = f"vk-{running['metadata']['uid']}"
    provisions = [p for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"] if p["name"] == name]
    assert len(provisions) == 1 and len(set(provider.rentals) - before) == 1
    cp.kubectl("-n", namespace, "delete", "pod", "again", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "again") is None, WAIT, "the pod gone", interval=0.3)
    assert set(provider.rentals) <= before


def test_a_bad_annotation_fails_the_pod_naming_it_and_rents_nothing(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    before = set(provider.rentals)
    _apply(cp, namespace, "typo", ["true"], extra_annotation='\n    anex.sh/gpu-cont: "1"')
    failed = _wait_pod(cp, namespace, "typo", lambda p: p["status"].get("phase") == "Failed", "the pod Failed", log)
    assert failed["status"]["reason"] == "ProvisioningRefused" and "anex.sh/gpu-cont" in failed["status"]["message"]
    names = [p["name"] for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"]]
    assert f"vk-{failed['metadata']['uid']}" not in names and set(provider.rentals) <= before


def test_the_manifests_apply_and_grant_no_more_than_the_role_needs(virtual_node):
    cp, _namespace, _log, _restart = virtual_node
    applied = cp.kubectl("apply", "-k", str(REPO / "deploy"), "--dry-run=server").stdout
    assert "deployment.apps/anex-virtual-node" in applied and "server dry run" in applied
    who = "--as=system:serviceaccount:anex-system:anex-virtual-node"

    def can(*args: str) -> bool:
        return cp.kubectl("auth", "can-i", *args, who, check=False).stdout.strip() == "yes"

    assert can("create", "nodes") and can("patch", "nodes/status") and can("watch", "pods")
    assert can("patch", "pods/status") and can("delete", "pods") and can("create", "events")
    assert can("get", "secrets") and can("update", "leases", "-n", "kube-node-lease")
    assert not can("list", "secrets") and not can("update", "leases", "-n", "default")
    assert not can("create", "pods") and not can("delete", "nodes") and not can("create", "pods/exec")


def _reasons(cp, namespace: str, name: str) -> set[str]:
    events = cp.kubectl_json("-n", namespace, "get", "events", "--field-selector", f"involvedObject.name={name}")
    return {e["reason"] for e in events["items"]}


@pytest.mark.timeout(1500)  # about 140 s on a quiet 2-core machine; several times that on a busy one
def test_fifty_pods_applied_at_once_all_succeed_on_fifty_rentals(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    _mesh, provider, _url = simulated
    made: list[str] = []  # every rental the provider made from now on (its hook runs once per rental)
    hook = provider.fake.on_rent

    async def counting(rental):
        made.append(rental.rental_id)
        await hook(rental)

    pods = []
    for n in range(MANY):
        # 20 s of work: on this loaded host an agent whose workload ended before any heartbeat of
        # its got an answer (seen with `true` and with `sleep 5`) left its provision booting: the
        # coordinator marks it ready on a heartbeat, and the agent's last one is bounded to 2 s
        pod = yaml.safe_load(SEED_POD.format(name=f"many-{n}", command=json.dumps(["sleep", "20"]),
                                             extra_annotation=""))
        pod["metadata"]["labels"] = {"batch": "many"}
        pods.append(pod)
    provider.fake.on_rent = counting
    try:
        started = time.monotonic()
        cp.kubectl("-n", namespace, "apply", "-f", "-",
                   input=json.dumps({"apiVersion": "v1", "kind": "List", "items": pods}))

        def all_succeeded() -> bool:
            items = cp.kubectl_json("-n", namespace, "get", "pods", "-l", "batch=many")["items"]
            failed = [p["metadata"]["name"] for p in items if p["status"].get("phase") == "Failed"]
            assert not failed, f"pods failed: {failed}; virtual node log: {log.read_text(errors='replace')[-3000:]}"
            return len(items) == MANY and all(p["status"].get("phase") == "Succeeded" for p in items)

        wait_until(all_succeeded, MANY_WAIT, f"the {MANY} pods Succeeded", interval=2)
        succeeded = time.monotonic() - started
        wait_until(lambda: not set(made) & set(provider.rentals), MANY_WAIT, f"the {MANY} machines released",
                   interval=1)
        released = time.monotonic() - started
    finally:
        provider.fake.on_rent = hook
    print(f"\n{MANY} pods: all Succeeded {succeeded:.1f} s after the apply, every machine released after "
          f"{released:.1f} s")
    assert len(made) == MANY and len(set(made)) == MANY
    cp.kubectl("-n", namespace, "delete", "pods", "-l", "batch=many", "--wait=false")
    wait_until(lambda: not cp.kubectl_json("-n", namespace, "get", "pods", "-l", "batch=many")["items"], WAIT,
               "the succeeded pods deleted", interval=1)
    assert len(made) == MANY  # deleting ended pods rents nothing


def test_a_pod_whose_machine_vanishes_fails_with_machine_lost_and_an_event(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    _apply(cp, namespace, "vanishing", ["sleep", "3600"])
    running = _wait_pod(cp, namespace, "vanishing", lambda p: p["status"].get("phase") == "Running",
                        "the pod Running", log)
    name = f"vk-{running['metadata']['uid']}"
    [provision] = [p for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"] if p["name"] == name]
    rental_id = str(provision["rental_id"])
    provider.fake.vanish(rental_id)  # the host reclaimed the machine: no destroy, the agent is not told
    try:
        failed = _wait_pod(cp, namespace, "vanishing", lambda p: p["status"].get("phase") == "Failed",
                           "the pod Failed", log)
        assert failed["status"]["reason"] == "MachineLost"
        waiting = failed["status"]["containerStatuses"][0]["state"]["waiting"]
        assert waiting["reason"] == "MachineLost"
        wait_until(lambda: "MachineLost" in _reasons(cp, namespace, "vanishing"), WAIT, "the MachineLost Event",
                   interval=0.5)
    finally:
        node = provider.nodes.get(rental_id)
        if node is not None:
            mesh.stop_agent(node)  # what the vanished machine still ran in its namespace


def _narrow_rbac(name: str) -> str:
    """deploy/rbac.yaml under ``name``, its ClusterRole without ``pods/status``."""
    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "rbac.yaml").read_text()) if d]
    for doc in docs:
        doc["metadata"]["name"] = name
        if doc["kind"] == "ClusterRole":
            doc["rules"] = [r for r in doc["rules"] if "pods/status" not in r["resources"]]
        if "roleRef" in doc:
            doc["roleRef"]["name"] = name
            for subject in doc["subjects"]:
                subject["name"] = name
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})


def test_a_missing_permission_is_one_line_naming_it_and_the_virtual_node_keeps_running(virtual_node, simulated):
    cp, namespace, _log, _restart = virtual_node
    mesh, provider, url = simulated
    account = f"anex-vn-narrow-{secrets.token_hex(3)}"
    manifests = _narrow_rbac(account)
    cp.kubectl("apply", "-f", "-", input=manifests)
    workdir = Path(tempfile.mkdtemp(prefix="anex-vn-narrow-"))
    log_path = workdir / "virtual-node.log"
    before = set(provider.rentals)
    kubeconfig = cp.service_account_kubeconfig(workdir / "kubeconfig", "anex-system", account)
    with open(log_path, "ab", buffering=0) as log:
        proc = subprocess.Popen(
            [*anex_argv(), "virtual-node", "--kubeconfig", str(kubeconfig), "--coordinator", url,
             "--providers", "vastai", "--node-prefix", "narrow-", "--provision-prefix", "vr-",
             "--internal-ip", "192.0.2.11", "--kubelet-address", "127.0.0.1", "--kubelet-port", str(_free_port()),
             "--poll-interval", "0.5"], env=_env(mesh), stdout=log, stderr=subprocess.STDOUT)
        try:
            # bound to its Node by name (no scheduler needed); refused by the coordinator: nothing is rented
            pod = yaml.safe_load(SEED_POD.format(name="narrow", command=json.dumps(["true"]),
                                                 extra_annotation='\n    anex.sh/gpu-cont: "1"'))
            pod["spec"]["nodeName"] = "narrow-vastai"
            cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))

            def said_forbidden() -> list[str]:  # kube.py's line for a 403 (the retries' lines quote the API)
                assert proc.poll() is None, log_path.read_text(errors="replace")[-3000:]
                return [line for line in log_path.read_text(errors="replace").splitlines()
                        if "may not" in line and "pods/status" in line]

            # the status write is retried with backoff: wait for a retry after the first refusal
            wait_until(lambda: sum("narrow: patch pods/status: 403" in line
                                   for line in log_path.read_text(errors="replace").splitlines()) >= 2, WAIT,
                       "the status write refused twice", interval=0.5)
            lines = said_forbidden()
            assert len(lines) == 1 and "may not patch pods/status" in lines[0], lines
            assert "Traceback" not in log_path.read_text(errors="replace")
            cp.kubectl("-n", namespace, "delete", "pod", "narrow", "--wait=false")  # finalizer: its virtual node's
            wait_until(lambda: _pod(cp, namespace, "narrow") is None, WAIT, "the pod gone", interval=0.3)
            assert proc.poll() is None and set(provider.rentals) <= before
        finally:
            proc.terminate()
            proc.wait(30)
            cp.kubectl("delete", "-f", "-", "--ignore-not-found", "--wait=false", input=manifests, check=False)
            cp.kubectl("delete", "node", "narrow-vastai", "--ignore-not-found", "--wait=false", check=False)


def test_on_failure_restarts_the_workload_in_place_after_a_back_off(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    _mesh, provider, _url = simulated
    marker = Path(tempfile.mkdtemp(prefix="anex-vn-restart-")) / "ran"  # node namespaces share the host's files
    made: list[str] = []
    hook = provider.fake.on_rent

    async def counting(rental):
        made.append(rental.rental_id)
        await hook(rental)

    pod = yaml.safe_load(SEED_POD.format(name="again-in-place", extra_annotation="", command=json.dumps(
        ["sh", "-c", f"if [ -e {marker} ]; then exit 0; fi; touch {marker}; exit 3"])))
    pod["spec"]["restartPolicy"] = "OnFailure"
    provider.fake.on_rent = counting
    try:
        cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
        backing_off = _wait_pod(cp, namespace, "again-in-place", lambda p: (p["status"].get("containerStatuses") or [
            {}])[0].get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff", "the pod in back-off", log)
        assert backing_off["status"]["phase"] == "Running"
        assert backing_off["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 3
        done = _wait_pod(cp, namespace, "again-in-place", lambda p: p["status"].get("phase") == "Succeeded",
                         "the pod Succeeded on its second run", log)
    finally:
        provider.fake.on_rent = hook
    assert done["status"]["containerStatuses"][0]["restartCount"] == 1 and _terminated(done)["exitCode"] == 0
    assert len(made) == 1  # one machine: the workload ran again where it was
    assert "BackOff" in _reasons(cp, namespace, "again-in-place")


def _ready(pod: dict) -> str:
    return next((c["status"] for c in pod["status"].get("conditions") or [] if c["type"] == "Ready"), "")


def _running_container(pod: dict) -> dict:
    status = (pod["status"].get("containerStatuses") or [{}])[0]
    return status if "running" in (status.get("state") or {}) else {}


def test_a_readiness_probe_run_by_the_agent_flips_the_pods_ready_condition(virtual_node):
    cp, namespace, log, _restart = virtual_node
    flag = Path(tempfile.mkdtemp(prefix="anex-vn-ready-")) / "ready"  # node namespaces share the host's files
    pod = yaml.safe_load(SEED_POD.format(name="probed", extra_annotation="", command=json.dumps(["sleep", "3600"])))
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "exec": {"command": ["test", "-e", str(flag)]}, "periodSeconds": 1, "failureThreshold": 1}
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
    unready = _wait_pod(cp, namespace, "probed", lambda p: p["status"].get("phase") == "Running" and _ready(p),
                        "the pod Running", log)
    assert _ready(unready) == "False" and _running_container(unready)["ready"] is False
    flag.touch()
    ready = _wait_pod(cp, namespace, "probed", lambda p: _ready(p) == "True", "the pod Ready once the probe passes",
                      log)
    assert _running_container(ready)["ready"] is True and ready["status"]["containerStatuses"][0]["started"] is True
    flag.unlink()
    again = _wait_pod(cp, namespace, "probed", lambda p: _ready(p) == "False", "the pod not Ready once it fails", log)
    assert _running_container(again) and again["status"]["containerStatuses"][0]["restartCount"] == 0
    wait_until(lambda: "Unhealthy" in _reasons(cp, namespace, "probed"), WAIT, "the Unhealthy Event", interval=0.5)
    cp.kubectl("-n", namespace, "delete", "pod", "probed", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "probed") is None, WAIT, "the pod gone", interval=0.3)


def test_a_failed_liveness_probe_restarts_the_container_in_place_and_counts_it(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    _mesh, provider, _url = simulated
    sick = Path(tempfile.mkdtemp(prefix="anex-vn-live-")) / "sick"
    sick.touch()  # the first run is unhealthy; the test makes it healthy once it has been restarted
    made: list[str] = []
    hook = provider.fake.on_rent

    async def counting(rental):
        made.append(rental.rental_id)
        await hook(rental)

    pod = yaml.safe_load(SEED_POD.format(name="lively", extra_annotation="", command=json.dumps(["sleep", "3600"])))
    pod["spec"]["restartPolicy"] = "Always"
    pod["spec"]["containers"][0]["livenessProbe"] = {
        "exec": {"command": ["sh", "-c", f"test ! -e {sick}"]}, "periodSeconds": 1, "failureThreshold": 2}
    provider.fake.on_rent = counting
    try:
        cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
        killed = _wait_pod(cp, namespace, "lively", lambda p: (p["status"].get("containerStatuses") or [{}])[0].get(
            "state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff", "the container killed, backing off",
                           log)
        sick.unlink()
        last = killed["status"]["containerStatuses"][0]["lastState"]["terminated"]
        running = _wait_pod(cp, namespace, "lively", lambda p: bool(_running_container(p)) and _ready(p) == "True"
                            and _running_container(p)["restartCount"] >= 1, "the container running again", log)
    finally:
        provider.fake.on_rent = hook
    assert last["exitCode"] == 143 and last["reason"] == "Error"  # stopped with SIGTERM, as a kubelet stops it
    assert running["status"]["containerStatuses"][0]["lastState"]["terminated"]["exitCode"] == 143
    assert running["status"]["phase"] == "Running" and len(made) == 1  # the same machine
    events = cp.kubectl_json("-n", namespace, "get", "events", "--field-selector", "involvedObject.name=lively")
    assert any(e["reason"] == "Unhealthy" and e["message"].startswith("Liveness probe failed")
               for e in events["items"]), [e["message"] for e in events["items"]]
    cp.kubectl("-n", namespace, "delete", "pod", "lively", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "lively") is None, WAIT, "the pod gone", interval=0.3)


def _bytes_under(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in folder.rglob("*") if p.is_file())


def test_config_map_and_secret_volumes_and_secret_variables_reach_the_machine_never_the_coordinator(
        virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    where = Path(tempfile.mkdtemp(prefix="anex-vn-files-"))  # node namespaces share the host's files
    secret_value = f"s3cret-{secrets.token_hex(8)}"
    cp.kubectl("-n", namespace, "create", "configmap", "app", "--from-literal=app.conf=threads=4",
               "--from-literal=other=x")
    cp.kubectl("-n", namespace, "create", "secret", "generic", "db", f"--from-literal=password={secret_value}",
               "--from-literal=tls.key=KEY")
    pod = yaml.safe_load(SEED_POD.format(name="files", extra_annotation="", command=json.dumps(
        ["sh", "-c", f'printf %s "$DB_PASSWORD" > {where}/seen; exec sleep 3600'])))
    container = pod["spec"]["containers"][0]
    container["env"] = [{"name": "DB_PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}}]
    container["volumeMounts"] = [{"name": "cfg", "mountPath": f"{where}/cfg"},
                                 {"name": "creds", "mountPath": f"{where}/creds", "readOnly": True}]
    pod["spec"]["volumes"] = [
        {"name": "cfg", "configMap": {"name": "app", "items": [{"key": "app.conf", "path": "conf/app.conf"}],
                                      "defaultMode": 0o640}},
        {"name": "creds", "secret": {"secretName": "db", "defaultMode": 0o400}}]
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
    running = _wait_pod(cp, namespace, "files", lambda p: p["status"].get("phase") == "Running", "the pod Running",
                        log)
    wait_until(lambda: (where / "seen").exists(), WAIT, "the workload started")
    assert (where / "seen").read_text() == secret_value  # the variable from the Secret, in its environment
    conf = where / "cfg" / "conf" / "app.conf"
    assert conf.read_text() == "threads=4" and conf.stat().st_mode & 0o777 == 0o640
    assert not (where / "cfg" / "other").exists()  # only the listed item
    key = where / "creds" / "password"
    assert key.read_text() == secret_value and key.stat().st_mode & 0o777 == 0o400
    assert (where / "creds" / "tls.key").read_text() == "KEY"
    cp.kubectl("-n", namespace, "patch", "configmap", "app", "--type", "merge", "-p",
               json.dumps({"data": {"app.conf": "threads=8"}}))
    wait_until(lambda: conf.read_text() == "threads=8", WAIT, "the changed ConfigMap's file on the machine")
    assert conf.stat().st_mode & 0o777 == 0o640
    # the value passed through the coordinator: neither its database nor the provider's rental holds it
    assert secret_value.encode() not in _bytes_under(mesh.workdir / "coordinator")
    rental = provider.rentals[str(next(p for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"]
                                       if p["name"] == f"vk-{running['metadata']['uid']}")["rental_id"])]
    assert secret_value not in json.dumps(rental.env)
    cp.kubectl("-n", namespace, "delete", "pod", "files", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "files") is None, WAIT, "the pod gone", interval=0.3)


def test_image_pull_secrets_become_the_providers_registry_login_sealed_at_the_coordinator(virtual_node, simulated):
    cp, namespace, log, _restart = virtual_node
    mesh, provider, _url = simulated
    password = f"pull-{secrets.token_hex(8)}"
    cp.kubectl("-n", namespace, "create", "secret", "docker-registry", "registry-login",
               "--docker-server=registry.example.com", "--docker-username=puller", f"--docker-password={password}")
    pod = yaml.safe_load(SEED_POD.format(name="private", extra_annotation="", command=json.dumps(["sleep", "3600"])))
    pod["spec"]["containers"][0]["image"] = "registry.example.com/acme/train:1"
    pod["spec"]["imagePullSecrets"] = [{"name": "registry-login"}]
    cp.kubectl("-n", namespace, "apply", "-f", "-", input=json.dumps(pod))
    running = _wait_pod(cp, namespace, "private", lambda p: p["status"].get("phase") == "Running", "the pod Running",
                        log)
    [view] = [p for p in (mesh.admin("GET", "/v1/provisions") or {})["provisions"]
              if p["name"] == f"vk-{running['metadata']['uid']}"]
    rental = provider.rentals[str(view["rental_id"])]
    assert rental.body["image_login"] == f"-u puller -p {password} registry.example.com"  # Vast.AI's field
    assert password not in json.dumps(view)  # never answered back
    assert password.encode() not in _bytes_under(mesh.workdir / "coordinator")  # sealed in its database
    cp.kubectl("-n", namespace, "delete", "pod", "private", "--wait=false")
    wait_until(lambda: _pod(cp, namespace, "private") is None, WAIT, "the pod gone", interval=0.3)
