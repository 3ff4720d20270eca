"""Gateways: registration (idempotent per public key), views, and the peer set they serve.

Contract:
* Registration needs a proof of possession of the key (:mod:`.enrollment`). A gateway
  gets a mesh address from the same pool as nodes (so no node ever gets it) and a
  credential (stored hashed; re-registering replaces it at once).
* :func:`renew` rotates the credential on the gateway's own call (it renews every
  ``credential_rotation`` seconds, told in the registration answer); the old one keeps
  working for ``credential_grace`` seconds.
* Registering or changing a gateway is a ``gateway_changed`` for every node (their
  config lists the gateways) and bumps ``counters.gateways_version``.
* Presence: a gateway is *gone* when it said so as it stopped (:func:`mark_gone`, by its own
  credential or the admin's) or when nothing was heard of it for ``gateway_gone_after`` s
  (:func:`expire_silent`, from the sweeper). Heard of it: it registered, opened its watch
  stream or read its peers (:func:`seen`), and every ``touch_interval(settings)`` s while its
  watch stream stays open (:func:`touch`). A gone gateway keeps its row, address and
  credential but is left out of the nodes' configs (``gone_at`` set, a ``gateway_changed``);
  the first of those calls brings it back (another ``gateway_changed``). A touch never
  brings one back: a stop is not undone by the stream it just closed.
* :func:`peer_set` reads the version *before* the peers: a change committed in between
  is replayed to a watcher that resumes from that version, and replaying an add or a
  remove is harmless, so a snapshot plus replay is never missing anything.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

from anex_agent.wire.gateways import (
    CredentialRenewal, GatewayList, GatewayRegisterRequest, GatewayRegisterResponse, GatewayView, PeerSet,
)
from anex_agent.wire.join import TokenKind
from anex_agent.coordinator import (
    changes,
    credentials,
    gateway_networks as gateway_routes,
    ipam,
    problems,
    enrollment as registration,
    tokens,
)
from anex_agent.coordinator.auth import Principal
from anex_agent.coordinator.db import Conn
from anex_agent.coordinator.nodes import mesh_peer

if TYPE_CHECKING:  # annotations only: the context imports the sweeper, which imports the services
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)


async def peer_set(tx: Conn) -> PeerSet:
    version = await changes.current_version(tx)
    rows = await tx.fetch("SELECT id, name, public_key, address FROM nodes ORDER BY created_at, id")
    return PeerSet(version=version, peers=[mesh_peer(row) for row in rows])


async def peers(ctx: Coordinator, gateway_id: str) -> PeerSet:
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        back = await seen(ctx, tx, gateway_id, now)
        snapshot = await peer_set(tx)
    if back:
        ctx.committed()
    return snapshot


def touch_interval(settings) -> float:
    """Seconds between two ``last_seen_at`` writes while a gateway's watch stream is open:
    a third of ``gateway_gone_after``, at most 10 s (a missed write or two is no absence)."""
    return min(10.0, settings.gateway_gone_after / 3)


async def seen(ctx: Coordinator, tx: Conn, gateway_id: str, now: float) -> bool | None:
    """The gateway called (its watch stream, its peers): ``last_seen_at`` now, and back when it
    was gone. None: no such gateway; True: it was gone and is back (call ``ctx.committed()``
    after the commit); False: it was present."""
    if not await tx.execute("UPDATE gateways SET last_seen_at = $2, gone_at = NULL, gone_reason = NULL"
                            " WHERE id = $1 AND gone_at IS NOT NULL", gateway_id, now):
        if not await tx.execute("UPDATE gateways SET last_seen_at = $2 WHERE id = $1", gateway_id, now):
            return None
        return False
    await _gateways_changed(ctx, tx, now)
    log.info("gateway %s is back: nodes route through it again", gateway_id)
    return True


async def touch(ctx: Coordinator, gateway_id: str) -> None:
    """While its watch stream is open: the gateway is still there (a gone one stays gone)."""
    await ctx.db.execute("UPDATE gateways SET last_seen_at = $2 WHERE id = $1 AND gone_at IS NULL",
                         gateway_id, ctx.clock())


async def mark_gone(ctx: Coordinator, gateway_id: str, reason: str, *, last_seen_at: float | None = None) -> bool:
    """Leave the gateway out of the nodes' configs (it stays registered). ``last_seen_at``: only
    if it was not heard of since (the sweeper's judgement). False when it was gone already (or
    heard of meanwhile); NotFound (a problem) when there is no such gateway."""
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        if last_seen_at is None:
            done = await tx.execute("UPDATE gateways SET gone_at = $2, gone_reason = $3 WHERE id = $1 AND gone_at IS NULL",
                                    gateway_id, now, reason)
        else:
            done = await tx.execute("UPDATE gateways SET gone_at = $2, gone_reason = $3 WHERE id = $1"
                                    " AND gone_at IS NULL AND last_seen_at = $4", gateway_id, now, reason, last_seen_at)
        if not done:
            if last_seen_at is None and await tx.fetchval("SELECT COUNT(*) FROM gateways WHERE id = $1", gateway_id) == 0:
                raise problems.not_found(f"gateway {gateway_id}")
            return False
        await _gateways_changed(ctx, tx, now)
    ctx.committed()
    log.info("gateway %s is gone (%s): nodes route through the other gateways until it is back", gateway_id, reason)
    return True


async def expire_silent(ctx: Coordinator) -> int:
    """Mark gone every present gateway not heard of for ``gateway_gone_after`` s; how many.
    Not before this process has listened that long (a restart is not the gateways' silence)."""
    now = ctx.clock()
    after = ctx.settings.gateway_gone_after
    if now - ctx.started_at < after:
        return 0
    rows = await ctx.db.fetch("SELECT id, last_seen_at FROM gateways WHERE gone_at IS NULL AND last_seen_at <= $1",
                              now - after)
    gone = 0
    for row in rows:
        gone += await mark_gone(ctx, row["id"], f"nothing heard of it for {after:.0f} s",
                                last_seen_at=row["last_seen_at"])
    return gone


async def register(ctx: Coordinator, request: GatewayRegisterRequest) -> GatewayRegisterResponse:
    now = ctx.clock()
    credential = credentials.new_secret(credentials.GATEWAY_CREDENTIAL)
    async with ctx.join_lock, ctx.db.transaction() as tx:
        token, existing = await registration.claim(
            ctx.db, tx, request, TokenKind.gateway, coordinator_private=ctx.coordinator_private, own_table="gateways",
            other_table="nodes", conflict="this public key belongs to a node; the gateway needs its own key pair",
            now=now,
        )
        gateway_routes.check(ctx.settings, request.routes)  # after the token: only a gateway learns the list
        fields = (request.name, request.endpoint, request.ws_url, json.dumps(request.routes), now)
        if existing:
            gateway_id, address = existing["id"], existing["address"]
            await tx.execute(
                "UPDATE gateways SET credential_hash = $2, name = $3, endpoint = $4, ws_url = $5, routes = $6,"
                " last_seen_at = $7, credential_issued_at = $7, previous_credential_hash = NULL,"
                " previous_valid_until = NULL, gone_at = NULL, gone_reason = NULL WHERE id = $1",
                gateway_id,
                credentials.hash_secret(credential),
                *fields,
            )
            await changes.append(ctx.db, tx, changes.Scope.ONE_GATEWAY, changes.ChangeType.REJOINED, target=gateway_id, now=now)
        else:
            gateway_id = credentials.new_id("g")
            address = await ipam.allocate(tx, ctx.settings.pool, f"gateway:{gateway_id}", now=now)
            await tx.execute(
                "INSERT INTO gateways (id, public_key, credential_hash, address, name, endpoint, ws_url, routes,"
                " last_seen_at, created_at, credential_issued_at) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $9, $9)",
                gateway_id,
                request.public_key,
                credentials.hash_secret(credential),
                address,
                *fields,
            )
        await _gateways_changed(ctx, tx, now)
        await tokens.redeem(tx, token, gateway_id, now=now)
        peer_snapshot = await peer_set(tx)
    if existing:
        ctx.auth.forget(gateway_id)
    ctx.committed()
    return GatewayRegisterResponse(
        gateway_id=gateway_id,
        credential=credential,
        address=address,
        network=ctx.settings.pool.cidr,
        mtu=ctx.settings.mtu,
        peers=peer_snapshot,
        credential_rotation=ctx.settings.timings.credential_rotation,
    )


async def renew(ctx: Coordinator, principal: Principal) -> CredentialRenewal:
    """A new credential for the calling gateway (see :func:`.credentials.rotate`); 401 when
    its credential changed meanwhile (re-registered or deleted)."""
    now = ctx.clock()
    timings = ctx.settings.timings
    credential = await credentials.rotate(
        ctx.db, "gateways", principal.id, principal.credential_hash, current=principal.current, now=now,
        grace=timings.credential_grace,
    )
    if credential is None:
        raise problems.unauthenticated()
    ctx.auth.forget(principal.id)
    ctx.committed()
    return CredentialRenewal(credential=credential, rotate_in=timings.credential_rotation)


async def _gateways_changed(ctx: Coordinator, tx: Conn, now: float) -> None:
    version = await changes.append(ctx.db, tx, changes.Scope.ALL_NODES, changes.ChangeType.GATEWAY_CHANGED, now=now)
    await tx.execute("UPDATE counters SET value = $1 WHERE name = 'gateways_version'", version)


async def delete(ctx: Coordinator, gateway_id: str) -> None:
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        row = await tx.fetchrow("SELECT * FROM gateways WHERE id = $1", gateway_id)
        if row is None:
            raise problems.not_found(f"gateway {gateway_id}")
        if await tx.execute("DELETE FROM gateways WHERE id = $1", gateway_id) != 1:  # another coordinator was first
            raise problems.not_found(f"gateway {gateway_id}")
        await ipam.release(tx, ctx.settings.pool, row["address"], now=now, quarantine=ctx.settings.address_quarantine)
        await changes.append(ctx.db, tx, changes.Scope.ONE_GATEWAY, changes.ChangeType.DELETED, target=gateway_id, now=now)
        await _gateways_changed(ctx, tx, now)
    ctx.auth.forget(gateway_id)
    ctx.committed()


def view_of(row: dict) -> GatewayView:
    return GatewayView(
        id=row["id"],
        name=row["name"],
        public_key=row["public_key"],
        address=row["address"],
        endpoint=row["endpoint"],
        ws_url=row["ws_url"],
        routes=json.loads(row["routes"]),
        created_at=tokens.to_datetime(row["created_at"]),
        last_seen_at=tokens.to_datetime(row["last_seen_at"]),
        gone_at=tokens.to_datetime(row.get("gone_at")),
        gone_reason=row.get("gone_reason"),
    )


async def view(ctx: Coordinator, gateway_id: str) -> GatewayView:
    row = await ctx.db.fetchrow("SELECT * FROM gateways WHERE id = $1", gateway_id)
    if row is None:
        raise problems.not_found(f"gateway {gateway_id}")
    return view_of(row)


async def list_views(ctx: Coordinator) -> GatewayList:
    rows = await ctx.db.fetch("SELECT * FROM gateways ORDER BY created_at, id")
    return GatewayList(gateways=[view_of(row) for row in rows])
