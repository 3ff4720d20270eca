"""The virtual node's Nodes: one per provider, their Leases and their status.

:meth:`NodeKeeper.run` creates each Node (or puts our labels and taint back on an existing
one), then keeps it alive: every ``lease_interval`` (10 s) it asks the coordinator whether it
answers and renews each Node's Lease in ``kube-node-lease``; every ``status_interval`` (60 s),
and at once when the coordinator's answer changed, it writes each Node's status (capacity from
the provider's offers now, ``Ready`` only while the coordinator answers). A Node deleted
under it is made again at the next tick. A failed API call is logged in one line and tried
again at the next tick; the loop itself never ends on one.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from anex_agent.errors import CoordinatorError, KubeError
from anex_agent.virtualnode import nodeobject
from anex_agent.virtualnode.nodeobject import Capacity

log = logging.getLogger(__name__)

PROBE_TIMEOUT = 5.0


class NodeKeeper:
    def __init__(self, settings: Any, kube: Any, coordinator: Any, clock: Callable[[], datetime]) -> None:
        self.settings = settings
        self.kube = kube
        self.coordinator = coordinator
        self.clock = clock
        self.names = {provider: nodeobject.node_name(settings.node_prefix, provider) for provider in settings.providers}
        self.nodes: dict[str, dict[str, Any]] = {}  # name -> the Node as last read or written
        self.capacity: dict[str, Capacity] = {}
        self.coordinator_ok = False
        self.why = "the coordinator was not asked yet"
        self._fallback_logged: set[str] = set()
        self.ensured = asyncio.Event()  # set once every Node exists

    async def run(self) -> None:
        while not self.ensured.is_set():
            try:
                await self.ensure_nodes()
            except KubeError as err:
                log.warning("cannot create the virtual nodes yet: %s; trying again in %g s", err,
                            self.settings.lease_interval)
                await asyncio.sleep(self.settings.lease_interval)
        await self.probe()
        await self.refresh_capacity()
        await self.write_statuses()
        await self.renew_leases()
        loop = asyncio.get_running_loop()
        next_status = loop.time() + self.settings.status_interval
        while True:
            await asyncio.sleep(self.settings.lease_interval)
            changed = await self.probe()
            if not self.ensured.is_set():  # a Node was deleted under us: make it again
                try:
                    await self.ensure_nodes()
                    changed = True
                except KubeError as err:
                    log.warning("cannot create the virtual nodes again yet: %s", err)
            if loop.time() >= next_status:
                await self.refresh_capacity()
                next_status = loop.time() + self.settings.status_interval
                changed = True
            if changed:
                await self.write_statuses()
            await self.renew_leases()

    async def ensure_nodes(self) -> None:
        for provider, name in self.names.items():
            node = await self.kube.get_node(name)
            if node is None:
                node = await self.kube.create_node(nodeobject.node_object(name, provider))
                log.info("created node %s for provider %s", name, provider)
            else:
                patch = nodeobject.node_patch(name, provider, node)
                if patch is not None:
                    node = await self.kube.patch_node(name, patch)
                    log.info("node %s: our labels and taint put back", name)
            self.nodes[name] = node
        self.ensured.set()

    async def probe(self) -> bool:
        """Ask the coordinator whether it answers; True when the answer changed."""
        try:
            async with asyncio.timeout(PROBE_TIMEOUT):
                await self.coordinator.coordinator_info()
            ok, why = True, "the coordinator answers"
        except (CoordinatorError, TimeoutError) as err:
            ok, why = False, f"the coordinator does not answer: {err or 'timed out'}"
        changed = ok != self.coordinator_ok
        if changed:
            (log.info if ok else log.warning)("nodes %s: %s", ", ".join(self.names.values()), why)
        self.coordinator_ok, self.why = ok, why
        return changed

    async def refresh_capacity(self) -> None:
        for provider, name in self.names.items():
            try:
                doc = await self.coordinator.list_offers([provider], self.settings.offers_limit)
                self.capacity[name] = nodeobject.capacity_from_offers(doc["offers"], pods=self.settings.max_pods)
                self._fallback_logged.discard(name)
            except CoordinatorError as err:
                if name not in self._fallback_logged:
                    log.warning("node %s: the offers of %s cannot be read (%s); its capacity is the configured "
                                "one (--capacity-cpu, --capacity-memory-mib, --capacity-gpus)", name, provider, err)
                    self._fallback_logged.add(name)
                self.capacity.setdefault(name, self.settings.fallback)

    async def write_statuses(self) -> None:
        for index, name in enumerate(self.names.values()):
            status = nodeobject.node_status(
                self.nodes.get(name), self.capacity.get(name, self.settings.fallback),
                coordinator_ok=self.coordinator_ok, why=self.why, internal_ip=self.settings.internal_ip,
                kubelet_port=self.settings.kubelet_port + index, name=name, now=self.clock())  # kubelet/runner.py
            try:
                self.nodes[name] = await self.kube.patch_node_status(name, status)
            except KubeError as err:
                if err.status == 404:
                    log.warning("node %s was deleted; it is made again at the next tick", name)
                    self.ensured.clear()
                else:
                    log.warning("node %s: status not written: %s", name, err)

    async def renew_leases(self) -> None:
        for name in self.names.values():
            uid = (self.nodes.get(name, {}).get("metadata") or {}).get("uid")
            try:
                lease = await self.kube.get_lease(nodeobject.LEASE_NAMESPACE, name)
                if lease is None:
                    await self.kube.create_lease(nodeobject.LEASE_NAMESPACE,
                                                 nodeobject.lease_object(name, uid, self.clock()))
                else:
                    version = (lease.get("metadata") or {}).get("resourceVersion")
                    await self.kube.replace_lease(nodeobject.LEASE_NAMESPACE, name, nodeobject.lease_object(
                        name, uid, self.clock(), resource_version=version))
            except KubeError as err:
                log.warning("node %s: lease not renewed: %s", name, err)
