"""The credential cache at fleet scale: preloaded at start (a restart is no cold start),
compact, and kept true by the change feed across coordinators."""

from __future__ import annotations

import asyncio
import shutil

import pytest

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.coordinator import auth, credentials, states, sweeper
from anex_agent.errors import CoordinatorError

from .conftest import HookedWrites, start_harness, stop_harness

# rotation well before expiry, so a rotated node is still there when the clock has moved
TIMINGS = states.Timings(heartbeat_interval=15, not_ready_after=60, expired_after=3600, credential_rotation=100,
                         credential_grace=300)


@pytest.fixture
async def short(tmp_path, database_url, clock):
    """A coordinator whose credentials rotate after 100 s."""
    (tmp_path / "a").mkdir()
    harness = await start_harness(tmp_path / "a", database_url, clock, timings=TIMINGS)
    try:
        yield harness
    finally:
        await stop_harness(harness)


def second_state_dir(coord, tmp_path, name: str = "b"):
    other_dir = tmp_path / name
    other_dir.mkdir()
    for file in ("access-token-signing-key", "coordinator-key", "ssh-ca-key", "admin-token"):
        shutil.copy2(coord.ctx.settings.state_dir / file, other_dir / file)
    return other_dir


async def refused(coro) -> None:
    with pytest.raises(CoordinatorError) as err:
        await coro
    assert err.value.status == 401


async def test_a_restarted_coordinator_knows_every_credential_before_the_first_request(short, tmp_path, database_url):
    coord = short
    client, joined, _ = await coord.join()
    _, rotated, _ = await coord.join("rotated")
    gw_client, gw, _ = await coord.gateway()
    # a rotation leaves the previous credential good for the grace: both are preloaded
    rotated_client = coord.client(rotated.credential)
    coord.clock.advance(coord.ctx.settings.timings.credential_rotation)
    new = (await rotated_client.heartbeat(rotated.node_id, Heartbeat())).credential
    assert new

    other = await start_harness(second_state_dir(coord, tmp_path), database_url, coord.clock,
                                timings=coord.ctx.settings.timings)
    try:
        cache = other.ctx.auth
        for secret in (joined.credential, rotated.credential, new, gw.credential):
            assert cache.known(secret)  # no request has been made to this coordinator yet
        assert len(cache) == 4
        assert not cache.known(credentials.new_secret(credentials.NODE_CREDENTIAL))
        # the config-version cache was seeded by the same read: no query per node either
        assert joined.node_id in other.ctx.versions._nodes
        assert await other.ctx.versions.for_node(joined.node_id) == (await coord.admin.get_config(joined.node_id)).version
        # and the answers are those of the database
        ack = await other.client(joined.credential).heartbeat(joined.node_id, Heartbeat())
        assert ack.credential  # the preloaded issue time says its rotation is due too
        await other.client(rotated.credential).get_config(rotated.node_id)  # within the grace
        await other.client(gw.credential).get_peers(gw.gateway_id)
    finally:
        await stop_harness(other)


async def test_a_previous_credential_past_its_grace_is_not_preloaded(short, tmp_path, database_url):
    coord = short
    _, joined, _ = await coord.join()
    node = coord.client(joined.credential)
    coord.clock.advance(coord.ctx.settings.timings.credential_rotation)
    assert (await node.heartbeat(joined.node_id, Heartbeat())).credential
    coord.clock.advance(coord.ctx.settings.timings.credential_grace + 1)
    other = await start_harness(second_state_dir(coord, tmp_path), database_url, coord.clock,
                                timings=coord.ctx.settings.timings)
    try:
        assert not other.ctx.auth.known(joined.credential)
        await refused(other.client(joined.credential).get_config(joined.node_id))
    finally:
        await stop_harness(other)


async def test_a_preloaded_credential_is_revoked_by_a_delete_on_another_coordinator(coord, tmp_path, database_url):
    _, joined, _ = await coord.join()
    other = await start_harness(second_state_dir(coord, tmp_path), database_url, coord.clock,
                                timings=coord.ctx.settings.timings)
    try:
        assert other.ctx.auth.known(joined.credential)
        await coord.admin.delete_node(joined.node_id)
        on_b = other.client(joined.credential)
        for _ in range(50):  # b's change feed polls every 0.2 s (PostgreSQL: NOTIFY)
            try:
                await on_b.get_config(joined.node_id)
            except CoordinatorError as err:
                if err.status == 401:
                    break
                assert err.status == 404  # authenticated from the cache until the change arrives
            await asyncio.sleep(0.1)
        else:
            pytest.fail("the deleted node's credential still works on the other coordinator")
        assert not other.ctx.auth.known(joined.credential)
    finally:
        await stop_harness(other)


async def test_preload_pages_through_the_fleet(coord, monkeypatch):
    monkeypatch.setattr(auth, "PRELOAD_PAGE", 2)
    joined = [(await coord.join(f"n{i}"))[1] for i in range(5)]
    cache = auth.Authenticator(coord.ctx.db, "anexadm_" + "x" * 43, clock=coord.clock)
    assert await cache.preload() == 5
    assert all(cache.known(j.credential) for j in joined)


