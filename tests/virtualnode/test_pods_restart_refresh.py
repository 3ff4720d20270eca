"""A virtual node started again while a pod runs: its volumes are still refreshed (the controller
had no record of what it pushed before, so the next refresh pushes the volume's files again)."""

from __future__ import annotations

import base64
import uuid
from datetime import datetime, timezone
from types import SimpleNamespace

from anex_agent.virtualnode.pods import PodController
from anex_agent.wire.heartbeat import ContainerState
from anex_agent.wire.provisioning import ProvisionState, ProvisionView
from tests.virtualnode.fake_kube import FakeKube
from tests.virtualnode.pods import seed

SETTINGS = SimpleNamespace(provision_prefix="vk-", internal_ip="10.0.0.5", poll_interval=0.05, volume_refresh=60)


def now() -> datetime:
    return datetime.now(timezone.utc)


class Pushes:
    def __init__(self) -> None:
        self.files: list[tuple[str, str, bytes]] = []

    async def push_file(self, node_id: str, path: str, data: bytes, mode: int) -> None:
        self.files.append((node_id, path, data))


def secret(value: str) -> dict:
    return {"data": {"token": base64.b64encode(value.encode()).decode()}}


async def test_a_running_pods_volumes_are_refreshed_after_a_restart_of_the_virtual_node():
    kube, pushes = FakeKube(), Pushes()
    pod = seed(volumeMounts=[{"name": "tls", "mountPath": "/etc/tls"}])
    pod["spec"]["volumes"].append({"name": "tls", "secret": {"secretName": "t"}})
    pod["metadata"]["uid"] = uid = str(uuid.uuid4())
    kube.secrets[("default", "t")] = secret("old")
    view = ProvisionView(id="p1", name=f"vk-{uid}", state=ProvisionState.ready, image="x", annotations={},
                         created_at=now(), updated_at=now(), node_id="n1")
    pods = PodController(SETTINGS, kube, pushes, now, ["anex-vastai"])
    pods.workloads[view.id] = ContainerState(state="running", started_at=now())  # delivered before the restart
    assert await pods._deliver(pod, view)
    assert pushes.files == []  # the workload runs: nothing is pushed again to start it
    assert uid in pods.volumes  # but its volumes are refreshed from now on
    kube.secrets[("default", "t")] = secret("new")
    await pods._refresh(pod, view)
    assert pushes.files == [("n1", "/etc/tls/token", b"new")]
    await pods._refresh(pod, view)
    assert len(pushes.files) == 1  # unchanged since: not pushed again
