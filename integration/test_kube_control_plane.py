"""The real kube-scheduler puts the user guide's example Pod on a virtual node of ours, and
keeps a pod without the provider's toleration off it.

The node is what the virtual node registers: labelled ``node-provider: vastai`` and
``type: virtual-kubelet``, tainted ``virtual-kubelet.io/provider=vastai:NoSchedule``, Ready.
The control plane is :mod:`integration.kube`'s (real etcd, kube-apiserver, kube-scheduler,
kube-controller-manager); there is no kubelet, so a bound pod stays Pending, which is all
the scheduler's part.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from integration.kube import require_kube
from integration.netns import unique
from tests.polling import wait_for

pytestmark = require_kube()

EXAMPLE_POD = Path(__file__).resolve().parent.parent / "anex_agent" / "demo" / "example_pod.yaml"
EXAMPLE_POD_NAME = "my-gpu-workload"


def virtual_node(name: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"node-provider": "vastai", "type": "virtual-kubelet",
                                              "kubernetes.io/hostname": name}},
        "spec": {"taints": [{"key": "virtual-kubelet.io/provider", "value": "vastai", "effect": "NoSchedule"}]},
        "status": {
            "capacity": {"cpu": "64", "memory": "256Gi", "pods": "100", "nvidia.com/gpu": "8"},
            "allocatable": {"cpu": "64", "memory": "256Gi", "pods": "100", "nvidia.com/gpu": "8"},
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "message": "virtual node is ready"}],
        },
    }


def pod_without_toleration(name: str) -> dict:
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"nodeSelector": {"node-provider": "vastai"},
                 "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]},
    }


@pytest.fixture
def namespace(control_plane):
    name = control_plane.create_namespace(unique("sched-"))
    yield name
    control_plane.kubectl("delete", "namespace", name, "--wait=false")


def taint_keys(control_plane, node: str) -> list[str]:
    return [t["key"] for t in control_plane.kubectl_json("get", "node", node)["spec"].get("taints", [])]


@pytest.fixture
def node(control_plane):
    """The virtual node, once node-lifecycle-controller lifted the not-ready taint every new
    Node gets: only the provider's taint is left, as in a cluster the virtual node joined."""
    name = unique("vastai-")
    control_plane.kubectl("apply", "-f", "-", input=json.dumps(virtual_node(name)))
    wait_for(lambda: taint_keys(control_plane, name) == ["virtual-kubelet.io/provider"], 60,
             "node-lifecycle-controller to lift the new node's not-ready taint", interval=0.2)
    yield name
    control_plane.kubectl("delete", "node", name, "--wait=false")


def scheduled_condition(control_plane, namespace: str, pod: str) -> dict | None:
    status = control_plane.kubectl_json("get", "pod", pod, "-n", namespace).get("status", {})
    return next((c for c in status.get("conditions", []) if c["type"] == "PodScheduled"), None)


def test_the_example_pod_is_bound_to_the_virtual_node_and_a_pod_without_the_toleration_is_not(
        control_plane, namespace, node):
    applied = control_plane.kubectl_json("get", "node", node)
    assert [c["status"] for c in applied["status"]["conditions"] if c["type"] == "Ready"] == ["True"]

    control_plane.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE_POD))
    condition = wait_for(lambda: scheduled_condition(control_plane, namespace, EXAMPLE_POD_NAME),
                         60, "the scheduler's verdict on the example pod", interval=0.2)
    assert condition["status"] == "True", condition
    bound = control_plane.kubectl_json("get", "pod", EXAMPLE_POD_NAME, "-n", namespace)
    assert bound["spec"]["nodeName"] == node

    control_plane.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod_without_toleration("no-toleration")))
    condition = wait_for(lambda: scheduled_condition(control_plane, namespace, "no-toleration"),
                         60, "the scheduler's verdict on the pod without the toleration", interval=0.2)
    assert (condition["status"], condition["reason"]) == ("False", "Unschedulable"), condition
    # The node's only taint is the provider's (the node fixture waits for that), and its
    # labels match the pod's nodeSelector: the taint is what keeps the pod off it.
    assert "1 node(s) had untolerated taint" in condition["message"], condition["message"]
    assert "nodeName" not in control_plane.kubectl_json("get", "pod", "no-toleration", "-n", namespace)["spec"]
