"""A pod to its provision (anex_agent.virtualnode.podspec): what is carried, what is refused."""

from __future__ import annotations

import base64

import pytest

from anex_agent.virtualnode import podspec
from anex_agent.virtualnode.podspec import Refusal, translate
from tests.virtualnode.pods import UID, seed


def test_the_seed_pod_becomes_one_provision_named_from_its_uid():
    out = translate(seed(), {}, prefix="vk-")
    spec = out.spec
    assert spec.name == f"vk-{UID}" and podspec.pod_uid_of("vk-", spec.name) == UID
    assert spec.image == "pytorch/pytorch:latest" and spec.command == ["python", "train.py"] and spec.args == []
    # only the selection's annotations travel: kubectl's 3 kB bookkeeping would not even fit
    assert spec.annotations["anex.sh/gpu-count"] == "2" and spec.annotations["vastai.anex.sh/datacenter-only"] == "true"
    assert not [k for k in spec.annotations if k.startswith("kubectl.")]
    assert out.warnings == ()  # the service account token mount is not a volume the workload asked for
    assert spec.agent is None  # the coordinator chooses how the agent starts


def test_the_same_pod_gives_the_same_body():
    assert translate(seed(), {}, prefix="vk-").spec == translate(seed(), {}, prefix="vk-").spec


def test_env_value_from_secrets_config_maps_and_fields_and_env_from():
    pod = seed(env=[
        {"name": "PLAIN", "value": "1"},
        {"name": "PASSWORD", "valueFrom": {"secretKeyRef": {"name": "db", "key": "password"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "settings", "key": "mode"}}},
        {"name": "MISSING_OK", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}}},
        {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
        {"name": "REGION", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['anex.sh/region']"}}},
        {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "GW_TUNNEL_5432", "value": "db.default.svc.cluster.local:5432"},
    ], envFrom=[{"configMapRef": {"name": "settings"}, "prefix": "CFG_"}, {"secretRef": {"name": "db"}}],
       ports=[{"containerPort": 8888}, {"containerPort": 8888}, {"containerPort": 53, "protocol": "UDP"}])
    assert podspec.references(pod) == {("secret", "db"), ("configmap", "settings"), ("secret", "nope")}
    secret = {"data": {"password": base64.b64encode(b"s3cret").decode(), "user": base64.b64encode(b"me").decode()}}
    objects = {("secret", "db"): podspec.object_data("secret", secret),
               ("configmap", "settings"): podspec.object_data("configmap", {"data": {"mode": "fast", "bad-key": "x"}}),
               ("secret", "nope"): None}
    out = translate(pod, objects, prefix="vk-")
    env = out.spec.env
    assert env["PLAIN"] == "1" and env["MODE"] == "fast" and env["CFG_mode"] == "fast"
    # values from Secrets never travel in the provision (the coordinator stores it): pushed to the agent
    assert "s3cret" not in out.spec.model_dump_json() and "PASSWORD" not in env and "user" not in env
    assert podspec.delivered_env(pod, objects) == [
        ["CFG_mode", "fast", False], ["password", "s3cret", False], ["user", "me", False], ["PLAIN", "1", True],
        ["PASSWORD", "s3cret", False], ["MODE", "fast", False], ["POD", "my-gpu-workload", False],
        ["NS", "default", False], ["UID", UID, False], ["REGION", "europe", False],
        ["GW_TUNNEL_5432", "db.default.svc.cluster.local:5432", True]]  # the agent defines them, in order
    assert env["ANEX_POD_FILES"] == '{"dirs":[]}'  # the agent waits for them
    assert env["POD"] == "my-gpu-workload" and env["NS"] == "default" and env["UID"] == UID
    assert env["REGION"] == "europe" and env["GW_TUNNEL_5432"] == "db.default.svc.cluster.local:5432"
    assert "MISSING_OK" not in env and "IP" not in env and "CFG_bad-key" not in env
    assert out.spec.ports == [8888]
    assert any("IP" in w and "status.podIP" in w for w in out.warnings)
    assert any("UDP" in w for w in out.warnings) and any("bad-key" in w for w in out.warnings)


