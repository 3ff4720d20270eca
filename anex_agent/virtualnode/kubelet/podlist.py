"""``GET /pods`` (a v1 PodList of the pods bound to this Node, as the controller last saw them)
and ``GET /healthz`` (``ok``)."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from anex_agent.virtualnode.kubelet.context import CONTEXT_KEY, KubeletContext


async def pods(request: web.Request) -> web.Response:
    context: KubeletContext = request.app[CONTEXT_KEY]
    locator: Any = context.pods
    doc = {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": list(locator.bound())}
    return web.Response(text=json.dumps(doc), content_type="application/json")


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok", content_type="text/plain")


def add_routes(app: web.Application, context: KubeletContext) -> None:
    app.router.add_get("/pods", pods)
    app.router.add_get("/pods/", pods)
    app.router.add_get("/healthz", healthz)
