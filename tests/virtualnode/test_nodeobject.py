"""The virtual node's Node, Lease and capacity (anex_agent.virtualnode.nodeobject)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from anex_agent.virtualnode import nodeobject
from anex_agent.virtualnode.nodeobject import Capacity

NOW = datetime(2026, 11, 27, 12, 0, 0, tzinfo=timezone.utc)


def test_the_node_carries_the_labels_and_taint_the_seed_pod_selects_and_tolerates():
    node = nodeobject.node_object("anex-vastai", "vastai")
    labels = node["metadata"]["labels"]
    assert labels["node-provider"] == "vastai" and labels["type"] == "virtual-kubelet"
    assert labels["kubernetes.io/os"] == "linux" and labels["kubernetes.io/role"] == "agent"
    assert node["spec"]["taints"] == [{"key": "virtual-kubelet.io/provider", "value": "vastai",
                                       "effect": "NoSchedule"}]


def test_an_existing_node_gets_our_labels_and_taint_back_and_keeps_other_taints():
    node = nodeobject.node_object("anex-vastai", "vastai")
    assert nodeobject.node_patch("anex-vastai", "vastai", node) is None
    node["metadata"]["labels"]["node-provider"] = "other"
    node["spec"]["taints"] = [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"}]
    patch = nodeobject.node_patch("anex-vastai", "vastai", node)
    assert patch["metadata"]["labels"]["node-provider"] == "vastai"
    assert patch["spec"]["taints"] == [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule"},
                                       {"key": "virtual-kubelet.io/provider", "value": "vastai", "effect": "NoSchedule"}]


def test_status_ready_only_while_the_coordinator_answers_with_endpoint_and_address():
    cap = Capacity(pods=100, cpu=64, memory_mib=128000, gpus=4)
    up = nodeobject.node_status(None, cap, coordinator_ok=True, why="ok", internal_ip="10.0.0.5", kubelet_port=10250,
                                name="anex-vastai", now=NOW)
    ready = {c["type"]: c for c in up["conditions"]}["Ready"]
    assert ready["status"] == "True" and up["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}
    assert {"type": "InternalIP", "address": "10.0.0.5"} in up["addresses"]
    assert up["capacity"] == up["allocatable"] == {"pods": "100", "cpu": "64", "memory": "128000Mi",
                                                   "nvidia.com/gpu": "4"}
    later = NOW + timedelta(minutes=1)
    still = nodeobject.node_status({"status": up}, cap, coordinator_ok=True, why="ok", internal_ip="10.0.0.5",
                                   kubelet_port=10250, name="anex-vastai", now=later)
    same = {c["type"]: c for c in still["conditions"]}["Ready"]
    assert same["lastTransitionTime"] == "2026-11-27T12:00:00Z" and same["lastHeartbeatTime"] == "2026-11-27T12:01:00Z"
    down = nodeobject.node_status({"status": still}, cap, coordinator_ok=False, why="refused", internal_ip="10.0.0.5",
                                  kubelet_port=10250, name="anex-vastai", now=later)
    gone = {c["type"]: c for c in down["conditions"]}["Ready"]
    assert gone["status"] == "False" and gone["reason"] == "CoordinatorUnreachable"
    assert gone["lastTransitionTime"] == "2026-11-27T12:01:00Z"


def test_capacity_sums_the_offers_and_skips_unknown_values():
    offers = [{"specs": {"gpu_count": 2, "cpu_cores": 32, "ram_mb": 64345}},
              {"specs": {"gpu_count": 1, "cpu_cores": None, "ram_mb": 32000.5}}, {"specs": {}}]
    assert nodeobject.capacity_from_offers(offers, pods=50) == Capacity(pods=50, cpu=32, memory_mib=96345, gpus=3)


def test_the_lease_is_owned_by_the_node_and_renewed_now():
    lease = nodeobject.lease_object("anex-vastai", "uid-1", NOW, resource_version="7")
    assert lease["metadata"]["namespace"] == "kube-node-lease" and lease["metadata"]["resourceVersion"] == "7"
    assert lease["metadata"]["ownerReferences"][0]["uid"] == "uid-1"
    assert lease["spec"]["renewTime"] == "2026-11-27T12:00:00.000000Z" and lease["spec"]["holderIdentity"] == "anex-vastai"