@pytest.mark.parametrize("change, field", [
    (lambda p: p["spec"]["containers"].append({"name": "side", "image": "x"}), "spec.containers"),
    (lambda p: p["spec"].update(initContainers=[{"name": "i", "image": "x"}]), "spec.initContainers"),
    (lambda p: p["spec"].update(hostNetwork=True), "spec.hostNetwork"),
    (lambda p: p["spec"]["volumes"].append({"name": "data", "persistentVolumeClaim": {"claimName": "c"}}),
     "spec.volumes[1].persistentVolumeClaim"),
    (lambda p: p["spec"]["volumes"].append({"name": "h", "hostPath": {"path": "/"}}), "spec.volumes[1].hostPath"),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "X", "valueFrom": {"secretKeyRef": {
        "name": "absent", "key": "k"}}}]), "spec.containers[0].env[0].valueFrom.secretKeyRef"),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "X", "valueFrom": {"resourceFieldRef": {
        "resource": "limits.cpu"}}}]), "spec.containers[0].env[0].valueFrom"),
    (lambda p: p["spec"]["containers"][0].update(env=[{"name": "X", "valueFrom": {"fieldRef": {
        "fieldPath": "spec.hostname"}}}]), "spec.containers[0].env[0].valueFrom.fieldRef"),
    (lambda p: p["spec"]["containers"][0].update(image=""), "spec.containers[0].image"),
])
def test_what_cannot_run_is_refused_naming_the_field(change, field):
    pod = seed()
    change(pod)
    with pytest.raises(Refusal) as refused:
        translate(pod, {("secret", "absent"): None}, prefix="vk-")
    assert refused.value.field == field and str(refused.value).startswith(field + ": ")


def test_config_map_and_secret_volumes_are_delivered_and_the_others_said_undelivered():
    pod = seed(volumeMounts=[{"name": "cfg", "mountPath": "/etc/app"}, {"name": "scratch", "mountPath": "/tmp/s"},
                             {"name": "info", "mountPath": "/etc/info"}])
    pod["spec"]["volumes"] += [{"name": "cfg", "configMap": {"name": "app"}}, {"name": "scratch", "emptyDir": {}},
                               {"name": "tls", "secret": {"secretName": "t"}},
                               {"name": "info", "downwardAPI": {"items": []}}]
    out = translate(pod, {("configmap", "app"): {"a": "1"}}, prefix="vk-")
    assert not [w for w in out.warnings if "/etc/app" in w or "/tmp/s" in w]
    assert [w for w in out.warnings if "/etc/info" in w]
    assert out.spec.env["ANEX_POD_FILES"] == '{"dirs":["/etc/app"]}'
    assert podspec.references(pod) == {("configmap", "app")}  # tls is not mounted
    with pytest.raises(Refusal) as refused:
        translate(pod, {}, prefix="vk-")
    assert refused.value.field == "spec.containers[0].volumeMounts[0].name" and "'app'" in refused.value.message


def test_gpu_limits_become_the_gpu_count_unless_an_annotation_says_it():
    pod = seed(resources={"limits": {"nvidia.com/gpu": "4"}})
    assert translate(pod, {}, prefix="vk-").spec.annotations["anex.sh/gpu-count"] == "2"  # the annotation wins
    del pod["metadata"]["annotations"]["anex.sh/gpu-count"]
    assert translate(pod, {}, prefix="vk-").spec.annotations["anex.sh/gpu-count"] == "4"
    pod["metadata"]["annotations"]["anex.sh/gpu-count-min"] = "1"
    assert "anex.sh/gpu-count" not in translate(pod, {}, prefix="vk-").spec.annotations
    pod = seed(resources={"requests": {"nvidia.com/gpu": 1}})
    del pod["metadata"]["annotations"]["anex.sh/gpu-count"]
    assert translate(pod, {}, prefix="vk-").spec.annotations["anex.sh/gpu-count"] == "1"


def test_a_value_over_the_coordinators_limits_is_refused_naming_it():
    pod = seed(env=[{"name": "BIG", "value": "x" * 5000}])
    with pytest.raises(Refusal) as refused:
        translate(pod, {}, prefix="vk-")
    assert refused.value.field == "spec.containers[0].env.BIG"