def test_cache_entries_are_compact():
    entry = auth.Known("node", "n-0123456789ab", 1.0, True, None)
    assert not hasattr(entry, "__dict__")  # slots: no per-entry dict
    assert not hasattr(auth.Principal("node"), "__dict__")
    assert credentials.digest("a").hex() == credentials.hash_secret("a")


async def test_sweeper_reads_only_nodes_whose_state_changes(coord):
    timings = coord.ctx.settings.timings
    client, joined, _ = await coord.join()
    await coord.join("quiet")  # pending, younger than expired_after: never a candidate
    await client.heartbeat(joined.node_id, Heartbeat())
    await coord.ctx.heartbeats.flush()
    coord.clock.advance(timings.not_ready_after + 1)
    assert [(d[0], d[1]) for d in await sweeper.due_transitions(coord.ctx)] == [(joined.node_id, "not_ready")]
    assert await sweeper.sweep(coord.ctx) == 1
    # not_ready and pending nodes stay as they are until expired_after: nothing to read back
    coord.clock.advance(1)
    assert await sweeper.due_transitions(coord.ctx) == []


async def test_a_node_removed_meanwhile_is_not_removed_twice(coord):
    """Two coordinators judging the same node: the second delete finds no row and tells nothing."""
    from anex_agent.coordinator import changes, nodes

    _, joined, _ = await coord.join()
    row = await coord.ctx.db.fetchrow("SELECT * FROM nodes WHERE id = $1", joined.node_id)
    await coord.admin.delete_node(joined.node_id)
    version = await changes.current_version(coord.ctx.db)
    async with coord.ctx.db.transaction() as tx:
        assert not await nodes._remove(coord.ctx, tx, row, reason="expired", now=coord.clock())
    assert await changes.current_version(coord.ctx.db) == version  # no second peer_removed / deleted


async def test_one_coordinator_sweeps_at_a_time(coord, database_url):
    from anex_agent.coordinator.db import open_database

    if not database_url.startswith("postgresql"):
        pytest.skip("one coordinator per SQLite file: the lock is always this process's")
    other = await open_database(database_url)
    try:
        for _ in range(50):  # the harness's own sweeper may hold it for a moment at start
            async with coord.ctx.db.exclusive(sweeper.SWEEP_LOCK) as mine:
                if mine:
                    async with other.exclusive(sweeper.SWEEP_LOCK) as theirs:
                        assert not theirs
                    break
            await asyncio.sleep(0.05)
        else:
            pytest.fail("the sweep lock was never free")
        async with other.exclusive(sweeper.SWEEP_LOCK) as theirs:
            assert theirs  # released after the block
    finally:
        await other.close()


async def test_a_heartbeat_being_written_still_counts_as_pending(coord):
    """The sweeper asks whether a node has an uncommitted heartbeat; one in a flush that has
    not committed yet is one (else a node could expire while its heartbeat is being written)."""
    client, joined, _ = await coord.join()
    await client.heartbeat(joined.node_id, Heartbeat())
    buffer = coord.ctx.heartbeats
    seen = []

    async def note_pending() -> None:  # as the flush's write starts
        seen.append(buffer.pending_for(joined.node_id))

    buffer._db = HookedWrites(coord.ctx.db, note_pending)
    try:
        assert await buffer.flush() == 1
    finally:
        buffer._db = coord.ctx.db
    assert seen and seen[0] is not None
    assert buffer.pending_for(joined.node_id) is None  # committed


async def test_a_restart_does_not_mark_the_fleet_not_ready(coord, tmp_path, database_url):
    """Nodes silent only while no coordinator listened are not judged not_ready before the
    restarted one has listened for not_ready_after; expiry is judged as always."""
    timings = coord.ctx.settings.timings
    client, joined, _ = await coord.join()
    await client.heartbeat(joined.node_id, Heartbeat())
    await coord.ctx.heartbeats.flush()
    coord.clock.advance(timings.not_ready_after + 5)  # the coordinator was down meanwhile
    other = await start_harness(second_state_dir(coord, tmp_path), database_url, coord.clock)
    try:
        assert await sweeper.due_transitions(other.ctx) == []
        assert await other.ctx.db.fetchval("SELECT state FROM nodes WHERE id = $1", joined.node_id) == "ready"
        coord.clock.advance(timings.not_ready_after)  # still silent after the restart: now it is
        assert [(d[0], d[1]) for d in await sweeper.due_transitions(other.ctx)] == [(joined.node_id, "not_ready")]
    finally:
        await stop_harness(other)


async def test_sqlite_checkpoints_the_wal_less_often(tmp_path):
    from anex_agent.coordinator import db as dbm

    db = await dbm.open_database(f"sqlite:///{tmp_path / 'c.db'}")
    try:
        async with db.transaction() as tx:
            assert await tx.fetchval("PRAGMA wal_autocheckpoint") == dbm.WAL_AUTOCHECKPOINT == 10_000
    finally:
        await db.close()
