"""The demo's Kubernetes rows: the example pod of the user guide on a rented machine, through a real control plane.

Where the control-plane programs are there (:func:`skip_reason` is ``None``), the demo starts
:class:`~anex_agent.testing.kube.ControlPlane` (:func:`start_control_plane`, on a thread of its
own while the mesh is checked), and :func:`kubernetes_checks` then wires the rest the way a
cluster has it:

* the coordinator, in the gateway namespace, reached from this host's namespace through a
  Unix socket bridged by ``socat`` (as in the virtual node's integration tests);
* ``anex-agent virtual-node`` with a token of its own ServiceAccount (``deploy/namespace.yaml``,
  ``rbac.yaml``, ``kubelet-rbac.yaml``, ``kubectl create token``), never as cluster admin; the
  admin token of the coordinator in its environment, never argv; its kubelet port on an
  address of ``lo`` (198.18.x.y: the API server's node proxy refuses loopback addresses),
  serving a certificate of the cluster CA, letting in clients of the cluster CA;
* a veth from this host's namespace to the mesh's cluster namespace (masqueraded there) and a
  /32 route to the pod's mesh address: the virtual node's way to the machine's SSH server,
  which ``kubectl exec`` goes through.

Then ``kubectl apply`` of :data:`EXAMPLE_POD` (the example pod of docs/kubernetes.md, its
annotations and scheduling fields unchanged; ``restartPolicy: Never``; its command replaced by one
that prints :data:`POD_LINE` and waits, at most :data:`POD_BOUND` seconds, for the ``exec`` check to end
it) and the rows, each state waited for with a deadline:

* ``scheduled``  the real scheduler bound the pod to ``anex-vastai``
* ``running``    Running, its pod IP the rented machine's mesh address
* ``logs``       ``kubectl logs`` shows :data:`POD_LINE`
* ``exec``       ``kubectl exec`` runs a command on the machine; kubectl exits with its status (:data:`EXEC_STATUS`)
* ``succeeded``  the pod Succeeded (exit 0, Completed); ``kubectl delete pod`` leaves no pod and no rental
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import tempfile
import time
import urllib.request
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from anex_agent.testing.kube import ControlPlane, free_port, kube_skip_reason
from anex_agent.testing.mesh import COORDINATOR_PORT, Mesh, anex_argv, wait_until
from anex_agent.testing.netlab import unique
from anex_agent.demo.provision import SimulatedProvider

NODE = "anex-vastai"
NAMESPACE = "default"
EXAMPLE_POD = Path(__file__).with_name("example_pod.yaml")
EXAMPLE_COMMAND = 'command: ["python", "train.py"]'  # the line of EXAMPLE_POD the demo replaces
POD_NAME = "my-gpu-workload"
POD_LINE = "hello from my-gpu-workload on a rented machine"
POD_BOUND = 60  # seconds the pod waits for the exec check before it ends by itself
EXEC_STATUS = 3
EXEC_LINE = "exec ran on the rented machine"
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
MANIFESTS = ("namespace.yaml", "rbac.yaml", "kubelet-rbac.yaml")
WAIT = 90.0  # seconds for each state of the pod (a rental boots an agent in a namespace)
CHECKS = ("scheduled", "running", "logs", "exec", "succeeded")


def skip_reason() -> str | None:
    """Why the Kubernetes rows cannot run here (``None`` when they can)."""
    reason = kube_skip_reason()
    if reason:
        return reason
    missing = [name for name in MANIFESTS if not (DEPLOY / name).is_file()]
    if missing:
        return f"needs {', '.join(missing)} in {DEPLOY} (run the demo from a checkout of the project)"
    return None


def start_control_plane(workdir: Path, executor: ThreadPoolExecutor) -> tuple[ControlPlane, Future]:
    """A control plane in ``workdir`` and the future of its start, on ``executor``'s thread."""
    workdir.mkdir(parents=True, exist_ok=True)
    cp = ControlPlane(workdir)
    return cp, executor.submit(cp.start)


