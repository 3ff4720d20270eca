"""Nodes: join, config, views, tunnels, deletion. Every multi-row change is one transaction.

Contract:
* :func:`join` needs a proof of possession of the key (:mod:`.enrollment`) and is
  idempotent per public key: the same key gets the same node id and address (and a
  fresh credential, which revokes the previous one at once, grace or not).
* A new node becomes a ``peer_added`` for every gateway; a deleted one (by an admin, or
  :func:`expire` when it has been silent for ``expired_after``) a ``peer_removed``, its
  address goes to quarantine and its credential stops working; its row is gone, so a
  single-use token it used is no good to it any more.
* :func:`heartbeat` rotates the node's credential once ``credential_rotation`` seconds
  after issue (:func:`.credentials.rotate`) and hands the new one back in the answer; the
  first heartbeat with the new one ends the old one's grace (:func:`.credentials.end_grace`).
* A node's config version is the newest change-log version that touched its config:
  its own changes (``nodes.config_version``) or a gateway-set change
  (``counters.gateways_version``).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from anex_agent.wire.gateways import MeshPeer
from anex_agent.wire.heartbeat import Heartbeat, HeartbeatAck, NodeState, TransportStatus
from anex_agent.wire.join import TokenKind
from anex_agent.wire.nodes import (
    GatewayPeer, NodeConfig, NodeFacts, NodeJoinRequest, NodeJoinResponse, NodeList, NodeTelemetry, NodeView,
    TunnelSpec, TunnelsUpdate,
)
from anex_agent.coordinator import (
    changes,
    credentials,
    ipam,
    problems,
    enrollment as registration,
    states,
    tokens,
)
from anex_agent.coordinator.auth import Principal
from anex_agent.coordinator.db import Conn

if TYPE_CHECKING:  # annotations only: the context imports the sweeper, which imports the services
    from anex_agent.coordinator.context import Coordinator


def mesh_peer(row: dict) -> MeshPeer:
    return MeshPeer(
        node_id=row["id"], name=row["name"], public_key=row["public_key"], allowed_ips=[f"{row['address']}/32"]
    )


async def gateway_peers(ctx: Coordinator, tx: Conn) -> list[GatewayPeer]:
    rows = await tx.fetch("SELECT * FROM gateways WHERE gone_at IS NULL ORDER BY created_at, id")
    return [
        GatewayPeer(
            id=row["id"],
            public_key=row["public_key"],
            endpoint=row["endpoint"],
            ws_url=row["ws_url"],
            allowed_ips=[ctx.settings.pool.cidr, *json.loads(row["routes"])],
            persistent_keepalive=ctx.settings.persistent_keepalive,
            mesh_address=row["address"],
        )
        for row in rows
    ]


async def config_of(ctx: Coordinator, tx: Conn, row: dict) -> NodeConfig:
    gateways = await gateway_peers(ctx, tx)
    gateways_version = await tx.fetchval("SELECT value FROM counters WHERE name = 'gateways_version'")
    settings = ctx.settings
    return NodeConfig(
        node_id=row["id"],
        version=max(int(row["config_version"]), int(gateways_version)),
        address=row["address"],
        network=settings.pool.cidr,
        mtu=settings.mtu,
        dns=list(settings.dns) or [g.mesh_address for g in gateways],
        search_domains=list(settings.search_domains),
        gateways=gateways,
        tunnels=[TunnelSpec.model_validate(t) for t in json.loads(row["tunnels"])],
        agent_api_verify_key=ctx.verify_key,
        gateway_routes=list(settings.gateway_routes),
    )


async def row_of(tx: Conn, node_id: str, *, for_update: bool = False) -> dict:
    """The node's row (locked for the rest of ``tx`` with ``for_update``: a write to it follows); 404 if none."""
    row = await tx.fetchrow("SELECT * FROM nodes WHERE id = $1" + (" FOR UPDATE" if for_update else ""), node_id)
    if row is None:
        raise problems.not_found(f"node {node_id}")
    return row


async def config(ctx: Coordinator, node_id: str) -> NodeConfig:
    async with ctx.db.transaction() as tx:
        return await config_of(ctx, tx, await row_of(tx, node_id))


