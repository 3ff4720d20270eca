"""The watch stream: snapshot, live events, resume from a version, revocation.

The contract is that a change reaches a connected watcher within about a second; these tests
assert that it arrives (without a local poke, only polling can bring it), waiting up to
:data:`tests.polling.GENEROUS` s so that a busy machine does not fail them.
"""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import TunnelSpec
from anex_agent.wire.watch import WatchEvent
from anex_agent.errors import CoordinatorError
from tests.polling import GENEROUS, wait_until


async def next_event(stream, timeout=GENEROUS) -> WatchEvent:
    return await asyncio.wait_for(anext(stream), timeout)


async def test_gateway_gets_snapshot_then_peer_added_and_removed(coord):
    _, existing, _ = await coord.join("before")
    gw_client, gw, _ = await coord.gateway()
    stream = gw_client.watch(0)
    snapshot = await next_event(stream)
    assert snapshot.type == "snapshot"
    assert [p.node_id for p in snapshot.peers] == [existing.node_id]
    _, joined, pair = await coord.join("after")
    added = await next_event(stream)
    assert added.type == "peer_added" and added.peer.node_id == joined.node_id
    assert added.peer.public_key == pair.public_b64
    assert added.version > snapshot.version
    await coord.admin.delete_node(joined.node_id)
    removed = await next_event(stream)
    assert removed.type == "peer_removed" and removed.peer.node_id == joined.node_id
    await stream.aclose()


async def test_gateway_resumes_with_missed_events_in_order(coord):
    gw_client, gw, _ = await coord.gateway()
    stream = gw_client.watch(0)
    snapshot = await next_event(stream)
    await stream.aclose()
    _, a, _ = await coord.join("a")
    _, b, _ = await coord.join("b")
    await coord.admin.delete_node(a.node_id)
    stream = gw_client.watch(snapshot.version)
    events = [await next_event(stream) for _ in range(3)]
    assert [(e.type, e.peer.node_id) for e in events] == [
        ("peer_added", a.node_id), ("peer_added", b.node_id), ("peer_removed", a.node_id)
    ]
    assert [e.version for e in events] == sorted(e.version for e in events)
    await stream.aclose()


async def test_node_gets_its_config_changes_and_gateway_changes(coord):
    client, joined, _ = await coord.join()
    _, other, _ = await coord.join("other")
    stream = client.watch(joined.config.version)
    tunnels = [TunnelSpec(listen_port=8080, target="web.default.svc:80")]
    await asyncio.sleep(0.2)  # let the stream connect
    pushed = await coord.admin.put_tunnels(joined.node_id, tunnels)
    event = await next_event(stream)
    assert event.type == "config" and event.config.tunnels == tunnels and event.version == pushed.version
    await coord.admin.put_tunnels(other.node_id, [])  # another node's change is not ours
    _, gw, _ = await coord.gateway("late-gw")
    event = await next_event(stream)
    assert event.type == "gateway_changed"
    assert [g.id for g in event.config.gateways] == [gw.gateway_id]
    await stream.aclose()


async def test_node_resuming_behind_gets_current_config(coord):
    client, joined, _ = await coord.join()
    pushed = await coord.admin.put_tunnels(joined.node_id, [TunnelSpec(listen_port=1, target="a:1")])
    stream = client.watch(joined.config.version)
    event = await next_event(stream)
    assert event.type == "config" and event.version == pushed.version
    await stream.aclose()
    stream = client.watch(0)
    assert (await next_event(stream)).type == "snapshot"
    await stream.aclose()


async def test_watch_ends_with_401_when_node_is_deleted(coord):
    client, joined, _ = await coord.join()
    stream = client.watch(0)
    await next_event(stream)
    await coord.admin.delete_node(joined.node_id)
    with pytest.raises(CoordinatorError) as err:
        await next_event(stream)
    assert err.value.status == 401 and not err.value.retryable


async def test_watch_rejects_bad_credentials_and_since(coord):
    with pytest.raises(CoordinatorError) as err:
        await anext(coord.client("anexnc_nope").watch(0))
    assert err.value.status == 401
    gw_client, _, _ = await coord.gateway()
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(coord.url + "/v1/watch?since=-1",
                               headers={"Authorization": f"Bearer {gw_client.credential}"}) as resp:
            assert resp.status == 400
            assert (await resp.json(content_type=None))["errors"][0]["field"] == "since"


async def test_resume_from_a_pruned_version_gets_a_snapshot(coord):
    from anex_agent.coordinator import changes

    gw_client, _, _ = await coord.gateway()
    stream = gw_client.watch(0)
    old = await next_event(stream)
    await stream.aclose()
    joined = [(await coord.join(f"n{i}"))[1] for i in range(4)]
    assert await changes.prune(coord.ctx.db, keep=2) > old.version
    stream = gw_client.watch(old.version)
    event = await next_event(stream)
    assert event.type == "snapshot"
    assert {p.node_id for p in event.peers} == {j.node_id for j in joined}
    await stream.aclose()


async def test_a_rejoin_seen_late_does_not_close_the_new_stream(coord):
    token = await coord.admin.create_join_token(reusable=True)
    from anex_agent.wire import keys

    pair = keys.KeyPair(keys.generate_private_key())
    first = await coord.client().join(token.token, pair, "n", "other")
    old_stream = coord.client(first.credential).watch(0)
    assert (await next_event(old_stream)).type == "snapshot"
    # hold the feed back so the re-join reaches it only after the new stream is open
    feed = coord.ctx.feed
    original = feed.catch_up
    release = asyncio.Event()

    async def late_catch_up():
        await release.wait()
        await original()

    feed.catch_up = late_catch_up
    print("patched", feed.version)
    client = coord.client()
    second = await client.join(token.token, pair, "n", "other")
    new_stream = client.watch(0)
    assert (await next_event(new_stream)).type == "snapshot"
    feed.catch_up = original
    release.set()
    print("released", feed.version, [ (s.kind, s.ident) for s in feed._subscriptions])
    feed.poke()
    with pytest.raises(CoordinatorError) as err:  # the old credential's stream is closed ...
        await next_event(old_stream)
    assert err.value.status == 401
    # ... the new one stays and still gets changes
    await coord.admin.put_tunnels(second.node_id, [TunnelSpec(listen_port=7, target="a:7")])
    event = await next_event(new_stream)
    assert event.type == "config" and event.config.tunnels[0].listen_port == 7
    await new_stream.aclose()