def test_a_pure_module():
    import ast
    import inspect

    for module in (podspec,):
        names = {a.name for n in ast.walk(ast.parse(inspect.getsource(module))) if isinstance(n, ast.Import)
                 for a in n.names} | {n.module for n in ast.walk(ast.parse(inspect.getsource(module)))
                                      if isinstance(n, ast.ImportFrom)}
        assert not names & {"asyncio", "socket", "time", "kubernetes_asyncio"}


def test_dollar_references_expand_as_the_kubelet_expands_them():
    assert podspec.expand("$(A)-$(B)-$$(A)-$(NONE)-$$-$(", {"A": "1", "B": "2"}) == "1-2-$(A)-$(NONE)-$-$("
    pod = seed(command=["sh", "-c", "echo $(GREETING) $$(HOME)"], args=["--epochs=$(EPOCHS)"],
               env=[{"name": "EPOCHS", "value": "3"}, {"name": "GREETING", "value": "hello x$(EPOCHS)"},
                    {"name": "EARLY", "value": "$(LATE)"}, {"name": "LATE", "value": "late"}])
    spec = translate(pod, {}, prefix="vk-").spec
    assert spec.command == ["sh", "-c", "echo hello x3 $(HOME)"] and spec.args == ["--epochs=3"]
    assert spec.env["GREETING"] == "hello x3" and spec.env["EARLY"] == "$(LATE)"  # only what is defined before


def test_with_variables_from_secrets_the_templates_travel_as_written_for_the_agent():
    pod = seed(command=["sh", "-c", "echo $$(TOKEN) $(A)"], args=["$(MODE)"],
               env=[{"name": "A", "value": "$(B)"}, {"name": "MODE", "value": "x$(TOKEN)"},
                    {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}}])
    objects = {("secret", "s"): {"token": "s3cr3t"}}
    spec = translate(pod, objects, prefix="vk-").spec
    assert spec.command == ["sh", "-c", "echo $$(TOKEN) $(A)"] and spec.args == ["$(MODE)"]  # expanded once: there
    assert spec.env["A"] == "$(B)" and spec.env["MODE"] == "x$(TOKEN)" and "TOKEN" not in spec.env
    assert "s3cr3t" not in spec.model_dump_json()
    assert podspec.delivered_env(pod, objects) == [["A", "$(B)", True], ["MODE", "x$(TOKEN)", True],
                                                   ["TOKEN", "s3cr3t", False]]
    assert podspec.delivered_env(seed(env=[{"name": "A", "value": "1"}]), {}) is None  # the virtual node expands


def test_config_map_values_are_not_expanded_and_later_definitions_win():
    pod = seed(command=["echo", "$(CFG)", "$(ANEX_RESTART_POLICY)"],
               envFrom=[{"configMapRef": {"name": "c"}}],
               env=[{"name": "CFG", "value": "$(CFG)-$(REF)"}, {"name": "REF", "value": "r"}])
    spec = translate(pod, {("configmap", "c"): {"CFG": "c", "REF": "$(CFG)"}}, prefix="vk-").spec
    assert spec.env["CFG"] == "c-$(CFG)" and spec.env["REF"] == "r"  # a value from a ConfigMap is never expanded
    assert spec.command == ["echo", "c-$(CFG)", "$(ANEX_RESTART_POLICY)"]  # not a container variable


@pytest.mark.parametrize("policy, carried", [("Never", "Never"), ("OnFailure", "OnFailure"), ("Always", "Always"),
                                             (None, "Always")])
def test_the_restart_policy_travels_to_the_agent_and_wins_over_the_pods_env(policy, carried):
    pod = seed(env=[{"name": "ANEX_RESTART_POLICY", "value": "Never"}])
    pod["spec"].pop("restartPolicy", None)
    if policy is not None:
        pod["spec"]["restartPolicy"] = policy
    assert translate(pod, {}, prefix="vk-").spec.env["ANEX_RESTART_POLICY"] == carried