async def join(ctx: Coordinator, request: NodeJoinRequest) -> NodeJoinResponse:
    now = ctx.clock()
    credential = credentials.new_secret(credentials.NODE_CREDENTIAL)
    async with ctx.join_lock, ctx.db.transaction() as tx:
        token, existing = await registration.claim(
            ctx.db, tx, request, TokenKind.node, coordinator_private=ctx.coordinator_private, own_table="nodes",
            other_table="gateways", conflict="this public key belongs to a gateway; every node needs its own key pair",
            now=now,
        )
        if existing:
            node_id = existing["id"]
            await tx.execute(
                "UPDATE nodes SET credential_hash = $2, name = $3, provider = $4, facts = $5, credential_issued_at = $6,"
                " previous_credential_hash = NULL, previous_valid_until = NULL WHERE id = $1",
                node_id,
                credentials.hash_secret(credential),
                request.name,
                request.provider.value,
                request.facts.model_dump_json(),
                now,
            )
            await changes.append(
                ctx.db, tx, changes.Scope.ONE_NODE, changes.ChangeType.REJOINED, target=node_id, now=now
            )
        else:
            node_id = credentials.new_id("n")
            address = await ipam.allocate(tx, ctx.settings.pool, f"node:{node_id}", now=now)
            await tx.execute(
                "INSERT INTO nodes (id, name, provider, public_key, credential_hash, address, labels, facts, tunnels,"
                " state, created_at, join_token_id, credential_issued_at)"
                " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, '[]', 'pending', $9, $10, $9)",
                node_id,
                request.name,
                request.provider.value,
                request.public_key,
                credentials.hash_secret(credential),
                address,
                token["labels"],
                request.facts.model_dump_json(),
                now,
                token["id"],
            )
            row = await row_of(tx, node_id)
            version = await changes.append(
                ctx.db, tx, changes.Scope.ALL_GATEWAYS, changes.ChangeType.PEER_ADDED,
                target=node_id, payload=mesh_peer(row).model_dump(), now=now,
            )
            await tx.execute("UPDATE nodes SET config_version = $2 WHERE id = $1", node_id, version)
        await tokens.redeem(tx, token, node_id, now=now)
        node_config = await config_of(ctx, tx, await row_of(tx, node_id))
    if existing:
        ctx.auth.forget(node_id)  # the old credential stops working here at once (elsewhere via the feed)
    ctx.committed()
    ctx.metrics.joins.inc()
    return NodeJoinResponse(node_id=node_id, credential=credential, config=node_config)


async def _remove(ctx: Coordinator, tx: Conn, row: dict, *, reason: str, now: float) -> bool:
    """Delete ``row``: address to quarantine, ``peer_removed`` for the gateways, ``deleted`` for the node.

    False (and nothing written) when the row is already gone: another coordinator removed
    it between our read and our delete (PostgreSQL, read committed), so its changes are
    not told twice."""
    node_id = row["id"]
    if await tx.execute("DELETE FROM nodes WHERE id = $1", node_id) != 1:
        return False
    await ipam.release(tx, ctx.settings.pool, row["address"], now=now, quarantine=ctx.settings.address_quarantine)
    await changes.append(
        ctx.db, tx, changes.Scope.ALL_GATEWAYS, changes.ChangeType.PEER_REMOVED,
        target=node_id, payload=mesh_peer(row).model_dump(), now=now,
    )
    await changes.append(
        ctx.db, tx, changes.Scope.ONE_NODE, changes.ChangeType.DELETED,
        target=node_id, payload={"reason": reason}, now=now,
    )
    return True


def _forget(ctx: Coordinator, node_id: str) -> None:
    ctx.heartbeats.forget(node_id)
    ctx.auth.forget(node_id)
    ctx.committed()


async def delete(ctx: Coordinator, node_id: str) -> None:
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        row = await row_of(tx, node_id)
        if not await _remove(ctx, tx, row, reason="deleted", now=now):
            raise problems.not_found(f"node {node_id}")
    _forget(ctx, node_id)


async def expire(ctx: Coordinator, node_id: str, last_heartbeat_at: float | None) -> bool:
    """Remove a node judged expired, unless it heartbeated since (``last_heartbeat_at`` is
    what it was judged by; a heartbeat still buffered here counts too). True when removed."""
    if ctx.heartbeats.pending_for(node_id) is not None:
        return False
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        # for update: a heartbeat flush (another coordinator's) committed before our delete makes the
        # read wait for it and no longer match, instead of a node that just heartbeated being removed
        row = await tx.fetchrow(
            "SELECT * FROM nodes WHERE id = $1"
            " AND COALESCE(last_heartbeat_at, -1.0) = COALESCE(CAST($2 AS DOUBLE PRECISION), -1.0) FOR UPDATE",
            node_id,
            last_heartbeat_at,
        )
        if row is None:
            return False
        if not await _remove(ctx, tx, row, reason="expired", now=now):
            return False
    _forget(ctx, node_id)
    return True


