"""Operations: /healthz, /readyz, /metrics, /v1/openapi.json (no authentication: keep the
listen address private, or put these behind your ingress rules).

``/metrics`` without a bearer token serves the coordinator's own process metrics; with the
admin token or the metrics token it adds the fleet's (node names, hostnames, GPU UUIDs);
with any other bearer token it is the one 401."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from anex_agent import __version__
from anex_agent.wire.join import CoordinatorInfo
from anex_agent.coordinator import problems
from anex_agent.coordinator.auth import Auth, bearer
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry, openapi


async def healthz(call: Call) -> web.Response:
    return web.json_response({"status": "ok"})


async def readyz(call: Call) -> web.Response:
    try:
        await call.ctx.db.fetchval("SELECT 1")
    except Exception:
        raise problems.Problem(503, "Service Unavailable", "the database is not reachable", slug="not-ready") from None
    return web.json_response({"status": "ready", "database": call.ctx.db.dialect})


async def metrics(call: Call) -> web.Response:
    secret = bearer(call.request)
    fleet = False
    if secret is not None:
        principal = await call.ctx.auth.identify(secret)
        if principal is None or principal.kind not in ("admin", "metrics"):
            raise problems.unauthenticated()
        fleet = True
        await call.ctx.metrics.prepare_fleet_scrape()
    body = call.ctx.metrics.exposition(fleet=fleet)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


async def coordinator_info(call: Call) -> CoordinatorInfo:
    return CoordinatorInfo(public_key=call.ctx.coordinator_public)


def setup(registry: RouteRegistry, ctx) -> None:
    async def openapi_document(call: Call) -> web.Response:
        return web.json_response(openapi(registry.routes, title="anex-agent coordinator", version=__version__))

    tags = ("operations",)
    registry.add(Route("GET", "/healthz", healthz, Auth.public, "Liveness: the process answers", tags=tags))
    registry.add(Route("GET", "/readyz", readyz, Auth.public, "Readiness: the database answers", tags=tags,
                       problems=(503,)))
    registry.add(Route("GET", "/metrics", metrics, Auth.public,
                       "Prometheus metrics: the coordinator's own; with the admin or metrics token as bearer, "
                       "also the fleet's (per node and GPU)", tags=tags, content_type="text/plain", problems=(401, 429)))
    registry.add(Route("GET", "/v1/coordinator", coordinator_info, Auth.public,
                       "The coordinator's public key, against which joins prove key possession",
                       response_model=CoordinatorInfo, tags=tags))
    registry.add(Route("GET", "/v1/openapi.json", openapi_document, Auth.public,
                       "This OpenAPI document", tags=tags))
