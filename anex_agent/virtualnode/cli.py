"""``anex-agent virtual-node``: the cluster's face of the coordinator (docs/kubernetes.md).

Runs in the cluster (deploy/), speaks to the coordinator only through its REST API (admin
token) and to the API server only through kubernetes_asyncio (:mod:`.kube`). Its tasks, each
named and owned by one TaskGroup (:class:`anex_agent.tasks.Tasks`): ``nodes`` (Nodes, Leases,
node status: :mod:`.nodes`), ``pods-<node>`` (list and watch of the pods bound to each Node),
``provisions-watch``, ``workload-poll`` and the ``pod-worker-<n>`` that sync pods
(:mod:`.pods`); with ``--metrics-listen``, the Prometheus metrics (:mod:`.metrics`). SIGTERM
or SIGINT stops them; what was rented stays with its pods (a restarted virtual node takes them
up again by name).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import logging
import signal
from datetime import datetime, timezone
from typing import Any

from anex_agent.errors import NotSupported
from anex_agent.virtualnode import settings as settings_mod

log = logging.getLogger(__name__)

WORKERS = 4


def configure(parser: argparse.ArgumentParser) -> None:
    settings_mod.configure(parser)
    from anex_agent.virtualnode.kubelet import settings as kubelet_settings  # the kubelet port's flags

    kubelet_settings.configure(parser)


def main(args: argparse.Namespace) -> int:
    from anex_agent.virtualnode.kubelet import settings as kubelet_settings

    if importlib.util.find_spec("kubernetes_asyncio") is None:  # the single-file agent leaves it out
        raise NotSupported("the virtual node needs the kubernetes_asyncio package, which this build does not "
                           "include (the single-file agent is for nodes): install the anex-agent package with pip")
    settings = settings_mod.from_args(args)
    return asyncio.run(run(settings, kubelet_settings.from_args(args)))


def _now() -> datetime:
    return datetime.now(timezone.utc)


class _Stop(Exception):
    """Leaves the TaskGroup: cancels every task."""


async def run(settings: settings_mod.Settings, kubelet: Any = None) -> int:
    """The role until SIGTERM/SIGINT; with ``kubelet`` (KubeletSettings), each Node's kubelet port too."""
    from anex_agent.client.rest import CoordinatorClient
    from anex_agent.tasks import Tasks
    from anex_agent.virtualnode import kube
    from anex_agent.virtualnode.nodes import NodeKeeper
    from anex_agent.virtualnode.pods import PodController

    api_client = await kube.connect(settings.kubeconfig, settings.kubeconfig_source)
    kapi = kube.KubeApi(api_client)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with CoordinatorClient(settings.coordinator_url, admin_token=settings.admin_token,
                                     ca_file=settings.ca_file) as coordinator:
            nodes = NodeKeeper(settings, kapi, coordinator, _now)
            pods = PodController(settings, kapi, coordinator, _now, list(nodes.names.values()))
            if settings.metrics_listen is not None:
                await pods.metrics.serve(*settings.metrics_listen)
                log.info("virtual node metrics on http://%s:%d/metrics", *settings.metrics_listen)
            log.info("virtual node: nodes %s, coordinator %s, InternalIP %s", ", ".join(nodes.names.values()),
                     settings.coordinator_url, settings.internal_ip)
            try:
                async with asyncio.TaskGroup() as group:
                    tasks = Tasks(group, role="virtual node")
                    tasks.spawn("nodes", nodes.run)
                    for name in nodes.names.values():
                        tasks.spawn(f"pods-{name}", functools.partial(pods.watch_node_pods, name))
                    tasks.spawn("provisions-watch", pods.watch_provisions)
                    tasks.spawn("workload-poll", pods.poll_workloads)
                    tasks.spawn("volume-refresh", pods.refresh_volumes)
                    for n in range(WORKERS):
                        tasks.spawn(f"pod-worker-{n}", pods.worker)
                    if kubelet is not None:  # the kubelet port of each Node (kubelet/runner.py)
                        from anex_agent.virtualnode.kubelet import runner

                        runner.spawn(tasks, settings, kubelet, kapi, coordinator, pods, list(nodes.names.values()))
                    await stop.wait()
                    raise _Stop
            except* _Stop:
                pass
            finally:
                pods.queue.close()
                await pods.metrics.close()
    finally:
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(signum)
        await kapi.close()
    log.info("virtual node stopped")
    return 0
