"""A pod, as the API server holds it, to the one provision that runs it (pure: no I/O).

Contract:
* :func:`provision_name` is the provision's ``name`` for a pod: ``<prefix><pod uid>``. The
  coordinator makes ``POST /v1/provisions`` idempotent by name, so a restarted virtual node
  asks again for the same provision and never rents twice; :func:`pod_uid_of` reads the uid
  back (the reconciliation's "whose provision is this").
* :func:`check_pod` refuses what the product cannot honour (:class:`Refusal`, naming the field
  of the pod spec): more than one container, init containers, ``hostNetwork``/``hostPID``/
  ``hostIPC``, volumes other than ConfigMap, Secret, emptyDir, projected and downwardAPI ones.
* :func:`references` lists the Secrets and ConfigMaps the container's ``env``/``envFrom`` and
  its volume mounts read; the caller fetches them (``None`` for one that does not exist) and
  passes them to :func:`translate`, which returns the :class:`Translation`: the
  ``ProvisionCreate`` (image, command, args, env with ``valueFrom``/``envFrom`` resolved, container
  TCP ports, and its TCP and UDP ports as ``ANEX_INBOUND_PORTS`` (``8000,53/udp``) unless the pod
  sets it (the ports an agent on the built-in engine serves at the mesh address; the agent's own
  ports left out, with a warning), the
  registry login of the image from ``imagePullSecrets`` (:mod:`.pullsecrets`; the
  coordinator stores it sealed), the pod's selection annotations, ``nvidia.com/gpu`` as ``anex.sh/gpu-count`` unless an annotation says
  how many GPUs, ``restartPolicy`` as ``ANEX_RESTART_POLICY``: the agent restarts the workload
  in place, and its startup, liveness and readiness probes as ``ANEX_PROBES``: the agent runs them
  next to the workload) and warnings about what is accepted but not carried to the machine.
  The values from Secrets never travel in the provision (the coordinator stores it, the provider
  sees its env): :func:`delivered_env` gives the caller the container's variables, which it pushes
  to the agent once the machine is up, with the volumes' files (:mod:`.podfiles`);
  ``ANEX_POD_FILES`` tells the agent to wait for them (:func:`delivers`). :func:`fetched` is every
  object to read for a pod. ``$(VAR)`` in ``command``, ``args`` and ``env`` values is expanded as
  the kubelet expands it (:func:`expand`, one pass), by this module for a pod without variables
  from Secrets, else by the agent: then the provision carries the command, the arguments and the
  ``env`` values as written (:func:`has_secret_env`).
* Pods are plain dicts (the API's JSON); nothing here depends on a Kubernetes client.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from anex_agent import parse
from anex_agent.wire.pod import POD_FILES_ENV, PROBES_ENV
from anex_agent.wire.pod import expand, resolve  # the one $(VAR) expansion, the agent's too
from anex_agent.wire.provisioning import ProvisionCreate
from anex_agent.virtualnode import podfiles, pullsecrets
from anex_agent.virtualnode.refusal import Refusal  # re-exported: podspec.Refusal

#: Annotations the coordinator's selection reads; the others (kubectl's last-applied-configuration,
#: tools' bookkeeping) stay in the cluster. Keep in step with docs/selection.md's prefixes.
SELECTION_PREFIXES = ("anex.sh/", "vastai.anex.sh/", "runpod.anex.sh/", "gpu-provider.glami.cz/")
GPU_RESOURCE = "nvidia.com/gpu"
GPU_COUNT = "anex.sh/gpu-count"
SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
RESTART_POLICY_ENV = "ANEX_RESTART_POLICY"  # read by the agent (anex_agent.agent.restart_policy)
#: read by the agent (anex_agent.agent.settings): the workload ports (``PORT``: TCP, ``PORT/udp``) the
#: built-in engine serves at the mesh address (the kernel and wireguard-go engines serve every port
#: on their interface)
INBOUND_PORTS_ENV = "ANEX_INBOUND_PORTS"
#: the agent's own ports by default (its API, its HTTP proxy, its SSH server: DEFAULT_API_LISTEN,
#: DEFAULT_PROXY_LISTEN and ssh_port of anex_agent.agent.settings), never the workload's inbound ports
AGENT_PORTS = {9555: "the agent API's", 3128: "the agent's HTTP proxy's", 2222: "the agent's SSH server's"}
PROBE_KINDS = ("startup", "liveness", "readiness")
PROBE_TIMINGS = ("initialDelaySeconds", "periodSeconds", "timeoutSeconds", "successThreshold", "failureThreshold",
                 "terminationGracePeriodSeconds")
ACCEPTED_VOLUMES = ("configMap", "secret", "emptyDir", "projected", "downwardAPI")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
CONTAINER = "spec.containers[0]"


@dataclass(frozen=True)
class Translation:
    spec: ProvisionCreate
    warnings: tuple[str, ...] = field(default=())


def provision_name(prefix: str, uid: str) -> str:
    return f"{prefix}{uid.lower()}"


def pod_uid_of(prefix: str, name: str) -> str | None:
    """The pod uid a provision name of ours carries; None for a name not of this scheme."""
    return name[len(prefix):] if name.startswith(prefix) and len(name) > len(prefix) else None


def _spec(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    return pod.get("spec") or {}


def check_pod(pod: Mapping[str, Any]) -> None:
    """Raise :class:`Refusal` for what a rented machine cannot run (see the module docstring)."""
    spec = _spec(pod)
    containers = spec.get("containers") or []
    if len(containers) != 1:
        raise Refusal("spec.containers", f"the virtual node runs exactly one container per pod (one rented "
                      f"machine each); this pod has {len(containers)}: run each in a pod of its own")
    if spec.get("initContainers"):
        raise Refusal("spec.initContainers", "init containers are not supported; run those steps at the start "
                      "of the container's command")
    for flag in ("hostNetwork", "hostPID", "hostIPC"):
        if spec.get(flag):
            raise Refusal(f"spec.{flag}", "a rented machine is not a host of this cluster; leave it out")
    for i, volume in enumerate(spec.get("volumes") or []):
        kinds = [k for k in volume if k != "name"]
        bad = [k for k in kinds if k not in ACCEPTED_VOLUMES]
        if bad:
            raise Refusal(f"spec.volumes[{i}].{bad[0]}", f"volume {volume.get('name')!r}: only ConfigMap, Secret, "
                          "emptyDir, projected and downwardAPI volumes are accepted; a rented machine cannot "
                          "reach the cluster's storage (copy data in with the workload or through the mesh)")
    if not (containers[0].get("image") or "").strip():
        raise Refusal(f"{CONTAINER}.image", "is required")


def references(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    """``("secret"|"configmap", name)`` for every object the container's environment and mounts read."""
    found: set[tuple[str, str]] = podfiles.references(pod)
    for container in (_spec(pod).get("containers") or [])[:1]:
        for var in container.get("env") or []:
            source = var.get("valueFrom") or {}
            if "secretKeyRef" in source:
                found.add(("secret", source["secretKeyRef"].get("name", "")))
            if "configMapKeyRef" in source:
                found.add(("configmap", source["configMapKeyRef"].get("name", "")))
        for source in container.get("envFrom") or []:
            if "secretRef" in source:
                found.add(("secret", source["secretRef"].get("name", "")))
            if "configMapRef" in source:
                found.add(("configmap", source["configMapRef"].get("name", "")))
    return found


