"""Machine selection routes of the coordinator.

    POST   /v1/selections               admin  SelectionRequest -> SelectionResponse
    GET    /v1/offers                   admin  ?provider=vastai,runpod,onprem&limit=N -> OfferList
    POST   /v1/bans                     admin  BanCreate -> BanView (201)
    GET    /v1/bans                     admin  -> BanList
    DELETE /v1/bans/{machine_id}        admin  -> 204
    POST   /v1/provisioning-failures    admin  ProvisioningFailure -> ProvisioningFailureAck

Mounted by listing ``anex_agent.coordinator.routes_selection`` in
``anex_agent.coordinator.app.ROUTE_MODULES``; its ``MIGRATIONS`` add the bans table (100).
Provider settings come from the environment once, in :func:`setup` (see
:mod:`anex_agent.selection.config`); tests pass ``config=`` to :func:`make_setup`.
Bad annotations answer 400 ``application/problem+json`` with one ``errors`` entry per
annotation (``field`` = ``annotations.<name>``, ``annotation``, ``message`` saying what is
accepted).
"""

from __future__ import annotations

import math
import os
from typing import Any

from aiohttp import web

from anex_agent.coordinator import nodes, problems
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.migrations import Migration
from anex_agent.coordinator.registry import Call, QueryParam, Route, RouteRegistry
from anex_agent.selection import models, worker
from anex_agent.selection.annotations import AnnotationError, Filters, parse_annotations
from anex_agent.selection.bans import BANS_TABLE_SQL, Ban, BanStore
from anex_agent.selection.config import SelectionConfig
from anex_agent.selection.offers import COLUMNS, OfferTable
from anex_agent.selection.providers.onprem import OnpremSource
from anex_agent.selection.providers.runpod import RunPodSource
from anex_agent.selection.providers.vastai import VastAISource
from anex_agent.selection.rank import rank
from anex_agent.selection.service import show_value, attach_provider_report, choose, gather_offers

MIGRATIONS = [Migration(100, "selection: Vast.AI machine bans", BANS_TABLE_SQL)]
ALL_PROVIDERS = ("onprem", "vastai", "runpod")
MAX_OFFERS_LISTED = 10_000


def _ban_view(ban: Ban) -> models.BanView:
    return models.BanView(machine_id=ban.machine_id, reason=ban.reason, created_at=ban.created_at,
                          expires_at=ban.expires_at)


def annotation_problem(err: AnnotationError) -> problems.Problem:
    errors = [{"field": f"annotations.{p.annotation}", "annotation": p.annotation, "message": p.message}
              for p in err.problems]
    names = ", ".join(dict.fromkeys(p.annotation for p in err.problems))
    return problems.Problem(400, "Bad Request", f"invalid selection annotations: {names}; see errors[] for what "
                            "each one accepts", slug="bad-annotations", errors=errors)


