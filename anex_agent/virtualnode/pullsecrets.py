"""A pod's ``imagePullSecrets`` to the registry login a provider pulls its image with (pure).

:func:`names` lists the pod's pull secrets; the caller reads them (``None`` for one that does
not exist) and :func:`login_for` picks, as a kubelet does, the first login whose registry is the
image's: the image's registry is its first path component when that holds a ``.`` or a ``:`` or
is ``localhost``, else Docker Hub (``docker.io``, which ``index.docker.io``,
``registry-1.docker.io`` and ``https://index.docker.io/v1/`` also name). A secret of type
``kubernetes.io/dockerconfigjson`` (``.dockerconfigjson``: ``{"auths": {REGISTRY: {...}}}``) or
``kubernetes.io/dockercfg`` (``.dockercfg``: the map itself) gives ``username`` and ``password``,
or ``auth`` (base64 of ``user:password``). What cannot be used is said in the warnings (a
kubelet goes on without it too: a public image needs none); a login the provider cannot pass
on (a space or a control character in it, or a leading ``-``: :class:`RegistryAuth`) is a
:class:`Refusal` naming the pull secret.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from typing import Any

from pydantic import ValidationError

from anex_agent.virtualnode.refusal import Refusal
from anex_agent.wire.provisioning import RegistryAuth

DOCKER_HUB = "docker.io"
_HUB_NAMES = {"docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com"}


def names(pod: Mapping[str, Any]) -> list[str]:
    return [str(s.get("name", "")) for s in (pod.get("spec") or {}).get("imagePullSecrets") or [] if s.get("name")]


def registry_of(image: str) -> str:
    first, sep, _rest = image.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return DOCKER_HUB if first in _HUB_NAMES else first
    return DOCKER_HUB


def _host(key: str) -> str:
    host = key.split("://", 1)[-1].split("/", 1)[0]
    return DOCKER_HUB if host in _HUB_NAMES else host


def _entries(secret: Mapping[str, str]) -> dict[str, Any]:
    if ".dockerconfigjson" in secret:
        doc = json.loads(secret[".dockerconfigjson"])
        return dict(doc.get("auths") or {}) if isinstance(doc, dict) else {}
    if ".dockercfg" in secret:
        doc = json.loads(secret[".dockercfg"])
        return dict(doc) if isinstance(doc, dict) else {}
    return {}


def _credentials(entry: Any) -> tuple[str, str] | None:
    if not isinstance(entry, dict):
        return None
    user, password = entry.get("username"), entry.get("password")
    if not (user and password) and entry.get("auth"):
        try:
            user, _, password = base64.b64decode(str(entry["auth"]), validate=True).decode().partition(":")
        except (binascii.Error, UnicodeDecodeError, ValueError):
            return None
    return (str(user), str(password)) if user and password else None


def login_for(image: str, secrets: Mapping[str, Mapping[str, str] | None],
              warnings: list[str]) -> RegistryAuth | None:
    """The login for ``image`` from the pull secrets ``secrets`` (name -> its data, in the pod's order)."""
    registry = registry_of(image)
    for index, (name, data) in enumerate(secrets.items()):
        if data is None:
            warnings.append(f"spec.imagePullSecrets: Secret {name!r} does not exist in the pod's namespace: left out")
            continue
        try:
            entries = _entries(data)
        except ValueError:
            warnings.append(f"spec.imagePullSecrets: Secret {name!r} is not a docker config (JSON): left out")
            continue
        for key, entry in entries.items():
            found = _credentials(entry)
            if _host(key) == registry and found is not None:
                try:
                    return RegistryAuth(server=registry, username=found[0], password=found[1])
                except ValidationError as err:
                    problem = err.errors()[0]
                    where = ".".join(str(p) for p in problem.get("loc", ()))
                    message = str(problem.get("msg", "is not accepted")).removeprefix("Value error, ")
                    raise Refusal(f"spec.imagePullSecrets[{index}]",
                                  f"Secret {name!r}: its login for {registry} cannot be used: registry_auth.{where} "
                                  f"{message}") from None
    if secrets:
        warnings.append(f"spec.imagePullSecrets: no login for the registry {registry} of the image {image}: the "
                        "provider pulls it without one")
    return None
