"""A pod's ConfigMap and Secret volumes as the files the agent writes on the machine (pure: no I/O).

Contract:

* :func:`references` lists the ConfigMaps and Secrets the container's mounts read;
* :func:`plan` checks the mounts (:class:`~anex_agent.virtualnode.podspec.Refusal` naming the
  field: a relative ``mountPath``, one that is (or, with ``subPath``, lies directly in) ``/``
  or overlaps the agent's own directory (:func:`anex_agent.wire.pod.unsafe_dir`), an item ``path`` that is absolute or holds ``..``, a volume
  missing that is not ``optional``) and returns the directories that will hold files, which
  travel in the provision as ``ANEX_POD_FILES`` (:mod:`anex_agent.agent.pod_files`): paths only,
  never a value;
* :func:`files` resolves them against the objects as the API server returns them (``None`` for
  one that does not exist): one :class:`PodFile` per key (or per listed ``items`` entry, at its
  ``path``), with the item's ``mode``, else the volume's ``defaultMode`` (which the API server
  sets to 0644 when the pod does not), else 0644 for a ConfigMap and 0600 for a Secret (a pod
  that did not pass the API server's defaulting); a ``subPath`` mount is the one file at
  ``mountPath``. ConfigMap ``data`` and ``binaryData``, Secret ``data`` (base64) are written as
  bytes, unchanged.

The service account token's mount is left out (a rented machine does not call the API server);
``projected`` and ``downwardAPI`` volumes are accepted and not delivered (the pod spec module says
so in a warning).
"""

from __future__ import annotations

import base64
import binascii
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from anex_agent.virtualnode.refusal import Refusal
from anex_agent.wire.pod import unsafe_dir

SERVICE_ACCOUNT_MOUNT = "/var/run/secrets/kubernetes.io/serviceaccount"
DELIVERED = ("configMap", "secret")
CONTAINER = "spec.containers[0]"
DEFAULT_MODES = {"configmap": 0o644, "secret": 0o600}


@dataclass(frozen=True)
class PodFile:
    path: str
    data: bytes
    mode: int


def _refusal(field: str, message: str) -> Exception:
    return Refusal(field, message)


def _source(volume: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]] | None:
    """(kind, object name, the volume's source) of a ConfigMap or Secret volume; None for another."""
    if volume.get("configMap") is not None:
        return "configmap", str(volume["configMap"].get("name", "")), volume["configMap"]
    if volume.get("secret") is not None:
        return "secret", str(volume["secret"].get("secretName", "")), volume["secret"]
    return None


def _mounts(pod: Mapping[str, Any]) -> list[tuple[int, Mapping[str, Any], Mapping[str, Any]]]:
    """(index, mount, volume) of the container's mounts of ConfigMap and Secret volumes."""
    spec = pod.get("spec") or {}
    volumes = {v.get("name"): v for v in spec.get("volumes") or []}
    container = (spec.get("containers") or [{}])[0]
    out = []
    for i, mount in enumerate(container.get("volumeMounts") or []):
        volume = volumes.get(mount.get("name")) or {}
        if _source(volume) is not None and mount.get("mountPath", "").rstrip("/") != SERVICE_ACCOUNT_MOUNT:
            out.append((i, mount, volume))
    return out


def references(pod: Mapping[str, Any]) -> set[tuple[str, str]]:
    return {(kind, name) for _i, _m, volume in _mounts(pod) for kind, name, _s in [_source(volume)]}


def _clean(path: str, field: str, *, absolute: bool) -> str:
    parts = path.split("/")
    if not path or "\0" in path or path.startswith("/") != absolute or any(p in ("..",) for p in parts):
        raise _refusal(field, f"{path!r} must be an {'absolute' if absolute else 'relative'} path without '..'")
    return posixpath.normpath(path)


