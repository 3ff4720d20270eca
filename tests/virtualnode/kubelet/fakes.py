"""A coordinator with the calls the kubelet port makes, in memory, and a kubelet context on it."""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from types import SimpleNamespace

from anex_agent.errors import CoordinatorError
from anex_agent.wire.provisioning import ProvisionList, ProvisionState, ProvisionView
from anex_agent.virtualnode.kubelet.auth import ClusterAuthorizer
from anex_agent.virtualnode.kubelet.context import KubeletContext, User
from anex_agent.virtualnode.kubelet.locator import CoordinatorPodLocator

NODE = "anex-vastai"
T0 = datetime(2026, 11, 27, 10, tzinfo=timezone.utc)


def pod(name, uid, node=NODE, namespace="ml", containers=("training",)):
    return {"metadata": {"name": name, "namespace": namespace, "uid": uid},
            "spec": {"nodeName": node, "containers": [{"name": c, "image": "x"} for c in containers]},
            "status": {"phase": "Running", "startTime": "2026-11-27T10:00:00Z"}}


def view(uid, node_id="node-1", state=ProvisionState.ready):
    return ProvisionView(id=f"p-{uid}", name=f"vk-{uid}", state=state, image="x", annotations={}, created_at=T0,
                         updated_at=T0, node_id=node_id, address="100.64.0.7")


class FakeCoordinator:
    def __init__(self):
        self.views: list[ProvisionView] = []
        self.telemetry: dict[str, dict] = {}
        self.log_calls: list[tuple[str, dict]] = []
        self.log_chunks: asyncio.Queue = asyncio.Queue()  # bytes, or None to end, or an exception
        self.log_closed = asyncio.Event()
        self.down = False

    async def list_provisions(self):
        if self.down:
            raise CoordinatorError("GET /v1/provisions: connection refused", retryable=True)
        return ProvisionList(provisions=self.views)

    async def get_node(self, node_id):
        return SimpleNamespace(address="100.64.0.7", facts=SimpleNamespace(ssh_port=2222, api_port=9555))

    async def get_telemetry(self, node_id):
        return SimpleNamespace(telemetry=self.telemetry.get(node_id))

    async def node_logs(self, node_id, **params):
        self.log_calls.append((node_id, params))
        try:
            while True:
                item = await self.log_chunks.get()
                if item is None:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            self.log_closed.set()


class Reviews:
    """TokenReview: ``tokens``; SubjectAccessReview: ``allowed`` (user, subresource) pairs."""

    def __init__(self):
        self.tokens = {"admin-token": User("admin", ("system:masters",)), "nobody-token": User("nobody")}
        self.allowed = {("admin", sub) for sub in ("proxy", "stats", "metrics", "log", "pods", "healthz")}

    async def token_review(self, token):
        return self.tokens.get(token)

    async def access_review(self, user, attrs):
        return (user.name, attrs.subresource) in self.allowed, ""


def context(coordinator, pods):
    locator = CoordinatorPodLocator(NODE, lambda: pods, coordinator, "vk-")
    return KubeletContext(node_name=NODE, authorizer=ClusterAuthorizer(NODE, Reviews()), pods=locator,
                          coordinator=coordinator)
