"""Gateways: registration (idempotent per public key), views, and the peer set they serve.

Contract:
* Registration needs a proof of possession of the key (:mod:`.registration`). A gateway
  gets a mesh address from the same pool as nodes (so no node ever gets it) and a
  credential (stored hashed; re-registering replaces it at once).
* :func:`renew` rotates the credential on the gateway's own call (it renews every
  ``credential_rotation`` seconds, told in the registration answer); the old one keeps
  working for ``credential_grace`` seconds.
* Registering or changing a gateway is a ``gateway_changed`` for every node (their
  config lists the gateways) and bumps ``counters.gateways_version``.
* :func:`peer_set` reads the version *before* the peers: a change committed in between
  is replayed to a watcher that resumes from that version, and replaying an add or a
  remove is harmless, so a snapshot plus replay is never missing anything.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from anex_agent import wire
from anex_agent.coordinator import changes, credentials, gateway_routes, ipam, problems, registration, tokens
from anex_agent.coordinator.auth import Principal
from anex_agent.coordinator.db import Conn
from anex_agent.coordinator.nodes import mesh_peer

if TYPE_CHECKING:  # annotations only: the context imports the sweeper, which imports the services
    from anex_agent.coordinator.context import Coordinator


async def peer_set(tx: Conn) -> wire.PeerSet:
    version = await changes.current_version(tx)
    rows = await tx.fetch("SELECT id, name, public_key, address FROM nodes ORDER BY created_at, id")
    return wire.PeerSet(version=version, peers=[mesh_peer(row) for row in rows])


async def peers(ctx: Coordinator, gateway_id: str) -> wire.PeerSet:
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        await tx.execute("UPDATE gateways SET last_seen_at = $2 WHERE id = $1", gateway_id, now)
        return await peer_set(tx)


async def register(ctx: Coordinator, request: wire.GatewayRegisterRequest) -> wire.GatewayRegisterResponse:
    now = ctx.clock()
    credential = credentials.new_secret(credentials.GATEWAY_CREDENTIAL)
    async with ctx.join_lock, ctx.db.transaction() as tx:
        token, existing = await registration.claim(
            tx, request, wire.TokenKind.gateway, coordinator_private=ctx.coordinator_private, own_table="gateways",
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
                " previous_valid_until = NULL WHERE id = $1",
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
    return wire.GatewayRegisterResponse(
        gateway_id=gateway_id,
        credential=credential,
        address=address,
        network=ctx.settings.pool.cidr,
        mtu=ctx.settings.mtu,
        peers=peer_snapshot,
        credential_rotation=ctx.settings.timings.credential_rotation,
    )


async def renew(ctx: Coordinator, principal: Principal) -> wire.CredentialRenewal:
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
    return wire.CredentialRenewal(credential=credential, rotate_in=timings.credential_rotation)


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


def view_of(row: dict) -> wire.GatewayView:
    return wire.GatewayView(
        id=row["id"],
        name=row["name"],
        public_key=row["public_key"],
        address=row["address"],
        endpoint=row["endpoint"],
        ws_url=row["ws_url"],
        routes=json.loads(row["routes"]),
        created_at=tokens.to_datetime(row["created_at"]),
        last_seen_at=tokens.to_datetime(row["last_seen_at"]),
    )


async def list_views(ctx: Coordinator) -> wire.GatewayList:
    rows = await ctx.db.fetch("SELECT * FROM gateways ORDER BY created_at, id")
    return wire.GatewayList(gateways=[view_of(row) for row in rows])
