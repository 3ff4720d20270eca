"""Machine selection routes of the coordinator.

    POST   /v1/selections               admin  SelectionRequest -> SelectionResponse
    GET    /v1/offers                   admin  ?provider=vastai,runpod,onprem&limit=N -> OfferList
    POST   /v1/bans                     admin  BanCreate -> BanView (201)
    GET    /v1/bans                     admin  -> BanList
    DELETE /v1/bans/{machine_id}        admin  -> 204
    POST   /v1/provisioning-failures    admin  ProvisioningFailure -> ProvisioningFailureAck

Mounted by listing ``anex_agent.coordinator.routes.selection`` in
``anex_agent.coordinator.app.ROUTE_MODULES``; its ``MIGRATIONS`` add the bans table (100).
Provider settings come from the environment once, in :func:`setup` (see
:mod:`anex_agent.selection.config`); tests pass ``config=`` to :func:`make_setup`.
The handlers only read the database (bans, on-prem nodes) and hand the rest to the selection
worker process (:mod:`anex_agent.selection.worker`), which answers with the rendered JSON; a
worker that is busy, timed out or stopped answers 503 problem+json with ``Retry-After``.
Bad annotations answer 400 ``application/problem+json`` with one ``errors`` entry per
annotation (``field`` = ``annotations.<name>``, ``annotation``, ``message`` saying what is
accepted).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from aiohttp import web

from anex_agent.coordinator import nodes, problems, states
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.migrations import Migration
from anex_agent.coordinator.routes.registry import Call, QueryParam, Route, RouteRegistry
from anex_agent.selection import models
from anex_agent.selection.annotations import AnnotationError, Filters, parse_annotations
from anex_agent.selection.bans import BANS_TABLE_SQL, Ban, BanStore
from anex_agent.selection.config import SelectionConfig, not_configured
from anex_agent.selection.worker import (InProcessWorker, JobFailed, SelectionWorker, WorkerBusy, WorkerError,
                                         WorkerTimeout)
from anex_agent.selection.worker_process import OFFERS, SELECT, Job

MIGRATIONS = [Migration(100, "selection: Vast.AI machine bans", BANS_TABLE_SQL)]
ALL_PROVIDERS = ("onprem", "vastai", "runpod")
MAX_OFFERS_LISTED = 10_000
ROWS_PER_TURN = 500  # on-prem node rows handled per turn of the loop


def _ban_view(ban: Ban) -> models.BanView:
    return models.BanView(machine_id=ban.machine_id, reason=ban.reason, created_at=ban.created_at,
                          expires_at=ban.expires_at)


def annotation_problem(err: AnnotationError, what: str = "selection annotations") -> problems.Problem:
    errors = [{"field": f"annotations.{p.annotation}", "annotation": p.annotation, "message": p.message}
              for p in err.problems]
    names = ", ".join(dict.fromkeys(p.annotation for p in err.problems))
    return problems.Problem(400, "Bad Request", f"invalid {what}: {names}; see errors[] for what "
                            "each one accepts", slug="bad-annotations", errors=errors)


class SelectionRoutes:
    """The ban store, the selection worker and the handlers, for one coordinator.

    ``worker``: ``"process"`` (the default: :class:`~anex_agent.selection.worker.SelectionWorker`),
    ``"inline"`` (:class:`~anex_agent.selection.worker.InProcessWorker`, for unit tests), or a
    worker object (tests: one with other limits).
    """

    def __init__(self, ctx: Any, config: SelectionConfig, *,
                 worker: str | SelectionWorker | InProcessWorker = "process") -> None:
        self.ctx = ctx
        self.config = config
        self.bans = BanStore(ctx.db, clock=ctx.clock)
        self.configured = ("onprem", *(name for name, c in (("vastai", config.vastai), ("runpod", config.runpod))
                                        if c is not None))
        if worker == "process":
            worker = SelectionWorker(config)
        elif worker == "inline":
            worker = InProcessWorker(config)
        self.worker: SelectionWorker | InProcessWorker = worker  # type: ignore[assignment]

    async def onprem_nodes(self) -> list[dict[str, Any]]:
        """On-prem nodes in the shape :func:`~anex_agent.providers.onprem.offer_from_node` reads,
        with ``labels`` and ``telemetry`` as the JSON text stored (decoded in the worker). The loop
        only works out each node's state, and lets other work in every :data:`ROWS_PER_TURN` rows."""
        await nodes.flush_for_read(self.ctx)
        rows = await self.ctx.db.fetch("SELECT id, name, created_at, last_heartbeat_at, health, labels, telemetry "
                                       "FROM nodes WHERE provider = $1 ORDER BY id", "onprem")
        latest, now, timings = self.ctx.heartbeats.latest, self.ctx.clock(), self.ctx.settings.timings
        out = []
        for i, row in enumerate(rows):
            if i and i % ROWS_PER_TURN == 0:
                await asyncio.sleep(0)
            last, buffered = row["last_heartbeat_at"], latest.get(row["id"])
            if buffered is not None and (last is None or buffered > last):
                last = buffered
            state = states.state_at(now=now, created_at=row["created_at"], last_heartbeat_at=last, timings=timings)
            out.append({"id": row["id"], "name": row["name"], "provider": "onprem", "state": state.value,
                        "health": row["health"], "labels": row["labels"], "telemetry": row["telemetry"] or {}})
        return out

    def _providers(self, wanted: list[str] | None) -> tuple[tuple[str, ...], dict[str, Any]]:
        """The configured providers to ask and, for those asked for (all by default) but not configured,
        what to report: that they are not configured and which variable sets their key."""
        names = list(dict.fromkeys(wanted)) if wanted else list(ALL_PROVIDERS)
        report = {}
        chosen = []
        for name in names:
            if name in self.configured:
                chosen.append(name)
            else:
                report[name] = {"offers": 0, "configured": False, "error": not_configured(name), "retryable": False}
        return tuple(chosen), report

    async def _answer(self, op: str, filters: Filters, wanted: list[str] | None, limit: int) -> web.Response:
        """Run one job in the selection worker; its JSON answer, or a problem saying why none."""
        providers, missing = self._providers(wanted)
        node_rows = await self.onprem_nodes() if "onprem" in providers else []
        banned = await self.bans.banned_machines()
        job = Job(op, filters, providers, missing, banned, limit, self.config.ordering, node_rows)
        try:
            body = await self.worker.run(job)
        except JobFailed as err:
            raise RuntimeError(f"selection failed in the worker: {err}") from None  # a 500, like any failure
        except WorkerError as err:
            raise worker_problem(err) from None
        return web.Response(body=body, content_type="application/json")

    # ------------------------------------------------------------ handlers

    async def create_selection(self, call: Call) -> web.Response:
        request: models.SelectionRequest = call.body  # type: ignore[assignment]
        try:
            filters = parse_annotations(request.annotations)
        except AnnotationError as err:
            raise annotation_problem(err) from None
        return await self._answer(SELECT, filters, request.providers, request.limit)

    async def list_offers(self, call: Call) -> models.OfferList:
        query = call.request.query
        wanted = [p.strip() for p in query.get("provider", "").split(",") if p.strip()] or None
        bad = [p for p in wanted or [] if p not in ALL_PROVIDERS]
        if bad:
            raise problems.bad_request(f"unknown provider {', '.join(bad)}; accepted: {', '.join(ALL_PROVIDERS)}",
                                       field="provider")
        limit = call.query["limit"]  # parsed by the registry (QueryParam below)
        everything = Filters(verified_only=False)  # inspection: ask for all offers, unverified included
        return await self._answer(OFFERS, everything, wanted, limit)

    async def create_ban(self, call: Call) -> models.BanView:
        body: models.BanCreate = call.body  # type: ignore[assignment]
        ban = await self.bans.ban(body.machine_id, body.reason or "banned by an administrator",
                                  body.duration or self.config.ban_seconds)
        return _ban_view(ban)

    async def list_bans(self, call: Call) -> models.BanList:
        return models.BanList(bans=[_ban_view(b) for b in await self.bans.active()])

    async def delete_ban(self, call: Call) -> None:
        if not await self.bans.unban(call.param("machine_id")):
            raise problems.not_found(f"ban of machine {call.param('machine_id')}")
        return None

    async def provisioning_failure(self, call: Call) -> models.ProvisioningFailureAck:
        body: models.ProvisioningFailure = call.body  # type: ignore[assignment]
        if body.provider != "vastai":
            return models.ProvisioningFailureAck(banned=False, detail=f"{body.provider} does not implement bans; "
                                                 "recorded nothing")
        if not body.machine_id:
            raise problems.bad_request("a Vast.AI provisioning failure needs machine_id (bans key on it)",
                                       field="machine_id")
        reason = f"provisioning failed (offer {body.offer_id or '?'}): {body.reason or 'no reason given'}"
        ban = await self.bans.ban(body.machine_id, reason, self.config.ban_seconds)
        return models.ProvisioningFailureAck(banned=True, ban=_ban_view(ban),
                                             detail=f"machine {body.machine_id} is skipped until {ban.expires_at:.0f}")


