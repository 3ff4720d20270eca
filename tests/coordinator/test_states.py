"""Node state transitions with an injected clock: the pure rules and the sweeper on a real app."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.coordinator import states, sweeper
from anex_agent.errors import CoordinatorError
from anex_agent.wire.heartbeat import NodeState
from tests.coordinator.conftest import HookedWrites

T = states.Timings(heartbeat_interval=10, not_ready_after=30, expired_after=300)


@pytest.mark.parametrize(
    "created, last, now, expected",
    [
        (0, None, 0, NodeState.pending),
        (0, None, 299, NodeState.pending),
        (0, None, 300, NodeState.expired),
        (0, 100, 129, NodeState.ready),
        (0, 100, 130, NodeState.not_ready),
        (0, 100, 399, NodeState.not_ready),
        (0, 100, 400, NodeState.expired),
    ],
)
def test_state_at(created, last, now, expected):
    assert states.state_at(now=now, created_at=created, last_heartbeat_at=last, timings=T) == expected


def test_heartbeat_revives_a_not_ready_node():
    for state in (NodeState.pending, NodeState.ready, NodeState.not_ready):
        assert states.on_heartbeat(state) == NodeState.ready


def test_rotation_is_due_after_the_rotation_period():
    timings = states.Timings(heartbeat_interval=10, not_ready_after=30, expired_after=300, credential_rotation=100)
    assert not states.rotation_due(now=99.0, issued_at=0.0, timings=timings)
    assert states.rotation_due(now=100.0, issued_at=0.0, timings=timings)
    with pytest.raises(ValueError, match="credential rotation"):
        states.Timings(heartbeat_interval=10, not_ready_after=30, expired_after=300, credential_rotation=5)


def test_timings_must_be_ordered():
    with pytest.raises(ValueError, match="heartbeat interval < not-ready-after < expired-after"):
        states.Timings(heartbeat_interval=30, not_ready_after=20, expired_after=100)


async def db_state(coord, node_id):
    return await coord.ctx.db.fetchval("SELECT state FROM nodes WHERE id = $1", node_id)


async def test_sweeper_moves_nodes_through_states(coord):
    timings = coord.ctx.settings.timings
    client, joined, _ = await coord.join()
    _, silent, _ = await coord.join("silent")
    node_id = joined.node_id
    assert await db_state(coord, node_id) == "pending"
    await client.heartbeat(node_id, Heartbeat())
    await coord.ctx.heartbeats.flush()
    assert await db_state(coord, node_id) == "ready"

    coord.clock.advance(timings.not_ready_after + 1)
    assert await sweeper.sweep(coord.ctx) == 1  # the silent pending node stays pending
    assert await db_state(coord, node_id) == "not_ready"
    assert (await coord.admin.get_node(node_id)).state == NodeState.not_ready

    await client.heartbeat(node_id, Heartbeat())
    assert (await coord.admin.get_node(node_id)).state == NodeState.ready
    assert await db_state(coord, node_id) == "ready"

    coord.clock.advance(timings.expired_after + 1)
    assert await sweeper.sweep(coord.ctx) == 2
    # expired is final: both nodes are removed (credential, peer, address), not kept around
    assert await db_state(coord, node_id) is None
    assert await db_state(coord, silent.node_id) is None
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.get_node(node_id)
    assert err.value.status == 404
    await sweeper.update_gauges(coord.ctx)
    assert coord.ctx.metrics.nodes.labels(state="expired")._value.get() == 0

    with pytest.raises(CoordinatorError) as err:  # a node that comes back is not revived by a heartbeat
        await client.heartbeat(node_id, Heartbeat())
    assert err.value.status == 401
    await coord.ctx.heartbeats.flush()
    assert await db_state(coord, node_id) is None


async def test_sweeper_does_not_overwrite_a_newer_heartbeat(coord):
    client, joined, _ = await coord.join()
    await client.heartbeat(joined.node_id, Heartbeat())
    await coord.ctx.heartbeats.flush()
    coord.clock.advance(coord.ctx.settings.timings.not_ready_after + 1)
    due = await sweeper.due_transitions(coord.ctx)
    assert [(d[0], d[1]) for d in due] == [(joined.node_id, "not_ready")]
    # a heartbeat lands (e.g. through another coordinator) after the sweeper judged the node
    await client.heartbeat(joined.node_id, Heartbeat())
    await coord.ctx.heartbeats.flush()
    assert await sweeper.apply_transitions(coord.ctx, due) == 0
    assert await db_state(coord, joined.node_id) == "ready"


async def test_flush_waits_for_a_flush_in_flight(coord):
    """A read after ``await flush()`` sees every heartbeat recorded before, even while the
    background flusher is in the middle of writing its batch."""
    client, joined, _ = await coord.join()
    buffer = coord.ctx.heartbeats
    entered, release = asyncio.Event(), asyncio.Event()

    async def stall() -> None:  # each write held until released
        entered.set()
        await release.wait()

    buffer._db = HookedWrites(coord.ctx.db, stall)
    try:
        await client.heartbeat(joined.node_id, Heartbeat(telemetry={"n": 1}))
        background = asyncio.create_task(buffer.flush())  # the periodic flusher, stalled mid-write
        await entered.wait()
        reader = asyncio.create_task(buffer.flush())
        await asyncio.sleep(0.05)
        assert not reader.done()  # it waits for the batch in flight
        release.set()
        await background
        await reader
    finally:
        buffer._db = coord.ctx.db
    assert (await coord.admin.get_telemetry(joined.node_id)).telemetry == {"n": 1}
