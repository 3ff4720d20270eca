"""``GET /stats/summary`` and ``GET /metrics/resource``: what ``kubectl top`` (through
metrics-server) reads, shaped by :mod:`.statshape` from the telemetry the pods' machines send
the coordinator (``GET /v1/nodes/{id}/telemetry``), read at each request, at most
:data:`FANOUT` machines at once.

A coordinator that cannot be read answers ``/stats/summary`` 503 and ``/metrics/resource``
with ``scrape_error 1`` (as the kubelet says a failed scrape); one machine's telemetry that
cannot be read leaves that pod out.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

from aiohttp import web

from anex_agent.errors import CoordinatorError
from anex_agent.wire.provisioning import ProvisionState
from anex_agent.virtualnode import podspec
from anex_agent.virtualnode.kubelet import statshape
from anex_agent.virtualnode.kubelet.context import CONTEXT_KEY, KubeletContext
from anex_agent.virtualnode.kubelet.locator import containers_of

log = logging.getLogger(__name__)

FANOUT = 16
COUNTERS_KEY = web.AppKey("kubelet_cpu_counters", statshape.CpuCounters)
STARTED_KEY = web.AppKey("kubelet_started", str)


async def samples(context: KubeletContext) -> list[statshape.PodSample]:
    """This Node's running pods with their machines' telemetry; CoordinatorError when the
    provisions cannot be listed."""
    locator: Any = context.pods
    pods = locator.bound()
    views = {v.name: v for v in (await context.coordinator.list_provisions()).provisions}
    gate = asyncio.Semaphore(FANOUT)

    async def one(pod) -> statshape.PodSample | None:
        meta = pod.get("metadata") or {}
        view = views.get(podspec.provision_name(locator.provision_prefix, str(meta.get("uid") or "")))
        if view is None or view.state != ProvisionState.ready or not view.node_id:
            return None
        async with gate:
            try:
                telemetry = (await context.coordinator.get_telemetry(view.node_id)).telemetry
            except CoordinatorError as err:
                log.debug("telemetry of node %s not read: %s", view.node_id, err)
                return None
        return statshape.PodSample(namespace=str(meta.get("namespace")), name=str(meta.get("name")),
                                   uid=str(meta.get("uid") or ""), containers=containers_of(pod),
                                   start_time=(pod.get("status") or {}).get("startTime"), node_id=view.node_id,
                                   telemetry=telemetry)

    found = await asyncio.gather(*(one(p) for p in pods))
    return [s for s in found if s is not None]


async def summary(request: web.Request) -> web.Response:
    context: KubeletContext = request.app[CONTEXT_KEY]
    try:
        found = await samples(context)
    except CoordinatorError as err:  # its text is logged; the client reads ours
        log.info("kubelet port: /stats/summary: the coordinator cannot be read: %s", err)
        return web.Response(status=503, text="Internal Error: the coordinator cannot be read", content_type="text/plain")
    counters = request.app[COUNTERS_KEY]
    counters.forget_others({s.node_id for s in found})
    doc = statshape.summary(context.node_name, request.app[STARTED_KEY], found, counters, time.time())
    return web.Response(text=json.dumps(doc), content_type="application/json")


async def resource(request: web.Request) -> web.Response:
    context: KubeletContext = request.app[CONTEXT_KEY]
    failed = False
    try:
        found = await samples(context)
    except CoordinatorError as err:
        log.info("kubelet port: /metrics/resource: the coordinator cannot be read: %s", err)
        found, failed = [], True
    text = statshape.resource_metrics(found, request.app[COUNTERS_KEY], time.time(), scrape_error=failed)
    return web.Response(text=text, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})


def add_routes(app: web.Application, context: KubeletContext) -> None:
    app[COUNTERS_KEY] = statshape.CpuCounters()
    app[STARTED_KEY] = statshape.rfc3339(time.time())
    app.router.add_get("/stats/summary", summary)
    app.router.add_get("/metrics/resource", resource)
