"""The Kubernetes API as the virtual node uses it: kubernetes_asyncio underneath, plain dicts on top.

Contract:
* :func:`connect` builds the ``ApiClient`` from a kubeconfig file (``--kubeconfig`` /
  ``KUBECONFIG``) or, without one, from the pod's service account (in-cluster).
* Every :class:`KubeApi` method sends one request and answers the object as the API's JSON
  (a dict: ``_preload_content=False``, so nothing above depends on the client's model
  classes), or raises :class:`~anex_agent.errors.KubeError` (``status``, ``reason``,
  ``retryable``). ``get_*`` answer None for a 404.
* A 403 (a permission the ClusterRole lacks) is logged once per verb and resource as one line
  naming both, then raised like any other KubeError: callers retry later, nothing crashes.
* :meth:`KubeApi.watch_pods` yields ``(type, object)`` for one watch call (``ADDED``,
  ``MODIFIED``, ``DELETED``; ``BOOKMARK`` events are dropped); it ends when the server closes
  the watch, and raises KubeError 410 (``Expired``) when ``resource_version`` is too old: list
  again.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from anex_agent.errors import ConfigError, KubeError

log = logging.getLogger(__name__)

MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_PATCH = "application/strategic-merge-patch+json"
WATCH_TIMEOUT = 300  # seconds the API server keeps one pod watch open (then we watch again from where we were)
REQUEST_TIMEOUT = 30


async def connect(kubeconfig: str | None, source: str = "--kubeconfig"):
    """An ``ApiClient``: from ``kubeconfig`` when given (``source`` names where it came from), else
    the in-cluster service account."""
    from kubernetes_asyncio import client, config
    from kubernetes_asyncio.config.config_exception import ConfigException

    if kubeconfig and not Path(kubeconfig).is_file():
        raise ConfigError(source, f"{kubeconfig}: no such file; expected a kubeconfig")
    configuration = client.Configuration()
    try:
        if kubeconfig:
            await config.load_kube_config(config_file=kubeconfig, client_configuration=configuration)
        else:
            config.load_incluster_config(client_configuration=configuration)
    except (ConfigException, OSError, ValueError) as err:
        what = kubeconfig if kubeconfig else "the in-cluster service account"
        hint = "" if kubeconfig else " (outside a cluster, give --kubeconfig or KUBECONFIG)"
        raise ConfigError(source if kubeconfig else "KUBECONFIG",
                          f"cannot load {what}: {str(err).splitlines()[0] if str(err) else type(err).__name__}"
                          f"{hint}") from None
    return client.ApiClient(configuration)


class KubeApi:
    """The calls of the virtual node (see the module docstring)."""

    def __init__(self, api_client: Any) -> None:
        from kubernetes_asyncio import client

        self.api_client = api_client
        self.core = client.CoreV1Api(api_client)
        self.coordination = client.CoordinationV1Api(api_client)
        self._forbidden_logged: set[tuple[str, str]] = set()

    async def close(self) -> None:
        await self.api_client.close()

    # ------------------------------------------------------------ plumbing

    async def _json(self, verb: str, resource: str, call, *args: Any, missing_ok: bool = False, **kwargs: Any
                    ) -> dict[str, Any] | None:
        from aiohttp import ClientError
        from kubernetes_asyncio.client.exceptions import ApiException

        try:
            response = await call(*args, _preload_content=False, _request_timeout=REQUEST_TIMEOUT, **kwargs)
        except ApiException as err:  # raised before an answer (bad arguments): a bug, said plainly
            raise KubeError(f"{verb} {resource}: {err.reason}", status=err.status or None) from None
        except (ClientError, OSError, asyncio.TimeoutError) as err:
            raise KubeError(f"{verb} {resource}: the API server did not answer ({err or type(err).__name__})") from None
        try:
            raw = await response.read()
        except (ClientError, OSError, asyncio.TimeoutError) as err:
            raise KubeError(f"{verb} {resource}: the answer was cut ({err or type(err).__name__})") from None
        finally:
            response.release()
        status = response.status
        try:
            doc = json.loads(raw) if raw else {}
        except ValueError:
            doc = {}
        if 200 <= status < 300:
            return doc
        if status == 404 and missing_ok:
            return None
        self._raise(verb, resource, status, doc)

    def _raise(self, verb: str, resource: str, status: int, doc: dict[str, Any]):
        reason = str(doc.get("reason") or "")
        message = str(doc.get("message") or reason or f"HTTP {status}")
        if status == 403 and (verb, resource) not in self._forbidden_logged:
            self._forbidden_logged.add((verb, resource))
            log.error("forbidden: the virtual node's service account may not %s %s; grant it in the ClusterRole "
                      "(deploy/rbac.yaml)", verb, resource)
        raise KubeError(f"{verb} {resource}: {status} {message}", status=status, reason=reason)

    # ------------------------------------------------------------ nodes and leases

    async def get_node(self, name: str) -> dict[str, Any] | None:
        return await self._json("get", "nodes", self.core.read_node, name, missing_ok=True)

    async def create_node(self, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("create", "nodes", self.core.create_node, body)

    async def patch_node(self, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        return await self._json("patch", "nodes", self.core.patch_node, name, patch, _content_type=MERGE_PATCH)

    async def patch_node_status(self, name: str, status: dict[str, Any]) -> dict[str, Any]:
        return await self._json("patch", "nodes/status", self.core.patch_node_status, name, {"status": status},
                                _content_type=MERGE_PATCH)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json("get", f"leases in {namespace}", self.coordination.read_namespaced_lease, name,
                                namespace, missing_ok=True)

    async def create_lease(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("create", f"leases in {namespace}", self.coordination.create_namespaced_lease,
                                namespace, body)

    async def replace_lease(self, namespace: str, name: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("update", f"leases in {namespace}", self.coordination.replace_namespaced_lease,
                                name, namespace, body)

    # ------------------------------------------------------------ pods

    async def list_pods(self, field_selector: str) -> dict[str, Any]:
        """``PodList`` (``items``, ``metadata.resourceVersion``) of every namespace."""
        return await self._json("list", "pods", self.core.list_pod_for_all_namespaces, field_selector=field_selector)

    async def watch_pods(self, field_selector: str, resource_version: str) -> AsyncIterator[tuple[str, dict]]:
        from aiohttp import ClientError

        try:
            response = await self.core.list_pod_for_all_namespaces(
                field_selector=field_selector, resource_version=resource_version, watch=True,
                allow_watch_bookmarks=True, timeout_seconds=WATCH_TIMEOUT, _preload_content=False,
                _request_timeout=WATCH_TIMEOUT + 30)
        except (ClientError, OSError, asyncio.TimeoutError) as err:
            raise KubeError(f"watch pods: the API server did not answer ({err or type(err).__name__})") from None
        try:
            if response.status >= 300:
                raw = await response.read()
                self._raise("watch", "pods", response.status, _loads(raw))
            while True:
                try:
                    line = await response.content.readline()
                except (ClientError, OSError, asyncio.TimeoutError, ValueError) as err:  # ValueError: a line too long
                    raise KubeError(f"watch pods: connection lost ({err or type(err).__name__})") from None
                if not line:
                    return
                event = _loads(line)
                kind, obj = event.get("type"), event.get("object") or {}
                if kind == "ERROR":
                    self._raise("watch", "pods", int(obj.get("code") or 500), obj)
                if kind in ("ADDED", "MODIFIED", "DELETED"):
                    yield kind, obj
        finally:
            response.release()

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json("get", "pods", self.core.read_namespaced_pod, name, namespace, missing_ok=True)

    async def patch_pod(self, namespace: str, name: str, patch: dict[str, Any], *,
                        content_type: str = STRATEGIC_PATCH) -> dict[str, Any] | None:
        """None when the pod is gone."""
        return await self._json("patch", "pods", self.core.patch_namespaced_pod, name, namespace, patch,
                                missing_ok=True, _content_type=content_type)

    async def patch_pod_status(self, namespace: str, name: str, status: dict[str, Any]) -> dict[str, Any] | None:
        """A merge patch of the status subresource; None when the pod is gone."""
        return await self._json("patch", "pods/status", self.core.patch_namespaced_pod_status, name, namespace,
                                {"status": status}, missing_ok=True, _content_type=MERGE_PATCH)

    async def delete_pod(self, namespace: str, name: str, uid: str, *, grace: int = 0) -> bool:
        """Delete this very pod (``uid`` precondition) with ``grace`` seconds; False when it was gone already."""
        body = {"apiVersion": "v1", "kind": "DeleteOptions", "gracePeriodSeconds": grace,
                "preconditions": {"uid": uid}}
        try:
            return await self._json("delete", "pods", self.core.delete_namespaced_pod, name, namespace, body=body,
                                    missing_ok=True) is not None
        except KubeError as err:
            if err.status != 409:  # a precondition failed: another pod of that name now; not ours to delete
                raise
            return False

    # ------------------------------------------------------------ what pods refer to, and events

    async def get_secret(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json("get", "secrets", self.core.read_namespaced_secret, name, namespace, missing_ok=True)

    async def get_config_map(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._json("get", "configmaps", self.core.read_namespaced_config_map, name, namespace,
                                missing_ok=True)

    async def create_event(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self._json("create", "events", self.core.create_namespaced_event, namespace, body)


def _loads(raw: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(raw)
    except ValueError:
        return {}
    return doc if isinstance(doc, dict) else {}