class SelectionRoutes:
    """The sources, the ban store and the handlers, for one coordinator."""

    def __init__(self, ctx: Any, config: SelectionConfig) -> None:
        self.ctx = ctx
        self.config = config
        self.bans = BanStore(ctx.db, clock=ctx.clock)
        self.sources: dict[str, Any] = {"onprem": OnpremSource(self.onprem_nodes, default_policy=config.qualification)}
        if config.vastai is not None:
            self.sources["vastai"] = VastAISource(config.vastai)
        if config.runpod is not None:
            self.sources["runpod"] = RunPodSource(config.runpod)

    async def onprem_nodes(self) -> list[dict[str, Any]]:
        """On-prem nodes in the shape :func:`~anex_agent.selection.providers.onprem.offer_from_node` reads."""
        await nodes.flush_for_read(self.ctx)
        rows = await self.ctx.db.fetch("SELECT * FROM nodes WHERE provider = $1 ORDER BY id", "onprem")
        out = []
        for row in rows:
            view = nodes.view_of(self.ctx, row)
            out.append({"id": view.id, "name": view.name, "provider": "onprem", "state": view.state.value,
                        "health": view.health.value, "labels": dict(view.labels),
                        "telemetry": row["telemetry"] or {}})  # JSON text: decoded on the worker thread
        return out

    def _sources(self, wanted: list[str] | None) -> tuple[list[Any], dict[str, Any]]:
        names = list(dict.fromkeys(wanted)) if wanted else list(ALL_PROVIDERS)
        report = {}
        chosen = []
        for name in names:
            if name in self.sources:
                chosen.append(self.sources[name])
            elif wanted:  # asked for explicitly but not configured
                variable = {"vastai": "ANEX_VASTAI_API_KEY", "runpod": "ANEX_RUNPOD_API_KEY"}.get(name, "")
                report[name] = {"offers": 0, "error": f"{name} is not configured on this coordinator (set {variable})",
                                "retryable": False}
        return chosen, report

    # ------------------------------------------------------------ handlers

    async def create_selection(self, call: Call) -> web.Response:
        request: models.SelectionRequest = call.body  # type: ignore[assignment]
        try:
            filters = parse_annotations(request.annotations)
        except AnnotationError as err:
            raise annotation_problem(err) from None
        sources, missing = self._sources(request.providers)
        table, report = await gather_offers(sources, filters)
        banned = await self.bans.banned_machines()
        body = await worker.run(_selection_body, table, filters, banned, request.limit, self.config.ordering,
                                {**report, **missing})
        return web.Response(body=body, content_type="application/json")

    async def list_offers(self, call: Call) -> models.OfferList:
        query = call.request.query
        wanted = [p.strip() for p in query.get("provider", "").split(",") if p.strip()] or None
        bad = [p for p in wanted or [] if p not in ALL_PROVIDERS]
        if bad:
            raise problems.bad_request(f"unknown provider {', '.join(bad)}; accepted: {', '.join(ALL_PROVIDERS)}",
                                       field="provider")
        limit = call.query["limit"]  # parsed by the registry (QueryParam below)
        sources, missing = self._sources(wanted)
        everything = Filters(verified_only=False)  # inspection: ask for all offers, unverified included
        table, report = await gather_offers(sources, everything)
        banned = sorted(await self.bans.banned_machines())
        body = await worker.run(_offers_body, table, everything, limit, {**report, **missing}, banned)
        return web.Response(body=body, content_type="application/json")

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


def _selection_body(table: OfferTable, filters: Filters, banned: frozenset[str], limit: int, ordering: str,
                    report: dict[str, Any]) -> bytes:
    """The ``SelectionResponse`` JSON (on the selection worker thread: choosing, validating and
    serializing up to 1,000 candidates is no work for the event loop)."""
    selection = choose(table, filters, banned=banned, limit=limit, default_ordering=ordering)
    attach_provider_report(selection, report)
    return models.SelectionResponse.model_validate(
        {"candidates": selection.candidates, "explanation": selection.explanation}).model_dump_json().encode()


def _offers_body(table: OfferTable, filters: Filters, limit: int, report: dict[str, Any],
                 banned: list[str]) -> bytes:
    """The ``OfferList`` JSON of the cheapest ``limit`` offers (on the selection worker thread)."""
    views = [_offer_view(table, i) for i in rank(table, list(range(table.size)), filters)[:limit]]
    return models.OfferList(offers=views, providers=report, banned=banned).model_dump_json().encode()


def _offer_view(table: OfferTable, row: int) -> models.OfferView:
    offer = table.offers[row]
    specs = {name: show_value(name, getattr(offer, name)) for name in COLUMNS
             if name not in ("provider", "offer_id", "machine_id", "details")}
    specs = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in specs.items()}
    return models.OfferView(provider=offer.provider, offer_id=offer.offer_id, machine_id=offer.machine_id,
                            specs=specs)


def make_setup(config: SelectionConfig | None = None):
    """A ``setup(registry, ctx)`` using ``config`` (default: read from the environment)."""

    def setup(registry: RouteRegistry, ctx: Any) -> None:
        routes = SelectionRoutes(ctx, config or SelectionConfig.from_env(os.environ))
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