def object_data(kind: str, obj: Mapping[str, Any] | None) -> dict[str, str] | None:
    """The string values of a Secret (``data``, base64) or a ConfigMap (``data`` and ``binaryData``)."""
    if obj is None:
        return None
    out: dict[str, str] = {}
    encoded = dict(obj.get("data") or {}) if kind == "secret" else dict(obj.get("binaryData") or {})
    if kind == "configmap":
        out.update({k: str(v) for k, v in (obj.get("data") or {}).items()})
    for key, value in encoded.items():
        try:
            out[key] = base64.b64decode(value, validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            continue  # not text: it cannot be an environment value
    return out


def _field_value(pod: Mapping[str, Any], path: str, where: str) -> str | None:
    meta, spec, status = pod.get("metadata") or {}, _spec(pod), pod.get("status") or {}
    simple = {"metadata.name": meta.get("name"), "metadata.namespace": meta.get("namespace"),
              "metadata.uid": meta.get("uid"), "spec.nodeName": spec.get("nodeName"),
              "spec.serviceAccountName": spec.get("serviceAccountName"), "status.podIP": status.get("podIP"),
              "status.hostIP": status.get("hostIP")}
    if path in simple:
        return simple[path]
    match = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", path)
    if match:
        return (meta.get(match.group(1)) or {}).get(match.group(2), "")
    raise Refusal(where, f"fieldPath {path!r} is not supported; accepted: metadata.name, metadata.namespace, "
                  "metadata.uid, metadata.labels['KEY'], metadata.annotations['KEY'], spec.nodeName, "
                  "spec.serviceAccountName, status.podIP, status.hostIP")


def _key_ref(kind: str, ref: Mapping[str, Any], objects: Mapping[tuple[str, str], dict[str, str] | None],
             where: str) -> str | None:
    name, key, optional = ref.get("name", ""), ref.get("key", ""), bool(ref.get("optional"))
    data = objects.get((kind, name))
    label = "Secret" if kind == "secret" else "ConfigMap"
    if data is None:
        if optional:
            return None
        raise Refusal(where, f"{label} {name!r} does not exist in the pod's namespace")
    if key not in data:
        if optional:
            return None
        raise Refusal(where, f"{label} {name!r} has no key {key!r}")
    return data[key]


@dataclass(frozen=True)
class Variable:
    """One definition of a container variable, in Kubernetes' order (``envFrom``, then ``env``)."""
    name: str
    value: str
    template: bool  # an env entry's ``value``: ``$(VAR)`` in it is expanded (:func:`anex_agent.wire.pod.resolve`)
    secret: bool  # taken from a Secret: never in the provision


def _environment(pod: Mapping[str, Any], container: Mapping[str, Any],
                 objects: Mapping[tuple[str, str], dict[str, str] | None],
                 warnings: list[str]) -> list[Variable]:
    """The container's variable definitions in order (a later one of a name wins)."""
    out: list[Variable] = []
    for i, source in enumerate(container.get("envFrom") or []):
        where = f"{CONTAINER}.envFrom[{i}]"
        kind, ref = ("secret", source["secretRef"]) if "secretRef" in source else (
            ("configmap", source["configMapRef"]) if "configMapRef" in source else (None, None))
        if kind is None or ref is None:
            raise Refusal(where, "expected secretRef or configMapRef")
        data = objects.get((kind, ref.get("name", "")))
        if data is None:
            if ref.get("optional"):
                continue
            label = "Secret" if kind == "secret" else "ConfigMap"
            raise Refusal(where, f"{label} {ref.get('name')!r} does not exist in the pod's namespace")
        prefix = source.get("prefix", "")
        for key in sorted(data):
            if ENV_NAME.fullmatch(prefix + key):
                out.append(Variable(prefix + key, data[key], template=False, secret=kind == "secret"))
            else:
                warnings.append(f"{where}: key {key!r} is not a variable name: left out")
    for i, var in enumerate(container.get("env") or []):
        where = f"{CONTAINER}.env[{i}]"
        name = var.get("name", "")
        source = var.get("valueFrom")
        if source is None:
            out.append(Variable(name, str(var.get("value", "")), template=True, secret=False))
            continue
        value: str | None
        if "secretKeyRef" in source:
            value = _key_ref("secret", source["secretKeyRef"], objects, f"{where}.valueFrom.secretKeyRef")
        elif "configMapKeyRef" in source:
            value = _key_ref("configmap", source["configMapKeyRef"], objects, f"{where}.valueFrom.configMapKeyRef")
        elif "fieldRef" in source:
            value = _field_value(pod, source["fieldRef"].get("fieldPath", ""), f"{where}.valueFrom.fieldRef")
            if value is None:
                warnings.append(f"{where}: {name} ({source['fieldRef'].get('fieldPath')}) is not known before the "
                                "machine is rented: left out")
        else:
            raise Refusal(f"{where}.valueFrom", f"{next(iter(source), 'this source')} is not supported; accepted: "
                          "secretKeyRef, configMapKeyRef, fieldRef")
        if value is not None:
            out.append(Variable(name, value, template=False, secret="secretKeyRef" in source))
    return out


def has_secret_env(pod: Mapping[str, Any]) -> bool:
    """Whether the container takes variables from Secrets (``secretKeyRef``, ``envFrom.secretRef``):
    then the agent, not the virtual node, expands ``$(VAR)`` (:func:`translate`, :func:`delivered_env`).
    Decided by the pod spec alone, so the provision and the pushed variables always agree."""
    for container in (_spec(pod).get("containers") or [])[:1]:
        if any("secretKeyRef" in (var.get("valueFrom") or {}) for var in container.get("env") or []):
            return True
        if any("secretRef" in source for source in container.get("envFrom") or []):
            return True
    return False


def fetched(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    """Every object the virtual node reads for the pod: :func:`references` and its ``imagePullSecrets``."""
    return references(pod) | {("secret", name) for name in pullsecrets.names(pod)}


def delivers(pod: Mapping[str, Any]) -> bool:
    """Whether the virtual node pushes files to the pod's machine (ConfigMap or Secret volumes, or
    variables from Secrets): then the agent waits for them (``ANEX_POD_FILES``)."""
    return bool(podfiles.references(pod)) or any(kind == "secret" for kind, _name in references(pod))


def delivered_env(pod: Mapping[str, Any],
                  objects: Mapping[tuple[str, str], dict[str, str] | None]) -> list[list[Any]] | None:
    """For a pod with variables from Secrets (:func:`has_secret_env`), what the caller pushes to the
    agent as :data:`anex_agent.wire.pod.ENV_FILE` (never in the provision): every variable definition
    of the container in order, ``[NAME, VALUE, TEMPLATE]``, templates raw; the agent defines them with
    :func:`anex_agent.wire.pod.resolve` and expands the command and arguments once. None otherwise."""
    if not has_secret_env(pod):
        return None
    container = (_spec(pod).get("containers") or [{}])[0]
    return [[v.name, v.value, v.template] for v in _environment(pod, container, objects, [])]


def _gpus(container: Mapping[str, Any]) -> str | None:
    resources = container.get("resources") or {}
    for part in ("limits", "requests"):
        value = (resources.get(part) or {}).get(GPU_RESOURCE)
        if value not in (None, ""):
            return str(value)
    return None


def _annotations(pod: Mapping[str, Any], container: Mapping[str, Any]) -> dict[str, str]:
    all_annotations = (pod.get("metadata") or {}).get("annotations") or {}
    chosen = {k: str(v) for k, v in all_annotations.items() if k.startswith(SELECTION_PREFIXES)}
    gpus = _gpus(container)
    says_count = any(k.split("/", 1)[1].startswith("gpu-count") for k in chosen)
    if gpus is not None and not says_count:
        chosen[GPU_COUNT] = gpus
    return chosen


def _ports(container: Mapping[str, Any], warnings: list[str]) -> tuple[list[int], list[int]]:
    """The container's TCP ports (published by the provider, served to the mesh) and UDP ports
    (served to the mesh only), each once, in the pod's order."""
    tcp: list[int] = []
    udp: list[int] = []
    for i, port in enumerate(container.get("ports") or []):
        protocol = port.get("protocol") or "TCP"
        if protocol not in ("TCP", "UDP"):
            warnings.append(f"{CONTAINER}.ports[{i}]: only TCP and UDP ports are carried; {protocol} left out")
            continue
        number = port.get("containerPort")
        chosen = tcp if protocol == "TCP" else udp
        if isinstance(number, int) and number not in chosen:
            chosen.append(number)
        if protocol == "UDP":
            warnings.append(f"{CONTAINER}.ports[{i}]: UDP port {number} reaches the pod over the mesh (its Services, "
                            "its pod IP), not at a public port of the provider (it publishes TCP ports only)")
    return tcp, udp


def _inbound_ports(tcp: list[int], udp: list[int], warnings: list[str]) -> list[str]:
    """The container's ports the mesh reaches on every engine (:data:`INBOUND_PORTS_ENV` items:
    ``PORT`` for TCP, ``PORT/udp``): all of them but the agent's own TCP ports
    (:data:`AGENT_PORTS`), which a warning names. (The agent listens on no UDP port: every UDP
    port is the workload's.)"""
    out = []
    for number in tcp:
        if number in AGENT_PORTS:
            warnings.append(f"{CONTAINER}.ports: {number} is {AGENT_PORTS[number]} port on the machine; a machine "
                            "whose agent runs the built-in engine does not serve it to the mesh")
        else:
            out.append(str(number))
    return out + [f"{number}/udp" for number in udp]


def _mount_warnings(pod: Mapping[str, Any], container: Mapping[str, Any]) -> list[str]:
    kinds = {v.get("name"): next((k for k in v if k != "name"), "") for v in _spec(pod).get("volumes") or []}
    out = []
    for mount in container.get("volumeMounts") or []:
        if mount.get("mountPath", "").rstrip("/") == SERVICE_ACCOUNT_MOUNT:
            continue  # the service account token: a rented machine does not talk to the API server
        kind = kinds.get(mount.get("name"), "")
        if kind not in ("emptyDir", *podfiles.DELIVERED):
            out.append(f"volume {mount.get('name')!r} ({kind}) is not delivered to the rented machine: "
                       f"{mount.get('mountPath')} will not hold its files; pass values through env or envFrom")
    return out


def _probe_port(container: Mapping[str, Any], port: Any, where: str) -> int:
    if isinstance(port, int) and not isinstance(port, bool):
        return port
    if isinstance(port, str) and port[:1] in "0123456789":
        try:
            return parse.port(port)
        except ValueError as err:
            raise Refusal(where, f"port {port!r} {err}") from None
    for declared in container.get("ports") or []:
        if declared.get("name") == port and isinstance(declared.get("containerPort"), int):
            return declared["containerPort"]
    raise Refusal(where, f"port {port!r} is not a number nor the name of one of the container's ports")


def _probe_host(host: Any, where: str) -> None:
    """A probe's host, when given, is a host name or an IP address (what the agent can dial)."""
    if host in (None, ""):
        return
    try:
        parse.host(host)
    except ValueError as err:
        raise Refusal(where, f"{host!r} {err}") from None


def _probes(pod: Mapping[str, Any], container: Mapping[str, Any]) -> str | None:
    """The container's probes as ``ANEX_PROBES`` (JSON, :mod:`anex_agent.agent.probe_spec`): named ports
    resolved, the pod's ``terminationGracePeriodSeconds`` as the kill's grace unless the probe says;
    None without probes. A gRPC probe is refused (the agent has no gRPC client), and so is a host that is
    not a host name or an IP address or an exec argument with a NUL (the agent could not run either)."""
    out: dict[str, Any] = {}
    for kind in PROBE_KINDS:
        probe = container.get(f"{kind}Probe")
        if not probe:
            continue
        where = f"{CONTAINER}.{kind}Probe"
        if probe.get("grpc") is not None:
            raise Refusal(f"{where}.grpc", "gRPC probes are not supported; probe the service with exec (e.g. "
                          "grpc_health_probe) or tcpSocket")
        carried = {k: v for k, v in probe.items() if k in PROBE_TIMINGS and v is not None}
        if "exec" in probe:
            command = [str(a) for a in (probe["exec"] or {}).get("command") or []]
            for i, arg in enumerate(command):
                if "\0" in arg:
                    raise Refusal(f"{where}.exec.command[{i}]", "contains a NUL character, which no program "
                                  "argument can hold")
            carried["exec"] = {"command": command}
        elif "httpGet" in probe:
            get = dict(probe["httpGet"] or {})
            get["port"] = _probe_port(container, get.get("port"), f"{where}.httpGet.port")
            _probe_host(get.get("host"), f"{where}.httpGet.host")
            carried["httpGet"] = {k: v for k, v in get.items() if v not in (None, "")}
        elif "tcpSocket" in probe:
            sock = dict(probe["tcpSocket"] or {})
            sock["port"] = _probe_port(container, sock.get("port"), f"{where}.tcpSocket.port")
            _probe_host(sock.get("host"), f"{where}.tcpSocket.host")
            carried["tcpSocket"] = {k: v for k, v in sock.items() if v not in (None, "")}
        else:
            raise Refusal(where, "expected exec, httpGet or tcpSocket")
        grace = (pod.get("spec") or {}).get("terminationGracePeriodSeconds")
        if kind != "readiness" and "terminationGracePeriodSeconds" not in carried and isinstance(grace, int) \
                and grace > 0:
            carried["terminationGracePeriodSeconds"] = grace
        out[kind] = carried
    return json.dumps(out, separators=(",", ":"), sort_keys=True) if out else None


def _field_of(err: ValidationError) -> str:
    loc = err.errors()[0].get("loc", ()) if err.errors() else ()
    first = str(loc[0]) if loc else ""
    rest = ".".join(str(p) for p in loc[1:])
    where = {"image": f"{CONTAINER}.image", "command": f"{CONTAINER}.command", "args": f"{CONTAINER}.args",
             "env": f"{CONTAINER}.env", "ports": f"{CONTAINER}.ports",
             "annotations": "metadata.annotations"}.get(first, first)
    return f"{where}.{rest}" if rest else where


def translate(pod: Mapping[str, Any], objects: Mapping[tuple[str, str], dict[str, str] | None], *,
              prefix: str) -> Translation:
    """The provision for ``pod`` (see the module docstring); :class:`Refusal` naming the field."""
    check_pod(pod)
    container = _spec(pod)["containers"][0]
    warnings: list[str] = []
    variables = _environment(pod, container, objects, warnings)
    command = [str(a) for a in container.get("command") or []]
    args = [str(a) for a in container.get("args") or []]
    if has_secret_env(pod):  # the agent expands, once, with the values from Secrets (delivered_env)
        last = {v.name: v for v in variables}
        env = {name: v.value for name, v in last.items() if not v.secret}
    else:
        env = resolve((v.name, v.value, v.template) for v in variables)
        command, args = [expand(a, env) for a in command], [expand(a, env) for a in args]
    ports, udp_ports = _ports(container, warnings)
    inbound = _inbound_ports(ports, udp_ports, warnings)
    if inbound and INBOUND_PORTS_ENV not in env:  # the pod's own value wins
        env[INBOUND_PORTS_ENV] = ",".join(inbound)
    warnings += _mount_warnings(pod, container)
    env[RESTART_POLICY_ENV] = str(_spec(pod).get("restartPolicy") or "Always")  # the API server's default
    probes = _probes(pod, container)
    if probes is not None:
        env[PROBES_ENV] = probes
    dirs = podfiles.plan(pod, objects)
    if delivers(pod):
        env[POD_FILES_ENV] = json.dumps({"dirs": dirs}, separators=(",", ":"))
    uid = (pod.get("metadata") or {}).get("uid", "")
    if not uid:
        raise Refusal("metadata.uid", "is missing")
    pulls = {name: objects.get(("secret", name)) for name in pullsecrets.names(pod)}
    login = pullsecrets.login_for(container["image"].strip(), pulls, warnings)
    try:
        spec = ProvisionCreate(name=provision_name(prefix, uid), image=container["image"].strip(), registry_auth=login,
                               command=command, args=args,
                               env=env, ports=ports, annotations=_annotations(pod, container))
    except ValidationError as err:
        detail = err.errors()[0].get("msg", "is not accepted") if err.errors() else "is not accepted"
        raise Refusal(_field_of(err), detail) from None
    return Translation(spec, tuple(warnings))
