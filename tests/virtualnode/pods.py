"""Pods as the API server holds them, for the virtual node's tests (plain dicts)."""

from __future__ import annotations

import copy

UID = "6f1c2a3b-0d4e-4f5a-8b6c-7d8e9f0a1b2c"

# the seed's example pod, as the API server answers it after scheduling (a service account
# volume added by admission, kubectl's last-applied-configuration annotation)
SEED = {
    "apiVersion": "v1", "kind": "Pod",
    "metadata": {
        "name": "my-gpu-workload", "namespace": "default", "uid": UID, "resourceVersion": "100",
        "annotations": {
            "anex.sh/region": "europe", "anex.sh/gpu-names": "RTX 4090,RTX 3090", "anex.sh/gpu-count": "2",
            "anex.sh/vram-min": "20480", "anex.sh/cpu-min": "8", "anex.sh/ram-min": "32768",
            "anex.sh/price-max": "1.50", "anex.sh/download-speed-min": "1000",
            "vastai.anex.sh/verified-only": "true", "vastai.anex.sh/datacenter-only": "true",
            "kubectl.kubernetes.io/last-applied-configuration": "{" + "x" * 3000 + "}",
        },
    },
    "spec": {
        "containers": [{
            "name": "training", "image": "pytorch/pytorch:latest", "command": ["python", "train.py"],
            "volumeMounts": [{"name": "kube-api-access-abcde",
                              "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount", "readOnly": True}],
        }],
        "nodeSelector": {"node-provider": "vastai"},
        "tolerations": [
            {"key": "virtual-kubelet.io/provider", "operator": "Equal", "value": "vastai", "effect": "NoSchedule"},
            {"key": "ignore-taint.cluster-autoscaler.kubernetes.io/manual-ignore", "operator": "Equal",
             "value": "true", "effect": "NoSchedule"},
        ],
        "volumes": [{"name": "kube-api-access-abcde", "projected": {"sources": [{"serviceAccountToken": {
            "path": "token"}}]}}],
        "restartPolicy": "Always", "nodeName": "anex-vastai", "serviceAccountName": "default",
    },
    "status": {"phase": "Pending", "qosClass": "BestEffort",
               "conditions": [{"type": "PodScheduled", "status": "True",
                               "lastTransitionTime": "2026-11-27T10:00:00Z"}]},
}


def seed(**container) -> dict:
    pod = copy.deepcopy(SEED)
    pod["spec"]["containers"][0].update(container)
    return pod
