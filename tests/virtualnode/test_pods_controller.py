"""The virtual node's pod controller against a real coordinator app (the provisioning loop over an
in-memory rental provider) and an in-memory API server (tests/virtualnode/fake_kube.py).

Covered: a pod becomes one provision (finalizer first), Pending while selecting and booting,
Running with the node's mesh address once its workload runs, Failed with exit code 3 and its
machine released; a pod deleted while its machine boots: the provision deleted, the finalizer
removed, the pod gone, no rental left; a bad annotation fails the pod naming it with nothing
rented; a refused spec fails at once; the metrics (pods by phase, time per phase, failures by
reason, provisions created and deleted) follow a pod through its phases; an OOMKilled workload
(exit 137, signal 9) fails its pod with reason OOMKilled and an Event; a workload the agent
restarts in place (CrashLoopBackOff, then running again) keeps its pod Running with its
restartCount and its machine; at start, a provision of ours whose pod is gone is deleted
and a pod without one gets one, exactly once, also when the controller starts again.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

import pytest

from anex_agent.wire.heartbeat import ContainerState, Heartbeat, TransportStatus
from anex_agent.errors import CoordinatorError
from anex_agent.wire.provisioning import ProvisionCreate
from anex_agent.virtualnode.metrics import PodMetrics
from anex_agent.virtualnode.pods import FINALIZER, PodController
from anex_agent.virtualnode.podspec import provision_name
from tests.coordinator.conftest import stop_harness
from tests.coordinator.provisioning_fakes import FakeRentals, FakeSelector, ShiftClock, boot_node, offers, start
from tests.virtualnode.fake_kube import FakeKube
from tests.virtualnode.pods import seed

NODE = "anex-vastai"
SETTINGS = SimpleNamespace(provision_prefix="vk-", internal_ip="10.0.0.5", poll_interval=0.05)


def now() -> datetime:
    return datetime.now(timezone.utc)


def new_pod(**container) -> dict:
    pod = seed(**container)
    pod["metadata"]["uid"] = str(uuid.uuid4())
    pod["metadata"]["name"] = f"p-{pod['metadata']['uid'][:8]}"
    return pod


class Spy:
    """The coordinator client, telling the test which provisions were deleted (and when)."""

    def __init__(self, client) -> None:
        self.client = client
        self.deleted: list[str] = []
        self.changed = asyncio.Condition()

    def __getattr__(self, name):
        return getattr(self.client, name)

    async def delete_provision(self, provision_id: str):
        answer = await self.client.delete_provision(provision_id)
        async with self.changed:
            self.deleted.append(provision_id)
            self.changed.notify_all()
        return answer

    async def wait_deleted(self, provision_id: str, timeout: float = 20.0) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: provision_id in self.deleted), timeout)


@contextlib.asynccontextmanager
async def controller(kube: FakeKube, client, metrics: PodMetrics | None = None):
    pods = PodController(SETTINGS, kube, client, now, [NODE], metrics)
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(pods.watch_node_pods(NODE), name="pods"),
                 group.create_task(pods.watch_provisions(), name="provisions"),
                 group.create_task(pods.poll_workloads(), name="poll"),
                 *(group.create_task(pods.worker(), name=f"worker-{n}") for n in range(2))]
        try:
            yield pods
        finally:
            for task in tasks:
                task.cancel()
            pods.queue.close()


def phase(kube: FakeKube, uid: str) -> str | None:
    pod = kube.pod(uid)
    return (pod.get("status") or {}).get("phase") if pod else None


def waiting_reason(kube: FakeKube, uid: str) -> str | None:
    pod = kube.pod(uid) or {}
    statuses = (pod.get("status") or {}).get("containerStatuses") or [{}]
    return ((statuses[0].get("state") or {}).get("waiting") or {}).get("reason")


@pytest.fixture
async def world(tmp_path):
    vast = FakeRentals()
    harness = await start(tmp_path, f"sqlite:///{tmp_path / 'c.db'}", ShiftClock(), {"vastai": vast},
                          FakeSelector(offers("o1", "o2")))
    try:
        yield harness, vast, FakeKube(), Spy(harness.admin)
    finally:
        await stop_harness(harness)


async def test_a_pod_runs_fails_with_its_exit_code_and_releases_its_machine(world):
    harness, vast, kube, spy = world
    async with controller(kube, spy) as pods:
        pod = new_pod(command=["sh", "-c", "exit 3"], restartPolicy="Never")
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod waiting for its machine to boot")
        assert FINALIZER in kube.pod(uid)["metadata"]["finalizers"]
        view = pods.view_of(uid)
        assert view.name == provision_name("vk-", uid) and list(vast.rentals) == [view.rental_id]
        request = vast.requests[view.rental_id]
        assert request.command == ("sh", "-c", "exit 3") and request.env["ANEX_PROVIDER"] == "vastai"

        client, joined = await boot_node(harness, request, heartbeat=False)
        started = now()
        running = ContainerState(state="running", started_at=started)
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=running)))
        await kube.wait(lambda: phase(kube, uid) == "Running", "the pod running")
        status = kube.pod(uid)["status"]
        assert status["podIP"] == joined.config.address and status["hostIP"] == "10.0.0.5"
        assert status["containerStatuses"][0]["ready"] is True

        ended = ContainerState(state="terminated", reason="Error", exit_code=3, started_at=started,
                                    finished_at=now())
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=ended)))
        await kube.wait(lambda: phase(kube, uid) == "Failed", "the pod failed")
        terminated = kube.pod(uid)["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 3 and terminated["reason"] == "Error"
        await spy.wait_deleted(view.id)  # the machine is released; the pod stays Failed
        assert phase(kube, uid) == "Failed"
        assert {"Selecting", "Rented", "Started", "Error"} <= set(kube.reasons(uid))

        await kube.user_deletes(uid)  # gone once the provision is deleted: nothing left rented
        await kube.wait(lambda: kube.pod(uid) is None, "the pod gone")
        assert vast.rentals == {}


async def test_a_pod_deleted_while_booting_leaves_no_rental_and_is_not_stuck(world):
    harness, vast, kube, spy = world
    async with controller(kube, spy) as pods:
        pod = new_pod()
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod booting")
        assert len(vast.rentals) == 1
        await kube.user_deletes(uid)
        await kube.wait(lambda: kube.pod(uid) is None, "the pod gone")
        assert vast.rentals == {} and "Killing" in kube.reasons(uid)
        assert (await harness.admin.list_provisions()).provisions == []


async def test_a_bad_annotation_fails_the_pod_naming_it_and_rents_nothing(world):
    harness, vast, kube, spy = world
    async with controller(kube, spy):
        pod = new_pod()
        pod["metadata"]["annotations"]["anex.sh/gpu-cont"] = "1"
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: phase(kube, uid) == "Failed", "the pod failed")
        status = kube.pod(uid)["status"]
        assert status["reason"] == "ProvisioningRefused" and "anex.sh/gpu-cont" in status["message"]
        assert "ProvisioningRefused" in kube.reasons(uid)
        refused = new_pod()
        refused["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
        await kube.add_pod(refused)
        ruid = refused["metadata"]["uid"]
        await kube.wait(lambda: phase(kube, ruid) == "Failed", "the refused pod failed")
        assert kube.pod(ruid)["status"]["message"].startswith("spec.initContainers: ")
        assert (await harness.admin.list_provisions()).provisions == [] and vast.rent_calls == []


async def test_start_reconciles_orphans_and_never_rents_twice(world):
    harness, vast, kube, spy = world
    orphan = await harness.admin.create_provision(ProvisionCreate(
        name=provision_name("vk-", str(uuid.uuid4())), image="busybox", command=["true"], agent="entrypoint"))
    pod = new_pod()
    uid = pod["metadata"]["uid"]
    await kube.add_pod(pod)  # bound while no virtual node ran
    async with controller(kube, spy):
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the waiting pod provisioned")
        await spy.wait_deleted(orphan.id)
    calls = len(vast.rent_calls)
    async with controller(kube, spy) as pods:  # a restart: the same provision, not a second one
        await kube.wait(lambda: pods.provisions_synced and pods.view_of(uid) is not None and
                        waiting_reason(kube, uid) == "Booting", "the provision found again")
        await pods.sync(uid)
    names = [p.name for p in (await harness.admin.list_provisions()).provisions]
    assert names == [provision_name("vk-", uid)] and len(vast.rent_calls) == calls


async def test_provisions_seen_before_the_pods_are_listed_are_not_taken_for_orphans(world):
    """A restart where the coordinator answers before the API server lists the pods."""
    harness, vast, kube, spy = world
    pod = new_pod()
    uid = pod["metadata"]["uid"]
    await kube.add_pod(pod)
    async with controller(kube, spy):
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod provisioned")
    kube.list_gate = asyncio.Event()  # the pods' list is slow to come
    pods = PodController(SETTINGS, kube, spy, now, [NODE])
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(pods.watch_provisions(), name="provisions"),
                 group.create_task(pods.watch_node_pods(NODE), name="pods")]
        await asyncio.wait_for(pods.snapshot_seen.wait(), 10)
        await pods.sync(uid)  # what a worker does with the uid the snapshot queued
        await pods.reconcile()
        assert spy.deleted == []
        kube.list_gate.set()
        await asyncio.wait_for(pods.pods_listed.wait(), 10)
        await pods.sync(uid)
        for task in tasks:
            task.cancel()
    assert spy.deleted == [] and len((await harness.admin.list_provisions()).provisions) == 1


async def test_a_coordinator_that_cannot_take_the_pod_yet_is_said_once_and_retried(world):
    harness, vast, kube, spy = world
    refusals = []

    class Unavailable(Spy):
        async def create_provision(self, spec):
            if len(refusals) < 2:
                refusals.append(spec.name)
                raise CoordinatorError("POST /v1/provisions: 503 provisioning is not configured", status=503,
                                       retryable=True)
            return await self.client.create_provision(spec)

    async with controller(kube, Unavailable(harness.admin)):
        pod = new_pod()
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod provisioned after the retries")
    assert len(refusals) == 2 and kube.reasons(uid).count("ProvisioningDelayed") == 1


async def test_the_metrics_follow_a_pod_through_its_phases(world):
    harness, vast, kube, spy = world
    seconds = [100.0]
    metrics = PodMetrics(clock=lambda: seconds[0])

    def sample(name: str, **labels) -> float:
        return metrics.registry.get_sample_value(name, labels) or 0.0

    async with controller(kube, spy, metrics):
        pod = new_pod(command=["sh", "-c", "exit 3"], restartPolicy="Never")
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod booting")
        assert sample("anex_virtual_node_pods", phase="Pending") == 1
        assert sample("anex_virtual_node_provisions_created_total") == 1
        view = (await harness.admin.list_provisions()).provisions[0]
        request = vast.requests[view.rental_id]
        client, joined = await boot_node(harness, request, heartbeat=False)
        seconds[0] += 40  # 40 s Pending
        running = ContainerState(state="running", started_at=now())
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=running)))
        await kube.wait(lambda: phase(kube, uid) == "Running", "the pod running")
        assert sample("anex_virtual_node_pods", phase="Running") == 1
        assert sample("anex_virtual_node_pods", phase="Pending") == 0
        assert sample("anex_virtual_node_pod_phase_seconds_count", phase="Pending") == 1
        assert sample("anex_virtual_node_pod_phase_seconds_sum", phase="Pending") == 40
        seconds[0] += 7  # 7 s Running
        ended = ContainerState(state="terminated", reason="Error", exit_code=3, finished_at=now())
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=ended)))
        await kube.wait(lambda: phase(kube, uid) == "Failed", "the pod failed")
        await spy.wait_deleted(view.id)
        assert sample("anex_virtual_node_pods", phase="Failed") == 1
        assert sample("anex_virtual_node_pod_phase_seconds_sum", phase="Running") == 7
        assert sample("anex_virtual_node_pod_failures_total", reason="Error") == 1
        assert sample("anex_virtual_node_provisions_deleted_total") == 1

        refused = new_pod()
        refused["spec"]["initContainers"] = [{"name": "init", "image": "busybox"}]
        await kube.add_pod(refused)
        await kube.wait(lambda: phase(kube, refused["metadata"]["uid"]) == "Failed", "the refused pod failed")
        assert sample("anex_virtual_node_pod_failures_total", reason="UnsupportedPodSpec") == 1
        assert sample("anex_virtual_node_pods", phase="Failed") == 2
        assert sample("anex_virtual_node_provisions_created_total") == 1
        assert b"anex_virtual_node_pods{phase=\"Failed\"} 2.0" in metrics.exposition()


async def test_an_oom_killed_workload_fails_the_pod_with_oomkilled_and_137(world):
    """The agent's OOMKilled state (a SIGKILL while its cgroup's memory.events counted an oom_kill:
    tests/agent/test_pid1.py) carried by the heartbeat to the pod, its Event and the failure metric."""
    harness, vast, kube, spy = world
    async with controller(kube, spy) as pods:
        pod = new_pod(command=["python3", "-c", "b = bytearray(1 << 40)"], restartPolicy="Never")
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod booting")
        view = pods.view_of(uid)
        client, joined = await boot_node(harness, vast.requests[view.rental_id], heartbeat=False)
        started = now()
        killed = ContainerState(state="terminated", reason="OOMKilled", exit_code=137, signal=9,
                                     started_at=started, finished_at=now())
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=killed)))
        await kube.wait(lambda: phase(kube, uid) == "Failed", "the pod failed")
        terminated = kube.pod(uid)["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["reason"] == "OOMKilled" and terminated["exitCode"] == 137 and terminated["signal"] == 9
        await kube.wait(lambda: "OOMKilled" in kube.reasons(uid), "the OOMKilled Event")
        assert pods.metrics.registry.get_sample_value("anex_virtual_node_pod_failures_total",
                                                      {"reason": "OOMKilled"}) == 1


async def test_a_workload_restarted_in_place_keeps_its_pod_running_with_back_off_and_restart_count(world):
    harness, vast, kube, spy = world
    async with controller(kube, spy) as pods:
        pod = new_pod(command=["sh", "-c", "exit 3"])
        pod["spec"]["restartPolicy"] = "OnFailure"
        uid = pod["metadata"]["uid"]
        await kube.add_pod(pod)
        await kube.wait(lambda: waiting_reason(kube, uid) == "Booting", "the pod booting")
        view = pods.view_of(uid)
        request = vast.requests[view.rental_id]
        assert request.env["ANEX_RESTART_POLICY"] == "OnFailure"
        client, joined = await boot_node(harness, request, heartbeat=False)
        started = now()
        backing_off = ContainerState(state="waiting", reason="CrashLoopBackOff", exit_code=3, started_at=started,
                                          finished_at=now(), restart_count=0)
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=backing_off)))
        await kube.wait(lambda: waiting_reason(kube, uid) == "CrashLoopBackOff", "the pod in back-off")
        status = kube.pod(uid)["status"]
        assert status["phase"] == "Running" and status["containerStatuses"][0]["lastState"]["terminated"][
            "exitCode"] == 3
        await kube.wait(lambda: "BackOff" in kube.reasons(uid), "the BackOff Event")
        again = ContainerState(state="running", started_at=now(), restart_count=1)
        await client.heartbeat(joined.node_id, Heartbeat(status=TransportStatus(workload=again)))
        await kube.wait(lambda: (kube.pod(uid)["status"]["containerStatuses"][0]).get("ready") is True,
                        "the pod running again")
        assert kube.pod(uid)["status"]["containerStatuses"][0]["restartCount"] == 1
        assert view.id not in spy.deleted  # the machine is kept: the workload restarts where it ran
