"""Benchmark: what ``anex-agent virtual-node`` adds between a pod and its machine, against a real
control plane (:mod:`integration.kube`), in one run. Prints one JSON document.

The chain: the real kube-apiserver (etcd, scheduler, controller manager), a real coordinator
process renting from the fake Vast.AI (:mod:`anex_agent.testing.fake_providers`, every offer kept
available), and the virtual node as a process (admin kubeconfig, ``ANEX_ADMIN_TOKEN`` in its
environment, ``--poll-interval 2``, its default). Pods are made by this process through the API
with ``spec.nodeName`` already the virtual node's Node, so the scheduler is not in the figures;
a pod watch of this process notes when each status arrives. Rent and boot are not measured:
the simulated machines are played by this process (join with the boot token, then heartbeats
saying the workload runs), so the coordinator is the one a real machine would talk to.

* ``latency``: ``--pods`` pods one after the other, each split into
  ``reaction`` (the pod's create request sent until the coordinator's ``created_at`` of the
  provision named after the pod's uid: the virtual node's watch, finalizer and POST) and
  ``ready_to_running`` (the provision's ``ready_at`` until this process's watch sees the pod
  ``Running``: the provisions watch, the node's workload read, the status patch).
  p50/p99/max of each; the goal is p99 < 1 s. The pods are then deleted (and waited for).
* ``scale``: ``--scale`` pods (default 500) created at once (``--create-concurrency`` requests
  in flight), none of whose rentals ever boots: done when every pod has its provision at the
  coordinator and the status ``Pending`` with the container waiting for reason ``Booting``
  (the machine rented, not joined). Times from the first create: every pod's provision at the
  coordinator (``all_provisions_posted_s``, its list polled every second), every pod with a status
  written by the virtual node (``all_first_status_s``), every pod Pending/Booting
  (``all_pending_booting_s``: this includes the coordinator renting each one). The virtual
  node's CPU seconds (user + system, from /proc) per pod over that time and its RSS before and
  after; the coordinator's CPU seconds beside them.

Needs the control-plane programs (``scripts/install-tools kube etcd``); no root, no network
namespaces.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from anex_agent.wire import keys  # noqa: E402
from anex_agent.wire.heartbeat import ContainerState, Heartbeat, TransportStatus  # noqa: E402
from anex_agent.client.rest import CoordinatorClient  # noqa: E402
from anex_agent.errors import CoordinatorError  # noqa: E402
from anex_agent.testing.fake_providers import FakeVastAI, vast_bundle  # noqa: E402
from anex_agent.testing.mesh import anex_argv  # noqa: E402
from integration.kube import ControlPlane, free_port, kube_skip_reason  # noqa: E402

ADMIN = "anexadm_bench_virtual_node_admin_token_0123"
API_KEY = "bench-vastai-api-key"
ROOT = Path(__file__).resolve().parent.parent
NODE = "anex-vastai"


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    match = re.search(r"^VmRSS:\s+(\d+) kB", Path(f"/proc/{pid}/status").read_text(), re.M)
    return round(int(match.group(1)) / 1024, 1) if match else 0.0


def stamp(text: str | None) -> float | None:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() if text else None


def quantiles(values: list[float]) -> dict:
    ordered = sorted(values)
    p99 = ordered[min(len(ordered) - 1, max(0, round(0.99 * len(ordered)) - 1))]
    return {"p50_s": round(statistics.median(ordered), 4), "p99_s": round(p99, 4), "max_s": round(ordered[-1], 4),
            "n": len(ordered)}


def pod_manifest(name: str) -> dict:
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
            "spec": {"nodeName": NODE, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "anex/agent", "command": ["sleep", "3600"]}],
                     "tolerations": [{"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vastai",
                                      "effect": "NoSchedule"}]}}


def waiting_reason(pod: dict) -> str | None:
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")


class Bench:
    def __init__(self, cp: ControlPlane, coordinator: str, fake: FakeVastAI) -> None:
        self.cp, self.coordinator, self.fake = cp, coordinator, fake
        self.ssl = ssl.create_default_context(cafile=str(cp.ca_file))
        self.ssl.load_cert_chain(str(cp.admin_cert[0]), str(cp.admin_cert[1]))
        self.session: aiohttp.ClientSession | None = None
        self.seen: dict[str, dict[str, float]] = {}  # pod name -> {"Running"/"Booting": first time seen}
        self.changed = asyncio.Event()
        self.booted: set[str] = set()
        self.boot_machines = False

    async def kube(self, method: str, path: str, body=None) -> dict:
        assert self.session is not None
        async with self.session.request(method, self.cp.server + path, json=body, ssl=self.ssl) as r:
            data = await r.json()
            if r.status >= 400:
                raise RuntimeError(f"{method} {path}: {r.status} {data.get('message')}")
            return data

    async def provisions(self) -> dict[str, dict]:
        assert self.session is not None
        async with self.session.get(f"{self.coordinator}/v1/provisions",
                                    headers={"Authorization": f"Bearer {ADMIN}"}) as r:
            return {p["name"]: p for p in (await r.json())["provisions"]}

    async def watch(self, namespace: str) -> None:
        """Note when each pod of ``namespace`` is first seen Running, or Pending waiting Booting."""
        assert self.session is not None
        version = (await self.kube("GET", f"/api/v1/namespaces/{namespace}/pods"))["metadata"]["resourceVersion"]
        while True:
            url = (f"{self.cp.server}/api/v1/namespaces/{namespace}/pods?watch=1&allowWatchBookmarks=true"
                   f"&resourceVersion={version}&timeoutSeconds=3600")
            async with self.session.get(url, ssl=self.ssl, timeout=aiohttp.ClientTimeout(total=None)) as r:
                async for line in r.content:
                    now = time.time()
                    event = json.loads(line)
                    pod = event["object"]
                    version = pod["metadata"].get("resourceVersion", version)
                    if event["type"] not in ("ADDED", "MODIFIED"):
                        continue
                    name = pod["metadata"]["name"]
                    status = pod.get("status") or {}
                    seen = self.seen.setdefault(name, {})
                    if status.get("phase") == "Running":
                        seen.setdefault("Running", now)
                    if status.get("phase") == "Pending" and waiting_reason(pod):
                        seen.setdefault("Pending", now)
                        if waiting_reason(pod) == "Booting":
                            seen.setdefault("Booting", now)
                    self.changed.set()

    async def machine(self, env: dict) -> None:
        """What a rented machine's agent does: join with the boot token, heartbeat 'running'."""
        async with CoordinatorClient(self.coordinator) as client:
            joined = await client.join(env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                       env["ANEX_NODE_NAME"], env["ANEX_PROVIDER"])
            client.set_credential(joined.credential)
            beat = Heartbeat(status=TransportStatus(workload=ContainerState(
                state="running", started_at=datetime.now(timezone.utc))))
            try:
                while True:
                    ack = await client.heartbeat(joined.node_id, beat)
                    await asyncio.sleep(min(ack.next_heartbeat_in, 10))
            except CoordinatorError:
                return  # the pod was deleted: the node removed with its rental

    async def boot_new_rentals(self, group: asyncio.TaskGroup) -> None:
        while True:
            if self.boot_machines:
                for rental_id, rental in list(self.fake.rentals.items()):
                    if rental_id not in self.booted:
                        self.booted.add(rental_id)
                        group.create_task(self.machine(rental.env), name=f"machine-{rental_id}")
            await asyncio.sleep(0.02)

    async def until(self, predicate, what: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                raise RuntimeError(f"timed out waiting for {what}")
            try:
                await asyncio.wait_for(self.changed.wait(), min(left, 1.0))
            except TimeoutError:
                pass


async def latency(bench: Bench, namespace: str, pods: int) -> dict:
    bench.boot_machines = True
    reaction, to_running = [], []
    for i in range(pods):
        name = f"lat-{i}"
        sent = time.time()
        created = await bench.kube("POST", f"/api/v1/namespaces/{namespace}/pods", pod_manifest(name))
        await bench.until(lambda: "Running" in bench.seen.get(name, {}), f"pod {name} Running", 120)
        view = (await bench.provisions())[f"vk-{created['metadata']['uid']}"]
        reaction.append(stamp(view["created_at"]) - sent)
        to_running.append(bench.seen[name]["Running"] - stamp(view["ready_at"]))
    bench.boot_machines = False
    # delete them (the virtual node lets them go), so that the scale part measures only its own pods
    for i in range(pods):
        await bench.kube("DELETE", f"/api/v1/namespaces/{namespace}/pods/lat-{i}")
    deadline = time.monotonic() + 300
    while (await bench.kube("GET", f"/api/v1/namespaces/{namespace}/pods"))["items"]:
        if time.monotonic() > deadline:
            raise RuntimeError("the latency pods were not deleted within 300 s")
        await asyncio.sleep(0.5)
    return {"pods": pods, "reaction": quantiles(reaction), "ready_to_running": quantiles(to_running),
            "goal_p99_s": 1.0}


async def scale(bench: Bench, namespace: str, pods: int, concurrency: int, pid: int, coordinator_pid: int,
                timeout: float) -> dict:
    gate = asyncio.Semaphore(concurrency)
    uids: dict[str, str] = {}

    async def create(name: str) -> None:
        async with gate:
            uids[name] = (await bench.kube("POST", f"/api/v1/namespaces/{namespace}/pods",
                                           pod_manifest(name)))["metadata"]["uid"]

    names = [f"many-{i}" for i in range(pods)]
    posted: list[float] = []

    async def count_provisions() -> None:
        """Note when every pod has its provision at the coordinator."""
        while True:
            listed = await bench.provisions()
            if len(uids) == pods and all(f"vk-{uid}" in listed for uid in uids.values()):
                posted.append(time.monotonic())
                return
            await asyncio.sleep(1.0)

    wall0 = time.time()
    rss0, cpu0, ccpu0, t0 = rss_mib(pid), cpu_seconds(pid), cpu_seconds(coordinator_pid), time.monotonic()
    counter = asyncio.create_task(count_provisions(), name="count-provisions")
    await asyncio.gather(*(create(n) for n in names))
    created_s = time.monotonic() - t0
    await bench.until(lambda: all("Pending" in bench.seen.get(n, {}) for n in names), f"{pods} pods Pending", timeout)
    first_status_s = max(bench.seen[n]["Pending"] for n in names) - wall0
    await bench.until(lambda: all("Booting" in bench.seen.get(n, {}) for n in names), f"{pods} pods Pending/Booting",
                      timeout)
    cpu1, ccpu1, t1, rss1 = cpu_seconds(pid), cpu_seconds(coordinator_pid), time.monotonic(), rss_mib(pid)
    await asyncio.wait_for(counter, 60)
    provisions = await bench.provisions()
    with_provision = sum(1 for n in names if f"vk-{uids[n]}" in provisions)
    listed = (await bench.kube("GET", f"/api/v1/namespaces/{namespace}/pods"))["items"]
    pending_booting = sum(1 for p in listed if p["status"].get("phase") == "Pending" and waiting_reason(p) == "Booting")
    return {"pods": pods, "created_s": round(created_s, 2),
            "all_provisions_posted_s": round(posted[0] - t0, 2),
            "all_first_status_s": round(first_status_s, 2), "all_pending_booting_s": round(t1 - t0, 2),
            "with_provision": with_provision, "pending_booting": pending_booting,
            "virtual_node_cpu_s": round(cpu1 - cpu0, 2),
            "virtual_node_cpu_ms_per_pod": round((cpu1 - cpu0) * 1000 / pods, 2),
            "coordinator_cpu_s": round(ccpu1 - ccpu0, 2),
            "virtual_node_rss_mib": {"before": rss0, "after": rss1},
            "virtual_node_rss_kib_per_pod": round((rss1 - rss0) * 1024 / pods, 1)}


async def run(args: argparse.Namespace, cp: ControlPlane, coordinator: str, fake: FakeVastAI, pid: int,
              coordinator_pid: int) -> dict:
    out: dict = {}
    async with aiohttp.ClientSession() as session:
        bench = Bench(cp, coordinator, fake)
        bench.session = session
        await bench_until_node_ready(bench)
        for namespace in ("bench-latency", "bench-scale"):
            cp.create_namespace(namespace)
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(bench.watch("bench-latency"), name="watch-latency")
                group.create_task(bench.watch("bench-scale"), name="watch-scale")
                group.create_task(bench.boot_new_rentals(group), name="boot-rentals")
                out["latency"] = await latency(bench, "bench-latency", args.pods)
                out["scale"] = await scale(bench, "bench-scale", args.scale, args.create_concurrency, pid,
                                           coordinator_pid, args.scale_timeout)
                raise _Done
        except* _Done:
            pass
    return out


class _Done(Exception):
    """Ends the task group once the figures are in."""


async def bench_until_node_ready(bench: Bench) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            node = await bench.kube("GET", f"/api/v1/nodes/{NODE}")
            if any(c["type"] == "Ready" and c["status"] == "True" for c in node["status"].get("conditions", [])):
                return
        except RuntimeError:
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the Node {NODE} did not become Ready")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=30, help="pods for the latency split, one after the other")
    parser.add_argument("--scale", type=int, default=500, help="pods created at once on the one virtual node")
    parser.add_argument("--create-concurrency", type=int, default=20, help="pod create requests in flight")
    parser.add_argument("--scale-timeout", type=float, default=900, help="seconds for every pod to be Pending/Booting")
    args = parser.parse_args()
    reason = kube_skip_reason()
    if reason:
        print(json.dumps({"skipped": reason}))
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-vn-"))
    result = asyncio.run(bench_main(args, workdir))
    print(json.dumps({"benchmark": "virtual_node", "machine": platform.machine(), "python": platform.python_version(),
                      "cpus": os.cpu_count(), **result}, indent=2))
    return 0


async def bench_main(args: argparse.Namespace, workdir: Path) -> dict:
    fake = FakeVastAI(api_key=API_KEY, exclusive=False,
                      bundles=[vast_bundle(6000 + i, price=round(0.3 + 0.01 * i, 2)) for i in range(20)])
    await fake.start()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}, "ANEX_ADMIN_TOKEN": ADMIN,
           "PYTHONPATH": str(ROOT)}
    procs: list[subprocess.Popen] = []
    cp = ControlPlane(workdir / "kube")
    try:
        await asyncio.to_thread(cp.start)
        coordinator = subprocess.Popen(
            [*anex_argv(), "coordinator", "--listen", "127.0.0.1:0", "--state-dir", str(workdir / "state")],
            env={**env, "ANEX_VASTAI_URL": fake.url, "ANEX_VASTAI_API_KEY": API_KEY,
                 "ANEX_PROVISION_COORDINATOR_URL": "http://coordinator.invalid"},
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        procs.append(coordinator)
        line = await asyncio.to_thread(coordinator.stdout.readline) if coordinator.stdout else ""
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise SystemExit(f"the coordinator did not start: {line!r}")
        log = open(workdir / "virtual-node.log", "ab", buffering=0)
        vn = subprocess.Popen([*anex_argv(), "virtual-node", "--kubeconfig", str(cp.kubeconfig), "--coordinator",
                               match.group(1), "--providers", "vastai", "--internal-ip", "192.0.2.10",
                               "--max-pods", str(max(100, args.scale + args.pods + 10)),
                               "--kubelet-port", str(free_port()), "--kubelet-address", "127.0.0.1"],
                              env=env, stdout=log, stderr=subprocess.STDOUT)
        procs.append(vn)
        try:
            return await run(args, cp, match.group(1), fake, vn.pid, coordinator.pid)
        except BaseException:
            print((workdir / "virtual-node.log").read_text(errors="replace")[-3000:], file=sys.stderr)
            raise
    finally:
        for proc in reversed(procs):
            proc.terminate()
            await asyncio.to_thread(proc.wait, 30)
        await asyncio.to_thread(cp.close)
        await fake.close()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