def pod_manifest(command: list[str]) -> str:
    """:data:`EXAMPLE_POD` with ``command`` instead of its ``python train.py`` and ``restartPolicy:
    Never`` (a run that ends, as a batch job's: the example names none, and Kubernetes' default,
    Always, starts it again in place), nothing else changed."""
    text = EXAMPLE_POD.read_text()
    if text.count(EXAMPLE_COMMAND) != 1 or text.count("\nspec:\n") != 1:
        raise ValueError(f"{EXAMPLE_POD} has no line {EXAMPLE_COMMAND!r} or spec: to change")
    text = text.replace("\nspec:\n", "\nspec:\n  restartPolicy: Never\n")
    return text.replace(EXAMPLE_COMMAND, f"command: {json.dumps(command)}")


class _Wiring:
    """The coordinator bridge, the Node's address, the mesh route and the virtual node; ``close`` undoes them."""

    def __init__(self, mesh: Mesh, cp: ControlPlane, workdir: Path) -> None:
        self.mesh, self.cp, self.workdir = mesh, cp, workdir
        self.procs: list[subprocess.Popen] = []
        self.undo: list[list[str]] = []
        self.log_path = workdir / "virtual-node.log"
        self.address = ""
        self.cluster_ip = ""
        self.host_end = ""

    def _ip(self, *args: str, undo: list[str] | None = None) -> None:
        subprocess.run(["ip", *args], check=True, capture_output=True)
        if undo:
            self.undo.append(["ip", *undo])

    def coordinator_url(self) -> str:
        sock = self.workdir / "coordinator.sock"
        self.mesh.gateway.popen(["socat", f"UNIX-LISTEN:{sock},fork,mode=600", f"TCP:127.0.0.1:{COORDINATOR_PORT}"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_until(sock.exists, 10, "the coordinator's socket")
        port = free_port()
        self.procs.append(subprocess.Popen(["socat", f"TCP-LISTEN:{port},bind=127.0.0.1,fork,reuseaddr",
                                            f"UNIX-CONNECT:{sock}"], stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))
        url = f"http://127.0.0.1:{port}"

        def answers() -> bool:
            with urllib.request.urlopen(f"{url}/v1/coordinator", timeout=3) as answer:
                return answer.status == 200

        wait_until(answers, 15, "the coordinator through the bridge")
        return url

    def mesh_way(self) -> None:
        """A veth to the cluster namespace, which masquerades what comes from it (see the module docstring)."""
        base = [198, 19, secrets.randbelow(250) + 1, 4 * secrets.randbelow(60)]
        host_ip = ".".join(map(str, base[:3] + [base[3] + 1]))
        self.cluster_ip = ".".join(map(str, base[:3] + [base[3] + 2]))
        self.host_end, cluster_end = unique("anxdh"), unique("anxdc")
        self._ip("link", "add", self.host_end, "type", "veth", "peer", "name", cluster_end,
                 undo=["link", "del", self.host_end])
        self._ip("link", "set", cluster_end, "netns", self.mesh.cluster.name)
        self._ip("addr", "add", f"{host_ip}/30", "dev", self.host_end)
        self._ip("link", "set", self.host_end, "up")
        cluster = self.mesh.cluster
        cluster.run(["ip", "addr", "add", f"{self.cluster_ip}/30", "dev", cluster_end])
        cluster.run(["ip", "link", "set", cluster_end, "up"])
        cluster.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
        cluster.run(["nft", f"add table ip anexdemo; add chain ip anexdemo post {{ type nat hook postrouting "
                            f"priority 100; }}; add rule ip anexdemo post ip saddr {host_ip} masquerade"])

    def route_to(self, address: str) -> None:
        self._ip("route", "add", f"{address}/32", "via", self.cluster_ip, "dev", self.host_end,
                 undo=["route", "del", f"{address}/32", "via", self.cluster_ip])

    def start_virtual_node(self, url: str) -> None:
        cp = self.cp
        cp.kubectl("apply", *(x for name in MANIFESTS for x in ("-f", str(DEPLOY / name))))
        kubeconfig = cp.service_account_kubeconfig(self.workdir / "virtual-node.kubeconfig", "anex-system",
                                                   "anex-virtual-node", duration="1h")
        self.address = f"198.18.{secrets.randbelow(250) + 1}.{secrets.randbelow(250) + 2}"
        self._ip("addr", "add", f"{self.address}/32", "dev", "lo", undo=["addr", "del", f"{self.address}/32", "dev", "lo"])
        cert, key = cp.issue_cert("kubelet-serving", f"system:node:{NODE}", ["system:nodes"], ips=[self.address],
                                  server=True, client=False)
        env = {k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}
        env["ANEX_ADMIN_TOKEN"] = self.mesh.admin_token  # the environment, never argv
        with open(self.log_path, "ab", buffering=0) as log:
            self.vn = subprocess.Popen(
                [*anex_argv(), "virtual-node", "--kubeconfig", str(kubeconfig), "--coordinator", url,
                 "--providers", "vastai", "--internal-ip", self.address, "--poll-interval", "0.5",
                 "--kubelet-port", str(free_port()), "--kubelet-address", self.address,
                 "--kubelet-client-ca-file", str(cp.ca_file), "--kubelet-tls-cert", str(cert),
                 "--kubelet-tls-key", str(key)],
                env=env, stdout=log, stderr=subprocess.STDOUT)
        self.procs.append(self.vn)

        def ready() -> bool:
            if self.vn.poll() is not None:
                raise RuntimeError(f"the virtual node exited with {self.vn.returncode}: {self.log_tail()}")
            node = cp.kubectl_json("get", "node", NODE)
            return any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", []))

        wait_until(ready, 60, f"the Node {NODE} Ready", interval=0.3)

    def log_tail(self, limit: int = 400) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:].replace("\n", " | ")
        except FileNotFoundError:
            return ""

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        for argv in reversed(self.undo):
            subprocess.run(argv, check=False, capture_output=True)


def _pod(cp: ControlPlane) -> dict | None:
    out = cp.kubectl("-n", NAMESPACE, "get", "pod", POD_NAME, "-o", "json", check=False)
    return json.loads(out.stdout) if out.returncode == 0 else None


def _wait_pod(cp: ControlPlane, predicate, what: str) -> dict:
    return wait_until(lambda: (p := _pod(cp)) is not None and predicate(p) and p, WAIT, what, interval=0.3)


def _terminated(pod: dict) -> dict:
    return ((pod["status"].get("containerStatuses") or [{}])[0].get("state") or {}).get("terminated") or {}


def kubernetes_checks(mesh: Mesh, provider: SimulatedProvider, cp: ControlPlane,
                      workdir: Path) -> tuple[list[tuple[str, bool, str]], dict]:
    """The rows of the module docstring, in order (a row that could not run fails, saying why),
    and the ``/status`` of the pod's machine's agent while it ran (``{}`` when there was none)."""
    checks: list[tuple[str, bool, str]] = []
    status: dict = {}
    wiring = _Wiring(mesh, cp, workdir)
    signal_dir = Path(tempfile.mkdtemp(prefix="anex-demo-pod-"))
    signal_dir.chmod(0o777)  # the pod's command and the exec'd one may run as another user
    done = signal_dir / "done"

    def fail_rest(why: str) -> None:
        checks.extend((name, False, why) for name in CHECKS[len(checks):])

    try:
        try:
            wiring.mesh_way()
            wiring.start_virtual_node(wiring.coordinator_url())
        except Exception as err:  # report, do not crash the table
            fail_rest(f"wiring the virtual node failed: {str(err).splitlines()[0][:160]} {wiring.log_tail(200)}")
            return checks, status
        command = ["sh", "-c", f"echo '{POD_LINE}'; i=0; while [ ! -e {done} ] && [ $i -lt {POD_BOUND * 10} ]; "
                               "do sleep 0.1; i=$((i+1)); done"]
        applied = time.monotonic()
        cp.kubectl("-n", NAMESPACE, "apply", "-f", "-", input=pod_manifest(command))
        try:
            pod = _wait_pod(cp, lambda p: p["spec"].get("nodeName"), "the pod scheduled")
            events = cp.kubectl_json("-n", NAMESPACE, "get", "events", "--field-selector",
                                     f"involvedObject.name={POD_NAME},reason=Scheduled")["items"]
            by = {(e.get("reportingComponent") or (e.get("source") or {}).get("component")) for e in events}
            ok = pod["spec"]["nodeName"] == NODE and "default-scheduler" in by
            checks.append(("scheduled", ok, f"{'/'.join(sorted(filter(None, by))) or 'no Scheduled event'}: "
                                            f"{NAMESPACE}/{POD_NAME} bound to {pod['spec']['nodeName']} in "
                                            f"{time.monotonic() - applied:.1f} s"))
            pod = _wait_pod(cp, lambda p: p["status"].get("phase") in ("Running", "Succeeded", "Failed"),
                            "the pod Running")
            provisions = (mesh.admin("GET", "/v1/provisions") or {}).get("provisions", [])
            mine = [p for p in provisions if p["name"] == f"vk-{pod['metadata']['uid']}"]
            ip = pod["status"].get("podIP")
            ok = pod["status"]["phase"] == "Running" and len(mine) == 1 and ip == mine[0].get("address")
            rental = mine[0].get("rental_id") if mine else None
            checks.append(("running", ok, f"{pod['status']['phase']} in {time.monotonic() - applied:.1f} s; "
                                          f"pod IP {ip}, the mesh address of vastai rental {rental}"))
            node = provider.nodes.get(rental or "")
            if node is not None:
                try:
                    status = node.status()
                except Exception:  # the row says what was checked without it
                    status = {}
            if ip:
                wiring.route_to(ip)

            def logged() -> str | None:
                out = cp.kubectl("-n", NAMESPACE, "logs", POD_NAME, check=False)
                return out.stdout if POD_LINE in out.stdout else None

            try:
                text = wait_until(logged, 30, "the pod's line in kubectl logs", interval=0.3)
                checks.append(("logs", True, f"kubectl logs: {text.strip().splitlines()[0]!r}"))
            except TimeoutError as err:
                checks.append(("logs", False, str(err)))
            result = cp.kubectl("-n", NAMESPACE, "exec", POD_NAME, "--", "sh", "-c",
                                f"echo {EXEC_LINE}; touch {done}; exit {EXEC_STATUS}",
                                check=False, timeout=60)
            ok = result.returncode == EXEC_STATUS and EXEC_LINE in result.stdout
            detail = (f"kubectl exec -- sh -c '...; exit {EXEC_STATUS}' exited {result.returncode}"
                      + (f", printed {result.stdout.strip()!r}" if ok else f": {result.stderr.strip()[-160:]}"))
            checks.append(("exec", ok, detail))
            done.touch()  # the pod ends now even where exec failed
            pod = _wait_pod(cp, lambda p: p["status"].get("phase") in ("Succeeded", "Failed"), "the pod Succeeded")
            end = _terminated(pod)
            ok = pod["status"]["phase"] == "Succeeded" and end.get("exitCode") == 0
            started = time.monotonic()
            cp.kubectl("-n", NAMESPACE, "delete", "pod", POD_NAME, "--wait=false")
            try:
                wait_until(lambda: _pod(cp) is None and not provider.rentals, WAIT, "the pod and its rental gone",
                           interval=0.3)
                gone = f"deleted, {len(provider.rentals)} rentals left in {time.monotonic() - started:.1f} s"
            except TimeoutError as err:
                ok, gone = False, f"{err}; rentals left: {sorted(provider.rentals)}"
            checks.append(("succeeded", ok, f"{pod['status']['phase']} (exit {end.get('exitCode')}, "
                                            f"{end.get('reason')}); {gone}"))
        except Exception as err:  # report, do not crash the table
            fail_rest(f"{str(err).splitlines()[0][:200]} {wiring.log_tail(200)}")
    finally:
        cp.kubectl("-n", NAMESPACE, "delete", "pod", POD_NAME, "--ignore-not-found", "--wait=false", check=False)
        wiring.close()
        shutil.rmtree(signal_dir, ignore_errors=True)
    return checks, status
