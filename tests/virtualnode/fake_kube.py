"""An in-memory API server with the methods of anex_agent.virtualnode.kube.KubeApi (plain dicts).

Pods are kept by uid; a watch per ``spec.nodeName`` selector sees every change after the list.
Deleting a pod with finalizers only marks it (``deletionTimestamp``), as the API server does;
it goes once the last finalizer is removed, or with grace 0 when none is left. Every change
notifies :attr:`FakeKube.changed` (an asyncio.Condition), so tests wait for what they expect.
"""

from __future__ import annotations

import asyncio
import copy
import itertools
from typing import Any

from anex_agent.errors import KubeError


def _merge(target: dict, patch: dict) -> dict:
    """RFC 7386 JSON merge patch."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class FakeKube:
    def __init__(self) -> None:
        self.pods: dict[str, dict[str, Any]] = {}
        self.nodes: dict[str, dict[str, Any]] = {}
        self.leases: dict[str, dict[str, Any]] = {}
        self.secrets: dict[tuple[str, str], dict] = {}
        self.events: list[dict[str, Any]] = []
        self.forbidden: set[str] = set()  # "verb resource" answered 403
        self.changed = asyncio.Condition()
        self._version = itertools.count(1)
        self._watchers: list[tuple[str, asyncio.Queue]] = []
        self.list_gate: asyncio.Event | None = None  # when set, a pod list waits for it (a slow API server)

    # ------------------------------------------------------------ helpers for tests

    async def wait(self, predicate, what: str, timeout: float = 20.0):
        async with self.changed:
            try:
                return await asyncio.wait_for(self.changed.wait_for(predicate), timeout)
            except TimeoutError:
                raise AssertionError(f"timed out waiting for {what}; pods: {self.pods}") from None

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    def _stamp(self, pod: dict) -> dict:
        pod["metadata"]["resourceVersion"] = str(next(self._version))
        return pod

    async def _emit(self, kind: str, pod: dict) -> None:
        for node, queue in self._watchers:
            if (pod.get("spec") or {}).get("nodeName") == node:
                queue.put_nowait((kind, copy.deepcopy(pod)))
        await self._notify()

    async def add_pod(self, pod: dict) -> None:
        pod = self._stamp(copy.deepcopy(pod))
        self.pods[pod["metadata"]["uid"]] = pod
        await self._emit("ADDED", pod)

    async def user_deletes(self, uid: str) -> None:
        """``kubectl delete pod``: the default grace period, so only marked while a finalizer or no kubelet says so."""
        pod = self.pods[uid]
        pod["metadata"]["deletionTimestamp"] = "2026-11-27T12:00:00Z"
        pod["metadata"]["deletionGracePeriodSeconds"] = 30
        await self._emit("MODIFIED", self._stamp(pod))

    def pod(self, uid: str) -> dict | None:
        return self.pods.get(uid)

    def reasons(self, uid: str) -> list[str]:
        return [e["reason"] for e in self.events if e["involvedObject"]["uid"] == uid]

    def _check(self, verb: str, resource: str) -> None:
        if f"{verb} {resource}" in self.forbidden:
            raise KubeError(f"{verb} {resource}: 403 forbidden", status=403, reason="Forbidden")

    # ------------------------------------------------------------ KubeApi

    async def list_pods(self, field_selector: str) -> dict:
        self._check("list", "pods")
        if self.list_gate is not None:
            await self.list_gate.wait()
        node = field_selector.split("=", 1)[1]
        return {"metadata": {"resourceVersion": "1"},
                "items": [copy.deepcopy(p) for p in self.pods.values() if p["spec"].get("nodeName") == node]}

    async def watch_pods(self, field_selector: str, resource_version: str):
        node = field_selector.split("=", 1)[1]
        queue: asyncio.Queue = asyncio.Queue()
        entry = (node, queue)
        self._watchers.append(entry)
        try:
            while True:
                yield await queue.get()
        finally:
            self._watchers.remove(entry)

    async def patch_pod(self, namespace: str, name: str, patch: dict, *, content_type: str = "") -> dict | None:
        self._check("patch", "pods")
        pod = next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)
        if pod is None:
            return None
        wanted = (patch.get("metadata") or {}).get("resourceVersion")
        if wanted and wanted != pod["metadata"]["resourceVersion"]:
            raise KubeError("patch pods: 409 conflict", status=409, reason="Conflict")
        meta_patch = {k: v for k, v in (patch.get("metadata") or {}).items() if k != "resourceVersion"}
        pod["metadata"] = _merge(pod["metadata"], meta_patch)
        if pod["metadata"].get("deletionTimestamp") and not pod["metadata"].get("finalizers"):
            del self.pods[pod["metadata"]["uid"]]
            await self._emit("DELETED", pod)
            return copy.deepcopy(pod)
        await self._emit("MODIFIED", self._stamp(pod))
        return copy.deepcopy(pod)

    async def patch_pod_status(self, namespace: str, name: str, status: dict) -> dict | None:
        self._check("patch", "pods/status")
        pod = next((p for p in self.pods.values() if p["metadata"]["name"] == name), None)
        if pod is None:
            return None
        pod["status"] = _merge(pod.get("status") or {}, status)
        await self._emit("MODIFIED", self._stamp(pod))
        return copy.deepcopy(pod)

    async def delete_pod(self, namespace: str, name: str, uid: str, *, grace: int = 0) -> bool:
        self._check("delete", "pods")
        pod = self.pods.get(uid)
        if pod is None:
            return False
        if pod["metadata"].get("finalizers"):
            pod["metadata"].setdefault("deletionTimestamp", "2026-11-27T12:00:00Z")
            await self._emit("MODIFIED", self._stamp(pod))
            return True
        del self.pods[uid]
        await self._emit("DELETED", pod)
        return True

    async def get_secret(self, namespace: str, name: str) -> dict | None:
        self._check("get", "secrets")
        return self.secrets.get((namespace, name))

    async def get_config_map(self, namespace: str, name: str) -> dict | None:
        return None

    async def create_event(self, namespace: str, body: dict) -> dict:
        self._check("create", "events")
        self.events.append(body)
        await self._notify()
        return body

    async def get_node(self, name: str) -> dict | None:
        return copy.deepcopy(self.nodes.get(name))

    async def create_node(self, body: dict) -> dict:
        self._check("create", "nodes")
        body = copy.deepcopy(body)
        body["metadata"]["uid"] = f"uid-{name}" if (name := body["metadata"]["name"]) else "uid"
        self.nodes[name] = body
        await self._notify()
        return copy.deepcopy(body)

    async def patch_node(self, name: str, patch: dict) -> dict:
        self.nodes[name] = _merge(self.nodes[name], patch)
        return copy.deepcopy(self.nodes[name])

    async def patch_node_status(self, name: str, status: dict) -> dict:
        self._check("patch", "nodes/status")
        if name not in self.nodes:
            raise KubeError(f'patch nodes/status: 404 nodes "{name}" not found', status=404, reason="NotFound")
        self.nodes[name]["status"] = status
        await self._notify()
        return copy.deepcopy(self.nodes[name])

    async def get_lease(self, namespace: str, name: str) -> dict | None:
        return copy.deepcopy(self.leases.get(name))

    async def create_lease(self, namespace: str, body: dict) -> dict:
        self.leases[body["metadata"]["name"]] = copy.deepcopy(body)
        await self._notify()
        return body

    async def replace_lease(self, namespace: str, name: str, body: dict) -> dict:
        self.leases[name] = copy.deepcopy(body)
        await self._notify()
        return body
