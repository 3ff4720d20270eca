"""Which ``nodes/<subresource>`` and verb a request to the kubelet port needs (pure).

The kubelet's mapping (its server's auth attributes, with fine-grained authorization, which
is always on since Kubernetes 1.36), so that RBAC written for kubelets means the same here:

=====================================  =========================================
path                                   subresources checked (any one allows)
=====================================  =========================================
``/stats``, ``/stats/...``             ``stats``
``/metrics``, ``/metrics/...``         ``metrics``
``/logs``, ``/logs/...``               ``log``
``/pods``, ``/pods/...``               ``pods``, then ``proxy``
``/healthz``, ``/healthz/...``         ``healthz``, then ``proxy``
``/runningpods/...``                   ``pods``, then ``proxy``
anything else (``/containerLogs``,     ``proxy``
``/exec``, ``/attach``,
``/portForward``, ``/run``)
=====================================  =========================================

The verb comes from the HTTP method: POST create, GET get, PUT update, PATCH patch, DELETE
delete (any other method: an empty verb, which no rule grants).
"""

from __future__ import annotations

from dataclasses import dataclass

VERBS = {"POST": "create", "GET": "get", "PUT": "update", "PATCH": "patch", "DELETE": "delete"}
#: (path, its fine-grained subresource): checked before ``proxy``
_FINE = (("/pods", "pods"), ("/healthz", "healthz"), ("/configz", "configz"), ("/runningpods", "pods"))
_COARSE = (("/stats", "stats"), ("/metrics", "metrics"), ("/logs", "log"), ("/checkpoint", "checkpoint"),
           ("/statusz", "statusz"), ("/flagz", "configz"))


@dataclass(frozen=True)
class Attributes:
    """One SubjectAccessReview's resource attributes: ``verb`` on ``nodes/<subresource>`` ``name``."""

    verb: str
    subresource: str
    name: str


def is_subpath(path: str, prefix: str) -> bool:
    """``path`` is ``prefix`` or below it (``/stats`` and ``/stats/summary``, not ``/statsx``)."""
    prefix = prefix.rstrip("/")
    return path == prefix or path.startswith(prefix + "/")


def subresources(path: str) -> tuple[str, ...]:
    fine = [sub for prefix, sub in _FINE if is_subpath(path, prefix)][:1]
    coarse = next((sub for prefix, sub in _COARSE if is_subpath(path, prefix)), "proxy")
    return (*fine, coarse)


def attributes(method: str, path: str, node_name: str) -> tuple[Attributes, ...]:
    """What to ask about a ``method`` request for ``path`` on Node ``node_name``, in order; the
    request is allowed when any one is."""
    verb = VERBS.get(method.upper(), "")
    return tuple(Attributes(verb, sub, node_name) for sub in subresources(path))
