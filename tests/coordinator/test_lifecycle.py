"""Node lifecycle: expiry removes the node everywhere; credentials rotate with a short grace
(SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.watch import WatchEvent
from anex_agent.coordinator import nodes, sweeper
from anex_agent.errors import CoordinatorError
from tests.coordinator.conftest import start_harness, stop_harness
from tests.coordinator.lock_waits import another_waits
from tests.polling import wait_until


async def refused(call) -> None:
    with pytest.raises(CoordinatorError) as err:
        await call
    assert err.value.status == 401


async def next_event(events, predicate, timeout: float = 5.0) -> WatchEvent:
    async with asyncio.timeout(timeout):
        async for event in events:
            if predicate(event):
                return event
    raise AssertionError("watch stream ended")


async def expire_all(coord) -> None:
    await coord.ctx.heartbeats.flush()  # as the sweeper's round does
    coord.clock.advance(coord.ctx.settings.timings.expired_after + 1)
    await sweeper.sweep(coord.ctx)


async def test_expiry_removes_the_peer_from_a_watching_gateway_and_quarantines_the_address(coord):
    gw_client, gw, _ = await coord.gateway()
    node_client, joined, pair = await coord.join("silent")
    events = gw_client.watch(0).__aiter__()
    snapshot = await next_event(events, lambda e: e.type == "snapshot")
    assert [p.node_id for p in snapshot.peers] == [joined.node_id]

    await expire_all(coord)
    removed = await next_event(events, lambda e: e.type == "peer_removed")
    assert removed.peer.node_id == joined.node_id and removed.peer.public_key == pair.public_b64
    row = await coord.ctx.db.fetchrow(
        "SELECT owner, quarantined_until FROM addresses WHERE quarantined_until IS NOT NULL")
    assert row["owner"] is None and row["quarantined_until"] > coord.clock()
    assert (await gw_client.get_peers(gw.gateway_id)).peers == []
    await events.aclose()


async def test_an_expired_node_has_no_credential_left(coord):
    client, joined, _ = await coord.join()
    await client.heartbeat(joined.node_id, Heartbeat())
    await expire_all(coord)
    await refused(client.heartbeat(joined.node_id, Heartbeat()))
    await refused(client.get_config(joined.node_id))
    with pytest.raises(CoordinatorError) as err:
        async for _ in client.watch(0):
            pass
    assert err.value.status == 401


async def test_an_expired_node_cannot_rejoin_with_its_used_single_use_token(coord):
    token = await coord.admin.create_join_token()
    key = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().join(token.token, key, "n", "other")
    await coord.client().join(token.token, key, "n", "other")  # before expiry: the owner may re-use it
    await expire_all(coord)
    await refused(coord.client().join(token.token, key, "n", "other"))
    # a fresh token brings it back, as a new node on another address (the old one is in quarantine)
    fresh = await coord.admin.create_join_token()
    back = await coord.client().join(fresh.token, key, "n", "other")
    assert back.node_id != first.node_id and back.config.address != first.config.address


async def test_a_node_heartbeating_meanwhile_is_not_expired(coord):
    client, joined, _ = await coord.join()
    coord.clock.advance(coord.ctx.settings.timings.expired_after + 1)
    due = await sweeper.due_transitions(coord.ctx)
    assert [(d[0], d[1]) for d in due] == [(joined.node_id, "expired")]
    await client.heartbeat(joined.node_id, Heartbeat())  # lands after the sweeper judged it
    assert await sweeper.apply_transitions(coord.ctx, due) == 0
    await client.heartbeat(joined.node_id, Heartbeat())


async def test_a_heartbeat_written_while_the_node_is_expired_keeps_it(coord):
    """The sweeper judged the node by its last heartbeat; another coordinator's heartbeat flush
    writes a newer one after the expiry read the row and before it deleted it: the node stays.
    (PostgreSQL runs READ COMMITTED: the row is read for update, so the read waits for the
    flush and no longer matches the heartbeat it was judged by; with a plain read the delete
    went ahead and removed a node that had just heartbeated.)"""
    _, joined, _ = await coord.join()
    coord.clock.advance(coord.ctx.settings.timings.expired_after + 1)
    [(node_id, state, _, judged_by)] = await sweeper.due_transitions(coord.ctx)
    assert (node_id, state) == (joined.node_id, "expired")
    db = coord.ctx.db
    async with db.transaction() as flush:  # the other coordinator's flush, not yet committed
        await flush.execute("UPDATE nodes SET last_heartbeat_at = $2 WHERE id = $1", node_id, coord.clock())
        expiring = asyncio.create_task(nodes.expire(coord.ctx, node_id, judged_by))
        await wait_until(lambda: another_waits(db), what="the expiry to wait for the heartbeat flush")
    assert await expiring is False
    assert await db.fetchval("SELECT last_heartbeat_at FROM nodes WHERE id = $1", node_id) == coord.clock()


async def test_node_credential_rotates_and_the_old_one_ends_after_the_grace(coord):
    timings = coord.ctx.settings.timings
    client, joined, _ = await coord.join()
    old = joined.credential
    assert (await client.heartbeat(joined.node_id, Heartbeat())).credential is None
    coord.clock.advance(timings.credential_rotation)
    ack = await client.heartbeat(joined.node_id, Heartbeat())
    assert ack.credential and ack.credential != old and client.credential == ack.credential
    copied = coord.client(old)
    await copied.get_config(joined.node_id)  # within the grace
    coord.clock.advance(timings.credential_grace + 1)
    await refused(copied.get_config(joined.node_id))
    await refused(copied.heartbeat(joined.node_id, Heartbeat()))
    assert (await client.heartbeat(joined.node_id, Heartbeat())).credential is None
    await client.get_config(joined.node_id)


async def test_the_first_heartbeat_with_the_new_credential_ends_the_old_ones_grace(coord):
    client, joined, _ = await coord.join()
    copied = coord.client(joined.credential)
    coord.clock.advance(coord.ctx.settings.timings.credential_rotation)
    assert (await client.heartbeat(joined.node_id, Heartbeat())).credential
    await copied.get_config(joined.node_id)  # the node has not shown yet that it got the new one
    assert (await client.heartbeat(joined.node_id, Heartbeat())).credential is None
    await refused(copied.get_config(joined.node_id))  # no waiting for the grace
    await refused(copied.heartbeat(joined.node_id, Heartbeat()))
    await client.get_config(joined.node_id)


async def test_a_lost_rotation_answer_is_recovered_within_the_grace(coord):
    timings = coord.ctx.settings.timings
    client, joined, _ = await coord.join()
    old = joined.credential
    coord.clock.advance(timings.credential_rotation)
    lost = (await client.heartbeat(joined.node_id, Heartbeat())).credential
    assert lost
    retry = coord.client(old)  # the node never saw the answer: it heartbeats with the old credential
    again = (await retry.heartbeat(joined.node_id, Heartbeat())).credential
    assert again and again not in (old, lost)
    await refused(coord.client(lost).get_config(joined.node_id))
    coord.clock.advance(timings.credential_grace + 1)
    await refused(coord.client(old).get_config(joined.node_id))
    await coord.client(again).get_config(joined.node_id)


async def test_gateway_credential_renewal_with_a_grace(coord):
    timings = coord.ctx.settings.timings
    client, gw, _ = await coord.gateway()
    assert gw.credential_rotation == timings.credential_rotation
    renewal = await client.renew_gateway_credential(gw.gateway_id)
    assert renewal.credential != gw.credential and renewal.rotate_in == timings.credential_rotation
    copied = coord.client(gw.credential)
    await copied.get_peers(gw.gateway_id)
    coord.clock.advance(timings.credential_grace + 1)
    await refused(copied.get_peers(gw.gateway_id))
    await client.get_peers(gw.gateway_id)


async def test_rotation_reaches_another_coordinators_cache(coord, tmp_path, database_url):
    """A credential cached by a second coordinator stops working there too after the grace."""
    other_dir = tmp_path / "b"
    other_dir.mkdir()
    for name in ("access-token-signing-key", "coordinator-key", "ssh-ca-key", "admin-token"):
        shutil.copy2(coord.ctx.settings.state_dir / name, other_dir / name)
    other = await start_harness(other_dir, database_url, coord.clock)
    try:
        client, joined, _ = await coord.join()
        old = joined.credential
        on_b = other.client(old)
        await on_b.get_config(joined.node_id)  # cached on b
        coord.clock.advance(coord.ctx.settings.timings.credential_rotation)
        assert (await client.heartbeat(joined.node_id, Heartbeat())).credential
        coord.clock.advance(coord.ctx.settings.timings.credential_grace + 1)
        for _ in range(50):  # b's change feed polls every 0.2 s
            try:
                await on_b.get_config(joined.node_id)
            except CoordinatorError as err:
                assert err.status == 401
                break
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the old credential still works on the other coordinator")
    finally:
        await stop_harness(other)
