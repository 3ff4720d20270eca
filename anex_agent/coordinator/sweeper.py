"""Periodic upkeep: node state transitions (expiry removes the node), silent gateways marked
gone (:func:`.gateways.expire_silent`), gauges, pruning of the change log and of spent
join-proof nonces.

State rules live in :mod:`.states` (pure); SQL here only pre-selects candidates and
writes a new state with a conditional update (the row must still have the heartbeat
time we judged it by), so a heartbeat written meanwhile, by this or another
coordinator, is never overwritten. A node due to be ``expired`` is removed
(:func:`.nodes.expire`: credential gone, ``peer_removed`` for every gateway, address in
quarantine) under the same condition. The first sweep runs at start, so a node that
expired while no coordinator ran cannot heartbeat itself back; ``not_ready`` is judged only
once the process has listened for ``not_ready_after`` (a restart is not the nodes' silence).
With several coordinators
on one PostgreSQL one sweeps at a time (advisory lock); were two to judge the same node,
the conditional writes and :func:`.nodes.expire` (the delete must remove the row) keep
its removal from being told twice.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from anex_agent.coordinator import changes, gateways, nodes, enrollment as registration, states
from anex_agent.wire.heartbeat import NodeState

if TYPE_CHECKING:  # annotations only: the context imports the sweeper, which imports the services
    from anex_agent.coordinator.context import Coordinator

log = logging.getLogger(__name__)

_PRUNE_EVERY = 60  # sweeps
SWEEP_LOCK = 0x616E6578_0001  # advisory lock key: one coordinator sweeps at a time (the migrations use 0x616E6578)


async def due_transitions(ctx: Coordinator) -> list[tuple[str, str, str, float | None]]:
    """``(node id, new state, old state, heartbeat time judged by)`` for every node whose state is due to change."""
    now = ctx.clock()
    timings = ctx.settings.timings
    # silence while this process was not listening is not the nodes' doing (their heartbeats
    # had nowhere to go): nobody is judged not_ready before the process has listened for
    # not_ready_after, so a restart does not mark the fleet not_ready (expiry is judged as always)
    judging_silence = now - ctx.started_at >= timings.not_ready_after
    # only rows whose state is due to change: a not_ready node silent for less than
    # expired_after, or a pending one younger than that, is no candidate (else a fleet that
    # went quiet during a restart would be read back in full every sweep)
    # (a ready or not_ready node has a heartbeat time: the flush writes both; the terms are
    # ranges of the index on (state, last_heartbeat_at), so a sweep costs what is due, not the fleet)
    rows = await ctx.db.fetch(
        "SELECT id, state, created_at, last_heartbeat_at FROM nodes"
        " WHERE (state = 'ready' AND last_heartbeat_at <= $1)"
        " OR (state = 'not_ready' AND last_heartbeat_at <= $2)"
        " OR (state IN ('ready', 'not_ready') AND last_heartbeat_at IS NULL)"
        " OR (state = 'pending' AND (created_at <= $2 OR last_heartbeat_at IS NOT NULL))",
        now - (timings.not_ready_after if judging_silence else timings.expired_after),
        now - timings.expired_after,
    )
    updates = []
    for row in rows:
        target = states.state_at(
            now=now, created_at=row["created_at"], last_heartbeat_at=row["last_heartbeat_at"], timings=timings
        )
        if target == NodeState.not_ready and not judging_silence:
            continue
        if target.value != row["state"]:
            updates.append((row["id"], target.value, row["state"], row["last_heartbeat_at"]))
    return updates


async def apply_transitions(ctx: Coordinator, updates: list[tuple[str, str, str, float | None]]) -> int:
    """Write the transitions whose rows are unchanged since they were judged; return how many."""
    changed = 0
    if not updates:
        return 0
    for node_id, new, _old, last in updates:
        if new == NodeState.expired.value and await nodes.expire(ctx, node_id, last):
            changed += 1
            log.info("node %s expired (silent for %.0f s): removed; it must join again", node_id,
                     ctx.settings.timings.expired_after)
    async with ctx.db.transaction() as tx:
        for node_id, new, old, last in sorted(updates):  # node id order, as the heartbeat flush (no deadlock)
            if new == NodeState.expired.value:
                continue
            changed += await tx.execute(
                "UPDATE nodes SET state = $2 WHERE id = $1 AND state = $3"
                " AND COALESCE(last_heartbeat_at, -1.0) = COALESCE(CAST($4 AS DOUBLE PRECISION), -1.0)",
                node_id,
                new,
                old,
                last,
            )
    log.info("node states: %s", ", ".join(f"{n} {o}->{s}" for n, s, o, _ in updates[:20]))
    return changed


async def sweep(ctx: Coordinator) -> int:
    """Apply due transitions once; return how many nodes changed state."""
    return await apply_transitions(ctx, await due_transitions(ctx))


async def update_gauges(ctx: Coordinator) -> None:
    counts = {state.value: 0 for state in NodeState}
    for row in await ctx.db.fetch("SELECT state, COUNT(*) AS n FROM nodes GROUP BY state"):
        counts[row["state"]] = int(row["n"])
    for state, n in counts.items():
        ctx.metrics.nodes.labels(state=state).set(n)
    ctx.metrics.gateways.set(int(await ctx.db.fetchval("SELECT COUNT(*) FROM gateways WHERE gone_at IS NULL")))
    ctx.metrics.watchers.set(ctx.feed.watcher_count)


async def run(ctx: Coordinator) -> None:
    """Forever: flush this process's heartbeats, then (one coordinator at a time: an advisory
    lock on PostgreSQL; the others skip the round) sweep and prune; gauges are per process."""
    rounds = 0
    while True:
        try:
            await ctx.heartbeats.flush()
            async with ctx.db.exclusive(SWEEP_LOCK) as mine:
                if mine:
                    await sweep(ctx)
                    await gateways.expire_silent(ctx)
                    if rounds % _PRUNE_EVERY == 0:
                        await changes.prune(ctx.db, keep=ctx.settings.change_retention)
                        await registration.prune_nonces(ctx.db, now=ctx.clock())
            await update_gauges(ctx)
            rounds += 1
        except Exception:
            log.exception("state sweep failed; will retry")
        await asyncio.sleep(ctx.settings.sweep_interval)
