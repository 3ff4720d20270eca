"""Provisioning routes (admin): ask for a machine in one call, follow it, delete it.

    POST   /v1/provisions          ProvisionCreate -> ProvisionView (202 new; 200 the same name and body again;
                                   409 the same name with another body; 422 naming ``agent`` when it asks to
                                   download the agent from a coordinator without ``--agent-binary``)
    GET    /v1/provisions          -> ProvisionList (deleted ones left out)
    GET    /v1/provisions/watch    WebSocket of ProvisionEvent: a snapshot, then each change
    GET    /v1/provisions/{id}     -> ProvisionView with every attempt
    DELETE /v1/provisions/{id}     -> ProvisionView (202; the rental is destroyed, then the node removed;
                                   idempotent)

Mounted through ``ROUTE_MODULES``; ``MIGRATIONS`` (400-449) are :mod:`..provisioning.store`'s and
:mod:`..provisioning.recovery`'s (420).
:func:`make_setup` takes injected providers, selector and boot issuer (tests);
:func:`setup` builds them from the coordinator's environment (:mod:`..provisioning.config`),
the issuer being :func:`default_issuer` (the bootstrap's, with the ``--agent-binary`` files).
A provision's ``agent`` start mode is decided at ``POST`` (:func:`resolve_agent`) and kept in it.
The loop itself is :class:`..provisioning.scheduler.Provisioner`, a coordinator background task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import weakref
from collections.abc import Mapping
from typing import Any

from aiohttp import web

from anex_agent import parse
from anex_agent.coordinator import problems
from anex_agent.coordinator.auth import Auth
from anex_agent.coordinator.provisioning import boot, recovery, store
from anex_agent.wire import provisioning as models
from anex_agent.coordinator.provisioning.config import ProvisioningSettings, build_providers
from anex_agent.coordinator.provisioning.scheduler import Provisioner
from anex_agent.wire.provisioning import ProvisionState as S
from anex_agent.coordinator.provisioning.policy import parse_policy
from anex_agent.providers.rentals import RentalProvider
from anex_agent.coordinator.provisioning.selector import LiveSelector, Selector
from anex_agent.coordinator.routes.registry import Call, Route, RouteRegistry
from anex_agent.selection.annotations import AnnotationError, parse_annotations

log = logging.getLogger(__name__)

MIGRATIONS = [*store.MIGRATIONS, recovery.MIGRATION]
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TUNNEL_PREFIX = "GW_TUNNEL_"
_PROVISIONERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def provisioner_of(ctx: Any) -> Provisioner | None:
    """The provisioning loop of coordinator ``ctx`` (None when provisioning is not configured)."""
    return _PROVISIONERS.get(ctx)


def _invalid(field: str, message: str) -> problems.Problem:
    return problems.Problem(422, "Unprocessable Content", f"invalid body: check {field}", slug="validation",
                            errors=[{"field": field, "message": message}])


def resolve_agent(spec: models.ProvisionCreate, *, serves_agent: bool) -> models.ProvisionCreate:
    """``spec`` with its ``agent`` start mode decided (the default: ``download`` when this coordinator
    serves an agent file, else ``entrypoint``); 422 naming ``agent`` when ``download`` cannot work."""
    agent = spec.agent or (boot.DOWNLOAD if serves_agent else boot.ENTRYPOINT)
    if agent == boot.DOWNLOAD and not serves_agent:
        raise _invalid("agent", "download needs an agent file to serve: start the coordinator with "
                                "--agent-binary PATH, or use an image whose entrypoint is the agent (entrypoint)")
    if agent == boot.DOWNLOAD and not (spec.command or spec.args):
        raise _invalid("command", "the start script runs the pod's command under the downloaded agent: give one "
                                  "(the image's own entrypoint is replaced), or use agent: entrypoint")
    return spec if spec.agent == agent else spec.model_copy(update={"agent": agent})


def check_spec(spec: models.ProvisionCreate) -> None:
    """Refuse (422 naming the field) what would only fail on the rented machine."""
    for name, value in spec.env.items():
        field = f"env.{name}"
        if not ENV_NAME.fullmatch(name):
            raise _invalid(field, "a variable name is letters, digits and '_', not starting with a digit")
        if name in boot.RESERVED_ENV:
            raise _invalid(field, "set by the coordinator for the rented machine to join; leave it out")
        if name.startswith(TUNNEL_PREFIX):
            try:
                parse.port(name[len(TUNNEL_PREFIX):])
            except ValueError as err:
                raise _invalid(field, f"the local port in the name {err}; expected GW_TUNNEL_<port>=HOST:PORT, "
                                      "e.g. GW_TUNNEL_5432=db.default.svc.cluster.local:5432") from None
            try:
                parse.host_port(value.strip())
            except ValueError as err:
                raise _invalid(field, f"the value {err}") from None
    found = []
    for parser in (parse_annotations, parse_policy):
        try:
            parser(spec.annotations)
        except AnnotationError as err:
            found.extend(err.problems)
    if found:
        from anex_agent.coordinator.routes.selection import annotation_problem

        raise annotation_problem(AnnotationError(found), "annotations")


class ProvisionRoutes:
    def __init__(self, ctx: Any, provisioner: Provisioner | None, why_off: str = "") -> None:
        self.ctx = ctx
        self.provisioner = provisioner
        self.why_off = why_off

    def _now(self) -> float:
        return self.ctx.clock()

    async def create(self, call: Call) -> web.Response:
        spec: models.ProvisionCreate = call.body  # type: ignore[assignment]
        check_spec(spec)
        spec = resolve_agent(spec, serves_agent=bool(self.ctx.settings.agent_binaries))
        if self.provisioner is None:
            raise problems.Problem(503, "Service Unavailable", f"provisioning is not configured: {self.why_off}",
                                   slug="provisioning-off")
        try:
            row, created = await store.create(self.ctx.db, spec, now=self._now(), signing_key=self.ctx.signing_key)
        except ValueError:
            raise problems.Problem(
                409, "Conflict", f"a provision named {spec.name} exists with another body; delete it first or "
                "use another name", slug="conflict",
                errors=[{"field": "name", "message": "taken by a provision with a different body"}]) from None
        self.ctx.committed()
        self.provisioner.kick()
        # a new provision is answered as created (selecting, no attempt yet): the loop, woken by the
        # commit, may already have moved it on; the same one asked again is answered as it is now
        view = (store.view_of(row, [], now=self._now()) if created
                else await store.view(self.ctx.db, row["id"], now=self._now()))
        return web.json_response(text=view.model_dump_json(), status=202 if created else 200)

    async def list(self, call: Call) -> models.ProvisionList:
        return models.ProvisionList(provisions=await store.list_views(self.ctx.db, now=self._now()))

    async def get(self, call: Call) -> models.ProvisionView:
        view = await store.view(self.ctx.db, call.param("provision_id"), now=self._now())
        if view is None:
            raise problems.not_found(f"provision {call.param('provision_id')}")
        return view

    async def delete(self, call: Call) -> web.Response:
        pid = call.param("provision_id")
        now = self._now()
        async with self.ctx.db.transaction() as tx:
            row = await store.get_for_update(tx, pid)
            if row is None:
                raise problems.not_found(f"provision {pid}")
            if row["state"] not in (S.deleting.value, S.deleted.value):
                await store.set_state(self.ctx.db, tx, pid, S.deleting, now=now, reason="destroying the rental",
                                      next_try_at=0)
        self.ctx.committed()
        if self.provisioner is not None:
            self.provisioner.kick()
        view = await store.view(self.ctx.db, pid, now=self._now())
        return web.json_response(text=view.model_dump_json(), status=202)

    async def watch(self, call: Call) -> web.StreamResponse:
        ctx, request = call.ctx, call.request
        ws = web.WebSocketResponse(heartbeat=20.0)
        if not ws.can_prepare(request).ok:
            raise problems.bad_request("this route needs a WebSocket upgrade (GET with Upgrade: websocket)")
        sub = ctx.feed.subscribe("provisions", "admin")
        ctx.websockets.add(ws)
        try:
            await ws.prepare(request)
            version = ctx.feed.version
            views = await store.list_views(ctx.db, now=self._now())
            await ws.send_str(models.ProvisionEvent(type="snapshot", version=version, provisions=views)
                              .model_dump_json(exclude_none=True))
            reader = asyncio.create_task(_drain(ws), name="provisions-watch-drain")
            try:
                while not reader.done():
                    getter = asyncio.ensure_future(sub.queue.get())
                    done, _ = await asyncio.wait({getter, reader}, return_when=asyncio.FIRST_COMPLETED)
                    if getter not in done:
                        getter.cancel()
                        break
                    change = getter.result()
                    if change.version <= version or change.target is None:
                        if change.type.value == "resync":
                            await ws.close(code=1012, message=b"changes were missed: reconnect for a snapshot")
                            break
                        continue
                    view = await store.view(ctx.db, change.target, now=self._now())
                    if view is not None:
                        await ws.send_str(models.ProvisionEvent(type="changed", version=change.version,
                                                                provision=view).model_dump_json(exclude_none=True))
            finally:
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError, ConnectionError, RuntimeError):
                    await reader
        except (ConnectionError, RuntimeError) as err:
            log.debug("provisions watch ended: %s", err)
        finally:
            ctx.feed.unsubscribe(sub)
            ctx.websockets.discard(ws)
        return ws


async def _drain(ws: web.WebSocketResponse) -> None:
    async for _msg in ws:
        pass


def default_issuer(ctx: Any, cfg: ProvisioningSettings) -> boot.BootstrapIssuer:
    """The bootstrap issuer: start scripts download the agent files of ``--agent-binary``."""
    from anex_agent.coordinator.routes import agent_download

    async def hashes() -> Mapping[str, str]:
        return await agent_download.agent_sha256s(ctx.settings)

    return boot.BootstrapIssuer(cfg.coordinator_url, hashes)


def make_setup(*, providers: Mapping[str, RentalProvider] | None = None, selector: Selector | None = None,
               issuer: boot.BootIssuer | None = None, settings: ProvisioningSettings | None = None,
               environ: Mapping[str, str] | None = None):
    """A ``setup(registry, ctx)``; what is not given is built from ``environ`` (default: the process's)."""

    def setup(registry: RouteRegistry, ctx: Any) -> None:
        env = os.environ if environ is None else environ
        cfg = settings or ProvisioningSettings.from_env(env)
        from anex_agent.selection.bans import BanStore
        from anex_agent.selection.config import SelectionConfig

        selection = SelectionConfig.from_env(env)
        bans = BanStore(ctx.db, clock=ctx.clock)
        rental_providers = dict(providers) if providers is not None else build_providers(selection, cfg)
        why_off = ""
        if issuer is None and not cfg.coordinator_url:
            why_off = "set ANEX_PROVISION_COORDINATOR_URL (the URL rented machines join)"
        provisioner = None
        if not why_off:
            if selector is None:
                live = LiveSelector(selection, bans)
                ctx.add_background("provisioning-selection-worker", live.supervise)  # stops its worker at shutdown
            provisioner = Provisioner(
                ctx, providers=rental_providers, selector=selector or live,
                issuer=issuer or default_issuer(ctx, cfg), settings=cfg, bans=bans,
                ban_seconds=selection.ban_seconds)
            ctx.add_background("provisioning", provisioner.run)
            ctx.feed.add_listener(provisioner.on_change)
            ctx.metrics.add_text_source(provisioner.render_metrics)
        routes = ProvisionRoutes(ctx, provisioner, why_off)
        _PROVISIONERS[ctx] = provisioner
        tags = ("provisioning",)
        registry.add(Route("POST", "/v1/provisions", routes.create, Auth.admin,
                           "Provision a machine: select a live offer, rent it, boot the agent, wait for the node "
                           "(202; the same name and body again: the existing provision)",
                           request_model=models.ProvisionCreate, response_model=models.ProvisionView, status=202,
                           tags=tags, problems=(409, 422, 503)))
        registry.add(Route("GET", "/v1/provisions", routes.list, Auth.admin, "Provisions (deleted ones left out)",
                           response_model=models.ProvisionList, tags=tags))
        registry.add(Route("GET", "/v1/provisions/watch", routes.watch, Auth.admin,
                           "WebSocket stream of provision changes: a snapshot, then each change",
                           response_model=models.ProvisionEvent, websocket=True, tags=tags))
        registry.add(Route("GET", "/v1/provisions/{provision_id}", routes.get, Auth.admin,
                           "One provision with every attempt (offer, provider, rental, how it ended) and its cost",
                           response_model=models.ProvisionView, tags=tags))
        registry.add(Route("DELETE", "/v1/provisions/{provision_id}", routes.delete, Auth.admin,
                           "Delete a provision: destroy its rental, then remove its node (202; idempotent)",
                           response_model=models.ProvisionView, status=202, tags=tags))

    return setup


def setup(registry: RouteRegistry, ctx: Any) -> None:
    make_setup()(registry, ctx)