def _mode(value: Any, field: str, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0o777:
        raise _refusal(field, f"{value!r} is not a file mode from 0 to 0777 (511)")
    return value


def plan(pod: Mapping[str, Any], objects: Mapping[tuple[str, str], Any]) -> list[str]:
    """The directories that will hold the pod's files (see the module docstring); Refusal naming the field."""
    dirs: list[str] = []
    for i, mount, volume in _mounts(pod):
        where = f"{CONTAINER}.volumeMounts[{i}]"
        kind, name, source = _source(volume)  # type: ignore[misc]
        target = _clean(str(mount.get("mountPath", "")), f"{where}.mountPath", absolute=True)
        if objects.get((kind, name)) is None and not source.get("optional"):
            label = "Secret" if kind == "secret" else "ConfigMap"
            raise _refusal(f"{where}.name", f"volume {mount.get('name')!r}: {label} {name!r} does not exist in the "
                           "pod's namespace")
        _mode(source.get("defaultMode"), f"volumes[{mount.get('name')}].defaultMode", 0)
        directory = posixpath.dirname(target) if mount.get("subPath") else target
        why = unsafe_dir(directory)
        if why:
            raise _refusal(f"{where}.mountPath", f"volume {mount.get('name')!r} at {target!r}: {why}; mount it in "
                           "a directory of its own (e.g. /etc/app)")
        dirs.append(directory)
        if mount.get("subPath"):
            continue
        for j, item in enumerate(source.get("items") or []):
            rel = _clean(str(item.get("path", "")), f"volumes[{mount.get('name')}].items[{j}].path", absolute=False)
            _mode(item.get("mode"), f"volumes[{mount.get('name')}].items[{j}].mode", 0)
            parent = posixpath.dirname(rel)
            while parent:
                dirs.append(posixpath.join(target, parent))
                parent = posixpath.dirname(parent)
    return sorted(set(dirs), key=lambda d: (d.count("/"), d))


def object_bytes(kind: str, obj: Mapping[str, Any] | None) -> dict[str, bytes] | None:
    """Every key of a ConfigMap (``data``, ``binaryData``) or a Secret (``data``) as bytes."""
    if obj is None:
        return None
    out: dict[str, bytes] = {}
    if kind == "configmap":
        out.update({k: str(v).encode() for k, v in (obj.get("data") or {}).items()})
    for key, value in (obj.get("binaryData" if kind == "configmap" else "data") or {}).items():
        try:
            out[key] = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            continue
    return out


def files(pod: Mapping[str, Any], objects: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> list[PodFile]:
    """The pod's files from the objects as the API server returns them; Refusal for a missing one."""
    plan(pod, objects)
    out: list[PodFile] = []
    for i, mount, volume in _mounts(pod):
        where = f"{CONTAINER}.volumeMounts[{i}]"
        kind, name, source = _source(volume)  # type: ignore[misc]
        data = object_bytes(kind, objects.get((kind, name)))
        if data is None:
            continue  # optional and absent: an empty volume
        default = _mode(source.get("defaultMode"), "defaultMode", DEFAULT_MODES[kind])
        target = posixpath.normpath(str(mount["mountPath"]))
        chosen: list[tuple[str, str, int]] = []  # (key, relative path, mode)
        if source.get("items"):
            for j, item in enumerate(source["items"]):
                key = str(item.get("key", ""))
                if key not in data:
                    if source.get("optional"):
                        continue
                    label = "Secret" if kind == "secret" else "ConfigMap"
                    raise _refusal(f"volumes[{mount.get('name')}].items[{j}].key", f"{label} {name!r} has no key {key!r}")
                chosen.append((key, posixpath.normpath(str(item["path"])), _mode(item.get("mode"), "mode", default)))
        else:
            chosen = [(key, key, default) for key in sorted(data)]
        sub = mount.get("subPath")
        if sub:
            match = next(((k, m) for k, rel, m in chosen if rel == sub), None)
            if match is None:
                raise _refusal(f"{where}.subPath", f"{sub!r} is not a file of volume {mount.get('name')!r}")
            out.append(PodFile(target, data[match[0]], match[1]))
            continue
        out += [PodFile(posixpath.join(target, rel), data[key], mode) for key, rel, mode in chosen]
    return out
