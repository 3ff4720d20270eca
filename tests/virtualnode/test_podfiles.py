"""A pod's ConfigMap and Secret volumes to the files the agent writes (anex_agent.virtualnode.podfiles)."""

from __future__ import annotations

import base64

import pytest

from anex_agent.virtualnode import podfiles
from anex_agent.virtualnode.podfiles import PodFile
from anex_agent.virtualnode.podspec import Refusal
from tests.virtualnode.pods import seed


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


CONFIG = {"data": {"app.conf": "threads=4\n", "other": "x"}, "binaryData": {"blob.bin": b64(b"\x00\xff")}}
SECRET = {"data": {"tls.key": b64(b"KEY"), "token": b64(b"t0k")}}


def pod_with(mounts, volumes):
    pod = seed(volumeMounts=mounts)
    pod["spec"]["volumes"] += volumes
    return pod


def test_every_key_as_a_file_with_the_default_modes_and_binary_data_unchanged():
    pod = pod_with([{"name": "cfg", "mountPath": "/etc/app"}, {"name": "tls", "mountPath": "/etc/tls/"}],
                   [{"name": "cfg", "configMap": {"name": "app"}}, {"name": "tls", "secret": {"secretName": "t"}}])
    objects = {("configmap", "app"): CONFIG, ("secret", "t"): SECRET}
    assert podfiles.references(pod) == {("configmap", "app"), ("secret", "t")}
    assert podfiles.plan(pod, objects) == ["/etc/app", "/etc/tls"]
    assert sorted(podfiles.files(pod, objects), key=lambda f: f.path) == [
        PodFile("/etc/app/app.conf", b"threads=4\n", 0o644), PodFile("/etc/app/blob.bin", b"\x00\xff", 0o644),
        PodFile("/etc/app/other", b"x", 0o644),
        PodFile("/etc/tls/tls.key", b"KEY", 0o600), PodFile("/etc/tls/token", b"t0k", 0o600)]


def test_items_default_mode_sub_path_and_optional():
    pod = pod_with(
        [{"name": "cfg", "mountPath": "/etc/app"}, {"name": "one", "mountPath": "/etc/one.conf", "subPath": "app.conf"},
         {"name": "maybe", "mountPath": "/etc/maybe"}],
        [{"name": "cfg", "configMap": {"name": "app", "defaultMode": 0o440, "items": [
            {"key": "app.conf", "path": "conf/main.conf"}, {"key": "other", "path": "o", "mode": 0o400}]}},
         {"name": "one", "configMap": {"name": "app"}},
         {"name": "maybe", "secret": {"secretName": "absent", "optional": True}}])
    objects = {("configmap", "app"): CONFIG, ("secret", "absent"): None}
    assert podfiles.plan(pod, objects) == ["/etc", "/etc/app", "/etc/maybe", "/etc/app/conf"]
    assert podfiles.files(pod, objects) == [
        PodFile("/etc/app/conf/main.conf", b"threads=4\n", 0o440), PodFile("/etc/app/o", b"x", 0o400),
        PodFile("/etc/one.conf", b"threads=4\n", 0o644)]


@pytest.mark.parametrize("mount, source, field", [
    ({"mountPath": "etc/app"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/etc/../app"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/app.conf", "subPath": "app.conf"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/var/lib"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/var/lib/anex-agent/x"}, {"name": "app"}, "spec.containers[0].volumeMounts[0].mountPath"),
    ({"mountPath": "/etc/app"}, {"name": "app", "items": [{"key": "other", "path": "../x"}]},
     "volumes[cfg].items[0].path"),
    ({"mountPath": "/etc/app"}, {"name": "app", "items": [{"key": "other", "path": "/x"}]},
     "volumes[cfg].items[0].path"),
    ({"mountPath": "/etc/app"}, {"name": "app", "defaultMode": 0o4755}, "volumes[cfg].defaultMode"),
    ({"mountPath": "/etc/app"}, {"name": "gone"}, "spec.containers[0].volumeMounts[0].name"),
])
def test_what_cannot_be_written_is_refused_naming_the_field(mount, source, field):
    pod = pod_with([{"name": "cfg", **mount}], [{"name": "cfg", "configMap": source}])
    with pytest.raises(Refusal) as refused:
        podfiles.plan(pod, {("configmap", "app"): CONFIG, ("configmap", "gone"): None})
    assert refused.value.field == field


def test_a_missing_key_or_sub_path_is_refused_when_the_files_are_made():
    pod = pod_with([{"name": "cfg", "mountPath": "/etc/app"}],
                   [{"name": "cfg", "configMap": {"name": "app", "items": [{"key": "nope", "path": "n"}]}}])
    with pytest.raises(Refusal) as refused:
        podfiles.files(pod, {("configmap", "app"): CONFIG})
    assert refused.value.field == "volumes[cfg].items[0].key"
    pod = pod_with([{"name": "cfg", "mountPath": "/etc/x.conf", "subPath": "nope"}],
                   [{"name": "cfg", "configMap": {"name": "app"}}])
    with pytest.raises(Refusal) as refused:
        podfiles.files(pod, {("configmap", "app"): CONFIG})
    assert refused.value.field == "spec.containers[0].volumeMounts[0].subPath"


def test_the_service_account_token_is_left_out():
    pod = pod_with([{"name": "sa", "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount"}],
                   [{"name": "sa", "secret": {"secretName": "sa-token"}}])
    assert podfiles.references(pod) == set() and podfiles.plan(pod, {}) == []