def worker_problem(err: WorkerError) -> problems.Problem:
    """503 with Retry-After: the worker was busy, timed out, or stopped (it is started again)."""
    if isinstance(err, WorkerBusy):
        return problems.Problem(503, "Selection Busy", f"{err}; try again shortly", slug="selection-busy",
                                headers={"Retry-After": "1"})
    if isinstance(err, WorkerTimeout):
        return problems.Problem(503, "Selection Timed Out", f"the selection worker gave {err}; try again",
                                slug="selection-timeout", headers={"Retry-After": "5"})
    return problems.Problem(503, "Selection Unavailable", f"{err}; it is started again, try again",
                            slug="selection-unavailable", headers={"Retry-After": "1"})


def make_setup(config: SelectionConfig | None = None, *, worker: str | SelectionWorker | InProcessWorker = "process"):
    """A ``setup(registry, ctx)`` using ``config`` (default: read from the environment); ``worker``:
    ``"process"`` (default), ``"inline"`` (unit tests only) or a worker, see :class:`SelectionRoutes`."""

    def setup(registry: RouteRegistry, ctx: Any) -> None:
        routes = SelectionRoutes(ctx, config or SelectionConfig.from_env(os.environ), worker=worker)
        ctx.add_background("selection-worker", routes.worker.supervise)  # stops the worker at shutdown
        tags = ("selection",)
        registry.add(Route("POST", "/v1/selections", routes.create_selection, Auth.admin,
                           "Rank machines (Vast.AI, RunPod, on-prem) for a pod's annotations, with an explanation",
                           request_model=models.SelectionRequest, response_model=models.SelectionResponse, tags=tags))
        registry.add(Route("GET", "/v1/offers", routes.list_offers, Auth.admin,
                           "Normalized offers of the configured providers, cheapest first (inspection)",
                           response_model=models.OfferList, tags=tags,
                           query=(QueryParam("provider", description="comma-separated: vastai, runpod, onprem"),
                                  QueryParam("limit", "integer", f"1..{MAX_OFFERS_LISTED}, default 100",
                                             minimum=1, maximum=MAX_OFFERS_LISTED, default=100))))
        registry.add(Route("POST", "/v1/bans", routes.create_ban, Auth.admin,
                           "Ban a Vast.AI machine (machine_id) for a time (default: the configured ban time)",
                           request_model=models.BanCreate, response_model=models.BanView, status=201, tags=tags))
        registry.add(Route("GET", "/v1/bans", routes.list_bans, Auth.admin, "Active Vast.AI machine bans",
                           response_model=models.BanList, tags=tags))
        registry.add(Route("DELETE", "/v1/bans/{machine_id}", routes.delete_ban, Auth.admin, "Lift a ban",
                           status=204, tags=tags))
        registry.add(Route("POST", "/v1/provisioning-failures", routes.provisioning_failure, Auth.admin,
                           "Report that provisioning a selected machine failed (bans a Vast.AI machine for the "
                           "configured time; RunPod has no bans)",
                           request_model=models.ProvisioningFailure, response_model=models.ProvisioningFailureAck,
                           tags=tags))

    return setup


setup = make_setup()
