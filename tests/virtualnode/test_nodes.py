"""The virtual node's NodeKeeper: Nodes created, capacity from the offers, Ready only while the
coordinator answers, Leases created then renewed, a 403 logged not raised."""

from __future__ import annotations

import logging
from datetime import datetime, timezone
from types import SimpleNamespace

from anex_agent.errors import CoordinatorError
from anex_agent.virtualnode.nodeobject import Capacity
from anex_agent.virtualnode.nodes import NodeKeeper
from tests.virtualnode.fake_kube import FakeKube

SETTINGS = SimpleNamespace(providers=("vastai", "runpod"), node_prefix="anex-", internal_ip="10.0.0.5",
                           kubelet_port=10250, max_pods=100, offers_limit=100, lease_interval=10,
                           status_interval=60, fallback=Capacity(pods=100, cpu=256, memory_mib=1024, gpus=64))


class Coordinator:
    def __init__(self) -> None:
        self.up = True
        self.offers = {"vastai": [{"specs": {"gpu_count": 2, "cpu_cores": 32, "ram_mb": 64000}},
                                  {"specs": {"gpu_count": 1, "cpu_cores": 16, "ram_mb": 32000}}]}

    async def coordinator_info(self):
        if not self.up:
            raise CoordinatorError("GET /v1/coordinator: connection refused", retryable=True)
        return {}

    async def list_offers(self, providers, limit):
        if providers[0] not in self.offers:
            raise CoordinatorError("GET /v1/offers: 503 provider not configured", status=503, retryable=True)
        return {"offers": self.offers[providers[0]]}


def clock() -> datetime:
    return datetime(2026, 11, 27, 12, 0, tzinfo=timezone.utc)


def ready(kube: FakeKube, name: str) -> str:
    return {c["type"]: c["status"] for c in kube.nodes[name]["status"]["conditions"]}["Ready"]


async def test_nodes_capacity_readiness_and_leases(caplog):
    kube, coordinator = FakeKube(), Coordinator()
    keeper = NodeKeeper(SETTINGS, kube, coordinator, clock)
    await keeper.ensure_nodes()
    assert set(kube.nodes) == {"anex-vastai", "anex-runpod"}
    assert kube.nodes["anex-vastai"]["metadata"]["labels"]["node-provider"] == "vastai"
    assert await keeper.probe() is True  # the coordinator answers: a change from "not asked yet"
    with caplog.at_level(logging.WARNING):
        await keeper.refresh_capacity()
        await keeper.refresh_capacity()
    fallbacks = [r for r in caplog.records if "anex-runpod" in r.message and "cannot be read" in r.message]
    assert len(fallbacks) == 1  # said once, not every minute
    await keeper.write_statuses()
    vast = kube.nodes["anex-vastai"]["status"]
    assert vast["capacity"] == {"pods": "100", "cpu": "48", "memory": "96000Mi", "nvidia.com/gpu": "3"}
    assert kube.nodes["anex-runpod"]["status"]["capacity"]["cpu"] == "256"  # the configured fallback
    assert ready(kube, "anex-vastai") == "True" and vast["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250

    await keeper.renew_leases()
    assert kube.leases["anex-vastai"]["metadata"]["ownerReferences"][0]["uid"] == "uid-anex-vastai"
    kube.leases["anex-vastai"]["metadata"]["resourceVersion"] = "5"
    await keeper.renew_leases()
    assert kube.leases["anex-vastai"]["metadata"]["resourceVersion"] == "5"  # replaced with the version read

    coordinator.up = False
    assert await keeper.probe() is True and await keeper.probe() is False
    await keeper.write_statuses()
    assert ready(kube, "anex-vastai") == "False"


async def test_a_missing_permission_is_logged_and_not_raised(caplog):
    kube, coordinator = FakeKube(), Coordinator()
    keeper = NodeKeeper(SETTINGS, kube, coordinator, clock)
    await keeper.ensure_nodes()
    kube.forbidden.add("patch nodes/status")
    with caplog.at_level(logging.WARNING):
        await keeper.write_statuses()  # no exception: the next tick tries again
    assert any("status not written" in r.message and "403" in r.message for r in caplog.records)


async def test_a_deleted_node_is_made_again():
    kube, coordinator = FakeKube(), Coordinator()
    keeper = NodeKeeper(SETTINGS, kube, coordinator, clock)
    await keeper.ensure_nodes()
    del kube.nodes["anex-vastai"]
    await keeper.write_statuses()
    assert not keeper.ensured.is_set()
    await keeper.ensure_nodes()
    assert "anex-vastai" in kube.nodes
