"""Builds the coordinator's aiohttp application from route modules.

Extension points (for other parts of anex-agent):
* ``ROUTE_MODULES`` (:mod:`.routes.modules`, re-exported here): the modules whose
  ``setup(registry, ctx)`` declares routes, and whose ``MIGRATIONS``
  :meth:`Coordinator.open` applies with the core ones.
* ``setup`` may also call ``ctx.metrics.add_collector(...)``, ``ctx.feed.add_listener(...)``
  and ``ctx.add_background(name, factory)``.

Every error leaves as an RFC 9457 problem document (also aiohttp's own 404/405 and
unexpected exceptions, which log a traceback and tell the caller nothing more than 500).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from types import ModuleType

from aiohttp import WSCloseCode, web

from anex_agent.coordinator import limits, problems
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.routes.modules import ROUTE_MODULES, load_modules, module_migrations
from anex_agent.coordinator.routes.registry import RouteRegistry
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

CTX_KEY = web.AppKey("coordinator", Coordinator)
REGISTRY_KEY = web.AppKey("registry", RouteRegistry)


@web.middleware
async def problem_middleware(request: web.Request, handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except problems.Problem as problem:
        return problem.response(instance=request.path)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        if isinstance(exc, web.HTTPMethodNotAllowed):
            detail = f"{request.method} is not allowed on {request.path}; allowed: {', '.join(sorted(exc.allowed_methods))}"
        elif exc.status == 404:
            detail = f"no route {request.method} {request.path}; see /v1/openapi.json"
        else:
            detail = exc.text or exc.reason
        problem = problems.Problem(exc.status, exc.reason, detail, headers=_allow_header(exc))
        return problem.response(instance=request.path)
    except Exception as exc:
        if _is_conflict(exc):
            return problems.Problem(
                409, "Conflict", "a concurrent request changed the same object; retry", slug="conflict"
            ).response(instance=request.path)
        log.exception("unhandled error on %s %s", peer_text(request.method), peer_text(request.path))
        return problems.Problem(500, "Internal Server Error", "the coordinator failed; see its log",
                                slug="internal").response(instance=request.path)


def _allow_header(exc: web.HTTPException) -> dict[str, str]:
    allow = exc.headers.get("Allow")
    return {"Allow": allow} if allow else {}


def _is_conflict(exc: Exception) -> bool:
    import sqlite3

    if isinstance(exc, sqlite3.IntegrityError):
        return True
    try:
        import asyncpg
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, asyncpg.UniqueViolationError)


def build_app(ctx: Coordinator, modules: Iterable[ModuleType] | None = None, *, manage_ctx: bool = True) -> web.Application:
    """The aiohttp app for ``ctx`` (opened with :meth:`Coordinator.open`).

    With ``manage_ctx`` the app starts ``ctx``'s background work on startup and closes
    ``ctx`` (flushing heartbeats, closing the database) on cleanup.
    """
    app = web.Application(
        middlewares=[problem_middleware, limits.concurrency_middleware(ctx.settings.limits)],
        client_max_size=limits.MAX_BODY_LIMIT,  # routes read their bodies with their own, smaller limit
    )
    registry = RouteRegistry(app, ctx)
    app[CTX_KEY] = ctx
    app[REGISTRY_KEY] = registry
    for module in load_modules() if modules is None else modules:
        module.setup(registry, ctx)

    async def close_watchers(_app: web.Application) -> None:
        for ws in list(ctx.websockets):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"coordinator shutting down")

    app.on_shutdown.append(close_watchers)
    if manage_ctx:
        async def lifecycle(_app: web.Application):
            await ctx.start()
            yield
            await ctx.close()

        app.cleanup_ctx.append(lifecycle)
    return app
