"""The demo's Kubernetes rows, the parts that need no privileges: when they are skipped, and
the pod they apply (the user guide's example pod, its command replaced and restartPolicy Never)."""

from __future__ import annotations

import yaml

from anex_agent.demo import kubernetes
from anex_agent.testing import kube


def test_missing_control_plane_programs_skip_the_rows_naming_them(monkeypatch, tmp_path):
    monkeypatch.setattr(kube, "TOOLS_BIN_DIR", tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    reason = kubernetes.skip_reason()
    assert reason is not None
    assert reason.startswith("needs etcd, kube-apiserver, kube-scheduler, kube-controller-manager, kubectl in ")
    assert "scripts/install-tools kube etcd" in reason


def test_present_programs_and_manifests_leave_nothing_to_skip(monkeypatch, tmp_path):
    for name in kube.PROGRAMS:
        program = tmp_path / name
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
    monkeypatch.setattr(kube, "TOOLS_BIN_DIR", tmp_path)
    assert kubernetes.skip_reason() is None
    monkeypatch.setattr(kubernetes, "DEPLOY", tmp_path)
    assert kubernetes.skip_reason() == (f"needs namespace.yaml, rbac.yaml, kubelet-rbac.yaml in {tmp_path} "
                                        "(run the demo from a checkout of the project)")


def test_the_demo_pod_is_the_example_pod_with_its_command_and_restart_policy_changed():
    example = yaml.safe_load(kubernetes.EXAMPLE_POD.read_text())
    pod = yaml.safe_load(kubernetes.pod_manifest(["sh", "-c", "echo hi"]))
    assert pod["spec"]["containers"][0]["command"] == ["sh", "-c", "echo hi"]
    assert example["spec"]["containers"][0]["command"] == ["python", "train.py"]
    assert pod["spec"].pop("restartPolicy") == "Never" and "restartPolicy" not in example["spec"]
    pod["spec"]["containers"][0]["command"] = example["spec"]["containers"][0]["command"]
    assert pod == example
    assert pod["metadata"]["name"] == kubernetes.POD_NAME
    assert pod["metadata"]["annotations"]["anex.sh/gpu-count"] == "2"


def test_the_demo_offers_satisfy_the_example_pods_gpu_count():
    from anex_agent.demo.provision import OFFERS

    assert [o for o in OFFERS if o["num_gpus"] >= 2 and o["dph_total"] <= 1.5 and o["verified"]]
    assert min(OFFERS, key=lambda o: o["dph_total"])["num_gpus"] == 1  # the provision check's machine