async def set_tunnels(ctx: Coordinator, node_id: str, update: TunnelsUpdate) -> NodeConfig:
    ports = [t.listen_port for t in update.tunnels]
    duplicates = sorted({p for p in ports if ports.count(p) > 1})
    if duplicates:
        raise problems.Problem(
            422, "Unprocessable Content", f"listen_port {duplicates[0]} is used by more than one tunnel",
            slug="validation", errors=[{"field": "tunnels", "message": f"duplicate listen_port {duplicates}"}],
        )
    now = ctx.clock()
    async with ctx.db.transaction() as tx:
        # the row before the change log's version, as every other writer of a node takes them: a
        # label change or re-join holding the row is waited for, not deadlocked with (PostgreSQL)
        await row_of(tx, node_id, for_update=True)
        version = await changes.append(
            ctx.db, tx, changes.Scope.ONE_NODE, changes.ChangeType.CONFIG, target=node_id, now=now
        )
        await tx.execute(
            "UPDATE nodes SET tunnels = $2, config_version = $3 WHERE id = $1",
            node_id,
            json.dumps([t.model_dump() for t in update.tunnels]),
            version,
        )
        result = await config_of(ctx, tx, await row_of(tx, node_id))
    ctx.committed()
    return result


async def with_gateways_at(ctx: Coordinator, config: NodeConfig, version: int) -> NodeConfig:
    """``config`` with the gateway set as of change ``version`` (read once per process per change)."""

    async def load() -> list[GatewayPeer]:
        async with ctx.db.transaction() as tx:
            return await gateway_peers(ctx, tx)

    gateways = await ctx.gateway_set.get(version, load)
    return config.model_copy(update={
        "gateways": gateways,
        "dns": list(ctx.settings.dns) or [g.mesh_address for g in gateways],
        "version": max(config.version, version),
    })


VIEW_COLUMNS = ("id, name, provider, public_key, address, health, health_reasons, labels, facts, status, created_at,"
                " last_heartbeat_at, tunnels")  # what view_of reads


def view_of(ctx: Coordinator, row: dict) -> NodeView:
    last = row["last_heartbeat_at"]
    buffered = ctx.heartbeats.latest.get(row["id"])
    if buffered is not None and (last is None or buffered > last):
        last = buffered
    state = states.state_at(now=ctx.clock(), created_at=row["created_at"], last_heartbeat_at=last, timings=ctx.settings.timings)
    return NodeView(
        id=row["id"],
        name=row["name"],
        provider=row["provider"],
        public_key=row["public_key"],
        address=row["address"],
        state=state,
        health=row["health"],
        health_reasons=json.loads(row["health_reasons"]),
        labels=json.loads(row["labels"]),
        facts=NodeFacts.model_validate_json(row["facts"]),
        status=TransportStatus.model_validate_json(row["status"]) if row["status"] else None,
        created_at=tokens.to_datetime(row["created_at"]),
        last_heartbeat_at=tokens.to_datetime(last),
        tunnels=[TunnelSpec.model_validate(t) for t in json.loads(row["tunnels"])],
    )


async def flush_for_read(ctx: Coordinator) -> None:
    """Write buffered heartbeats first, so a read sees the newest status and telemetry."""
    await ctx.heartbeats.flush()


async def view(ctx: Coordinator, node_id: str) -> NodeView:
    await flush_for_read(ctx)
    async with ctx.db.transaction() as tx:
        return view_of(ctx, await row_of(tx, node_id))


async def list_views(ctx: Coordinator) -> NodeList:
    await flush_for_read(ctx)
    rows = await ctx.db.fetch(f"SELECT {VIEW_COLUMNS} FROM nodes ORDER BY created_at, id")  # not the telemetry
    return NodeList(nodes=[view_of(ctx, row) for row in rows])


async def telemetry(ctx: Coordinator, node_id: str) -> NodeTelemetry:
    await flush_for_read(ctx)
    async with ctx.db.transaction() as tx:
        row = await row_of(tx, node_id)
    return NodeTelemetry(
        node_id=node_id,
        received_at=tokens.to_datetime(row["last_heartbeat_at"]),
        telemetry=json.loads(row["telemetry"]) if row["telemetry"] else None,
    )


async def heartbeat(
    ctx: Coordinator, principal: Principal, beat: Heartbeat, *, config_version: int
) -> HeartbeatAck:
    """Hot path: no database access (see :mod:`.heartbeats`), except once per rotation period
    when the credential used is due to be replaced (or was already, and the answer was lost)."""
    now = ctx.clock()
    node_id = principal.id
    ctx.heartbeats.record(node_id, beat, now)
    ctx.metrics.heartbeats.inc()
    timings = ctx.settings.timings
    credential = None
    if not principal.current or states.rotation_due(now=now, issued_at=principal.issued_at, timings=timings):
        credential = await credentials.rotate(
            ctx.db, "nodes", node_id, principal.credential_hash, current=principal.current, now=now,
            grace=timings.credential_grace,
        )
        if credential is not None:
            ctx.auth.forget(node_id)
            ctx.committed()
    elif principal.grace_open and await credentials.end_grace(
        ctx.db, "nodes", node_id, principal.credential_hash, now=now
    ):
        ctx.auth.forget(node_id)
        ctx.committed()
    return HeartbeatAck(
        state=states.on_heartbeat(NodeState.ready),
        config_version=config_version,
        next_heartbeat_in=timings.heartbeat_interval,
        credential=credential,
    )
