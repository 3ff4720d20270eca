"""Operations: /healthz, /readyz, /metrics, /v1/openapi.json (no authentication: keep the
listen address private, or put these behind your ingress rules)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from anex_agent import __version__, wire
from anex_agent.coordinator import problems
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.registry import Call, Route, RouteRegistry, openapi


async def healthz(call: Call) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(call: Call) -> web.Response:
    try:
        await call.ctx.db.fetchval("SELECT 1")
    except Exception:
        raise problems.Problem(503, "Service Unavailable", "the database is not reachable", slug="not-ready") from None
    return web.json_response({"status": "ready", "database": call.ctx.db.dialect})


async def metrics(call: Call) -> web.Response:
    body = generate_latest(call.ctx.metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def coordinator_info(call: Call) -> wire.CoordinatorInfo:
    return wire.CoordinatorInfo(public_key=call.ctx.coordinator_public)


def setup(registry: RouteRegistry, ctx) -> None:
    async def openapi_document(call: Call) -> web.Response:
        return web.json_response(openapi(registry.routes, title="anex-agent coordinator", version=__version__))

    tags = ("operations",)
    registry.add(Route("GET", "/healthz", healthz, Auth.public, "Liveness: the process answers", tags=tags))
    registry.add(Route("GET", "/readyz", readyz, Auth.public, "Readiness: the database answers", tags=tags,
                       problems=(503,)))
    registry.add(Route("GET", "/metrics", metrics, Auth.public, "Prometheus metrics", tags=tags,
                       content_type="text/plain"))
    registry.add(Route("GET", "/v1/coordinator", coordinator_info, Auth.public,
                       "The coordinator's public key, against which joins prove key possession",
                       response_model=wire.CoordinatorInfo, tags=tags))
    registry.add(Route("GET", "/v1/openapi.json", openapi_document, Auth.public,
                       "This OpenAPI document", tags=tags))
