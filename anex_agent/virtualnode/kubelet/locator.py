"""namespace/name -> the machine a pod runs on (:class:`~.context.PodTarget`).

The pod comes from the pods the controller keeps (those bound to the virtual Nodes, by uid);
its provision (``<provision prefix><uid>``) and that provision's node are read from the
coordinator's REST API at each call, so the answer is what the coordinator says now. Errors
are :class:`~.context.TargetError` with the kubelet's wording: 404 ``pod "x" does not exist``,
404 ``container "c" not found in pod "x"``, 503 while the pod's machine is not ready.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from anex_agent.errors import CoordinatorError
from anex_agent.wire.provisioning import ProvisionState
from anex_agent.virtualnode import podspec
from anex_agent.virtualnode.kubelet.context import PodTarget, TargetError

log = logging.getLogger(__name__)


def containers_of(pod: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple(str(c.get("name")) for c in (pod.get("spec") or {}).get("containers") or () if c.get("name"))


class CoordinatorPodLocator:
    """A :class:`~.context.PodLocator` for the pods of Node ``node_name``."""

    def __init__(self, node_name: str, pods: Callable[[], Iterable[Mapping[str, Any]]], coordinator: Any,
                 provision_prefix: str) -> None:
        self.node_name = node_name
        self.pods = pods  # the pods bound to the virtual Nodes (the controller's cache)
        self.coordinator = coordinator
        self.provision_prefix = provision_prefix

    def bound(self) -> list[Mapping[str, Any]]:
        """The pods bound to this Node, as the controller last saw them."""
        return [p for p in self.pods() if (p.get("spec") or {}).get("nodeName") == self.node_name]

    def pod(self, namespace: str, name: str) -> Mapping[str, Any] | None:
        for pod in self.bound():
            meta = pod.get("metadata") or {}
            if meta.get("namespace") == namespace and meta.get("name") == name:
                return pod
        return None

    async def find(self, namespace: str, name: str, container: str | None = None) -> PodTarget:
        pod = self.pod(namespace, name)
        if pod is None:
            raise TargetError(404, f'pod "{name}" does not exist')
        containers = containers_of(pod)
        if container is not None and container not in containers:
            raise TargetError(404, f'container "{container}" not found in pod "{name}"')
        uid = str((pod.get("metadata") or {}).get("uid") or "")
        wanted = podspec.provision_name(self.provision_prefix, uid)
        try:
            views = (await self.coordinator.list_provisions()).provisions
            view = next((v for v in views if v.name == wanted), None)
            if view is None or view.state != ProvisionState.ready or not view.node_id:
                state = view.state.value if view is not None else "not made yet"
                raise TargetError(503, f'pod "{name}" has no running machine yet (its provision: {state})')
            node = await self.coordinator.get_node(view.node_id)
        except CoordinatorError as err:  # its text (a library's, maybe) is logged; the client reads ours
            log.info("kubelet port: the machine of pod %s/%s cannot be found: %s", namespace, name, err)
            raise TargetError(503 if err.retryable or err.status == 404 else 502,
                              f'the machine of pod "{name}" cannot be found now: the coordinator cannot be '
                              f'read; try again later') from None
        return PodTarget(namespace=namespace, name=name, uid=uid, node_name=self.node_name, provision_id=view.id,
                         node_id=view.node_id, address=node.address, ssh_port=node.facts.ssh_port,
                         api_port=node.facts.api_port, containers=containers)