def test_the_probes_travel_to_the_agent_with_named_ports_resolved_and_the_pods_grace():
    import json

    from anex_agent.agent import probe_spec

    pod = seed(ports=[{"name": "http", "containerPort": 8080}],
               livenessProbe={"httpGet": {"path": "/healthz", "port": "http", "scheme": "HTTP"},
                              "periodSeconds": 5, "failureThreshold": 2},
               readinessProbe={"tcpSocket": {"port": 8080}, "successThreshold": 2},
               startupProbe={"exec": {"command": ["cat", "/tmp/started"]}, "failureThreshold": 30})
    pod["spec"]["terminationGracePeriodSeconds"] = 7
    carried = translate(pod, {}, prefix="vk-").spec.env["ANEX_PROBES"]
    probes = probe_spec.parse(carried)  # what the agent reads
    assert probes.liveness.port == 8080 and probes.liveness.path == "/healthz" and probes.liveness.period == 5
    assert probes.liveness.failure_threshold == 2 and probes.liveness.grace == 7
    assert probes.readiness.handler == "tcpSocket" and probes.readiness.success_threshold == 2
    assert probes.readiness.grace is None  # readiness never kills
    assert probes.startup.command == ("cat", "/tmp/started") and probes.startup.failure_threshold == 30
    assert "ANEX_PROBES" not in translate(seed(), {}, prefix="vk-").spec.env
    assert json.loads(carried)["liveness"]["httpGet"]["port"] == 8080


@pytest.mark.parametrize("probe, field", [
    ({"grpc": {"port": 9000}}, "spec.containers[0].livenessProbe.grpc"),
    ({"httpGet": {"port": "metrics"}}, "spec.containers[0].livenessProbe.httpGet.port"),
    ({"tcpSocket": {"port": "nope"}}, "spec.containers[0].livenessProbe.tcpSocket.port"),
    ({"tcpSocket": {"port": 80, "host": "a" * 70}}, "spec.containers[0].livenessProbe.tcpSocket.host"),
    ({"httpGet": {"port": 80, "host": "x y"}}, "spec.containers[0].livenessProbe.httpGet.host"),
    ({"exec": {"command": ["sh", "a\0b"]}}, "spec.containers[0].livenessProbe.exec.command[1]"),
])
def test_a_probe_the_agent_cannot_run_is_refused_naming_its_field(probe, field):
    with pytest.raises(Refusal) as err:
        translate(seed(livenessProbe=probe), {}, prefix="vk-")
    assert err.value.field == field


def test_the_container_ports_are_the_inbound_ports_of_the_built_in_engine_but_the_agents_own():
    from anex_agent.agent.settings import DEFAULT_API_LISTEN, DEFAULT_PROXY_LISTEN, AgentSettings, parse_inbound_ports

    assert set(podspec.AGENT_PORTS) == {int(DEFAULT_API_LISTEN.rsplit(":", 1)[1]),
                                        int(DEFAULT_PROXY_LISTEN.rsplit(":", 1)[1]),
                                        AgentSettings.__dataclass_fields__["ssh_port"].default}
    ports = [{"containerPort": 8000}, {"containerPort": 9555}, {"containerPort": 53, "protocol": "UDP"},
             {"containerPort": 8443}, {"containerPort": 9555, "protocol": "UDP"}, {"containerPort": 53, "protocol": "UDP"},
             {"containerPort": 3868, "protocol": "SCTP"}]
    out = translate(seed(ports=ports), {}, prefix="vk-")
    assert out.spec.ports == [8000, 9555, 8443]  # TCP ones published by the provider as before
    # the mesh reaches them on every engine, UDP ones too (the agent's own ports are TCP only)
    assert out.spec.env["ANEX_INBOUND_PORTS"] == "8000,8443,53/udp,9555/udp"
    assert parse_inbound_ports(out.spec.env["ANEX_INBOUND_PORTS"], "ANEX_INBOUND_PORTS") == ((8000, 8443), (53, 9555))
    assert any("ports[2]: UDP port 53 reaches the pod over the mesh" in w for w in out.warnings)
    assert any("ports[6]: only TCP and UDP ports are carried; SCTP left out" in w for w in out.warnings)
    assert any("9555" in w and "agent API" in w for w in out.warnings)
    assert "ANEX_INBOUND_PORTS" not in translate(seed(), {}, prefix="vk-").spec.env  # no ports, none
    mine = seed(ports=[{"containerPort": 8000}], env=[{"name": "ANEX_INBOUND_PORTS", "value": "7000"}])
    assert translate(mine, {}, prefix="vk-").spec.env["ANEX_INBOUND_PORTS"] == "7000"  # the pod's own wins
