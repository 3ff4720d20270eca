"""Starting the kubelet port of each virtual Node under the role's TaskGroup.

Per Node (the Nth in ``--providers`` order listens on ``--kubelet-port`` + N, the port its Node
names, on ``--kubelet-address``), two tasks: ``kubelet-cert-<node>`` gets the serving
certificate (files, or the CSR API, renewed at 80 % of its life: :mod:`.certs`) and
``kubelet-<node>`` serves once the first one is there (:mod:`.server`).
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import Any

from anex_agent.virtualnode.kubelet import certs, server
from anex_agent.virtualnode.kubelet.auth import ClusterAuthorizer, KubeReviews
from anex_agent.virtualnode.kubelet.context import KubeletContext, Limits
from anex_agent.virtualnode.kubelet.locator import CoordinatorPodLocator
from anex_agent.virtualnode.kubelet.settings import KubeletSettings

log = logging.getLogger(__name__)


def kubelet_port(base: int, index: int) -> int:
    """The kubelet port of the ``index``-th Node."""
    return base + index


class NodeListener:
    """One Node's certificate and listener (the two tasks of the module docstring)."""

    def __init__(self, settings: Any, kubelet: KubeletSettings, context: KubeletContext, port: int, kube: Any) -> None:
        self.settings = settings
        self.kubelet = kubelet
        self.context = context
        self.port = port
        self.kube = kube
        self.tls: ssl.SSLContext | None = None
        self.ready = asyncio.Event()
        self.clock = time.time
        self.sleep = asyncio.sleep

    def issuer(self) -> certs.CsrIssuer:
        return certs.CsrIssuer(self.kube, self.context.node_name, self.settings.internal_ip, self.kubelet.cert_dir)

    def _install(self, issued: certs.Issued) -> None:
        if self.tls is None:
            client_ca = str(self.kubelet.client_ca) if self.kubelet.client_ca else None
            self.tls = server.tls_context(str(issued.cert_file), str(issued.key_file), client_ca)
        else:
            self.tls.load_cert_chain(str(issued.cert_file), str(issued.key_file))  # new handshakes only
        self.ready.set()

    async def keep_certificate(self) -> None:
        if self.kubelet.tls_cert is not None and self.kubelet.tls_key is not None:
            self._install(certs.from_files(self.kubelet.tls_cert, self.kubelet.tls_key))
            return
        issuer = self.issuer()
        while True:
            issued = await issuer.issue()
            self._install(issued)
            await self.sleep(max(certs.renew_at(issued.not_before, issued.not_after) - self.clock(), 1.0))

    async def serve(self) -> None:
        await self.ready.wait()
        assert self.tls is not None
        await server.serve(self.context, self.kubelet.address, self.port, self.tls)


def spawn(tasks: Any, settings: Any, kubelet: KubeletSettings, kube: Any, coordinator: Any, pods: Any,
          node_names: list[str]) -> list[NodeListener]:
    """Start the kubelet port of each of ``node_names`` (``pods``: the PodController)."""
    listeners = []
    reviews = KubeReviews(kube)
    for index, name in enumerate(node_names):
        locator = CoordinatorPodLocator(name, lambda: list(pods.pods.values()), coordinator, settings.provision_prefix)
        context = KubeletContext(node_name=name, authorizer=ClusterAuthorizer(name, reviews), pods=locator,
                                 coordinator=coordinator, limits=Limits(), tasks=tasks)
        listener = NodeListener(settings, kubelet, context, kubelet_port(settings.kubelet_port, index), kube)
        tasks.spawn(f"kubelet-cert-{name}", listener.keep_certificate)
        tasks.spawn(f"kubelet-{name}", listener.serve)
        listeners.append(listener)
    return listeners