async def test_delivery_survives_losing_the_notify_connection(coord):
    """Polling keeps delivering while the NOTIFY connection is gone, and it comes back."""
    db = coord.ctx.db
    if db.dialect != "postgresql":
        pytest.skip("NOTIFY exists only on PostgreSQL")
    gw_client, _, _ = await coord.gateway()
    stream = gw_client.watch(0)
    await next_event(stream)
    await db._listen_conn.close()  # as if the database restarted
    assert not db.listening()
    # as if the change came from another process (no local poke): only polling can find it
    original_poke = coord.ctx.feed.poke
    coord.ctx.feed.poke = lambda: None
    try:
        _, joined, _ = await coord.join("quiet")
        event = await next_event(stream)
        assert event.type == "peer_added" and event.peer.node_id == joined.node_id
    finally:
        coord.ctx.feed.poke = original_poke
    await wait_until(db.listening, what="the NOTIFY connection coming back")
    await stream.aclose()


async def test_gateway_change_reaches_many_node_watchers_with_one_gateway_read(coord):
    streams, joined = [], []
    for i in range(15):
        client, j, _ = await coord.join(f"n{i}")
        joined.append(j)
        stream = client.watch(0)
        assert (await next_event(stream)).type == "snapshot"
        streams.append(stream)
    loads_before = coord.ctx.gateway_set.loads
    _, gw, _ = await coord.gateway("new-gw", endpoint="192.0.2.1:51820")
    events = await asyncio.gather(*(next_event(s) for s in streams))
    for event, j in zip(events, joined):
        assert event.type == "gateway_changed"
        assert event.config.node_id == j.node_id and event.config.address == j.config.address
        assert [g.id for g in event.config.gateways] == [gw.gateway_id]
        assert event.config.dns == [gw.address]
        assert event.config == await coord.admin.get_config(j.node_id)  # same as a fresh read
    assert coord.ctx.gateway_set.loads - loads_before == 1
    for s in streams:
        await s.aclose()


async def test_watch_of_a_node_deleted_elsewhere_ends_with_401_not_an_error(coord, caplog):
    """Another coordinator deleted the node and this one has not heard yet (its credential is
    still cached): the stream opens, finds no node, and closes as revoked, without a traceback."""
    client, joined, _ = await coord.join("gone")
    await client.heartbeat(joined.node_id, Heartbeat())  # caches the credential here
    await coord.ctx.db.execute("DELETE FROM nodes WHERE id = $1", joined.node_id)
    stream = client.watch(0)
    with pytest.raises(CoordinatorError) as err:
        await asyncio.wait_for(anext(stream), GENEROUS)
    assert err.value.status == 401 and not err.value.retryable
    assert "Traceback" not in caplog.text and "Error handling request" not in caplog.text


async def test_watch_of_a_gateway_deleted_elsewhere_ends_with_401(coord):
    gw_client, gw, _ = await coord.gateway("gone-gw")
    await gw_client.get_peers(gw.gateway_id)  # caches the credential here
    await coord.ctx.db.execute("DELETE FROM gateways WHERE id = $1", gw.gateway_id)
    with pytest.raises(CoordinatorError) as err:
        await asyncio.wait_for(anext(gw_client.watch(0)), GENEROUS)
    assert err.value.status == 401 and not err.value.retryable


async def test_changes_pruned_before_this_process_read_them_make_watchers_resync(coord):
    """Another coordinator wrote changes and pruned them before this process's feed read them
    (a long outage of this process's database connection). A connected gateway would miss
    them: it must be sent back for a snapshot instead (closed as retryable, resumes, snapshot)."""
    import json

    from anex_agent.coordinator import changes

    gw_client, _, _ = await coord.gateway()
    stream = gw_client.watch(0)
    first = await next_event(stream)
    assert first.type == "snapshot" and first.peers == []
    _, joined, _ = await coord.join("seen-only-in-the-snapshot")
    added = await next_event(stream)
    assert added.type == "peer_added"
    db = coord.ctx.db
    async with db.transaction() as tx:  # what the other coordinator did, seen here all at once
        row = await tx.fetchrow("SELECT * FROM nodes WHERE id = $1", joined.node_id)
        await tx.execute("DELETE FROM nodes WHERE id = $1", joined.node_id)
        await changes.append(db, tx, changes.Scope.ALL_GATEWAYS, changes.ChangeType.PEER_REMOVED, target=joined.node_id,
                             payload={"node_id": row["id"], "name": row["name"], "public_key": row["public_key"],
                                      "allowed_ips": [f"{row['address']}/32"]}, now=1.0)
        pruned = await changes.current_version(tx)
        await tx.execute("DELETE FROM changes WHERE version <= $1", pruned)
        await tx.execute("UPDATE counters SET value = $1 WHERE name = 'pruned_through'", pruned)
        await changes.append(db, tx, changes.Scope.ALL_NODES, changes.ChangeType.GATEWAY_CHANGED, now=1.0)
    event = await next_event(stream)
    assert event.type == "snapshot", json.dumps(event.model_dump(mode="json"))
    assert event.peers == []
    await stream.aclose()
