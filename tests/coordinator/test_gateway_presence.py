"""Gateways that come and go: a stop marks a gateway gone, silence expires it, its return brings it back;
nodes follow through their watch stream; only the gateway itself or the admin may mark it gone."""

from __future__ import annotations

import asyncio

import pytest

from anex_agent.coordinator import gateways
from anex_agent.errors import CoordinatorError
from tests.coordinator.conftest import start_harness, stop_harness

WAIT = 5.0


async def next_event(stream):
    return await asyncio.wait_for(anext(stream), WAIT)


async def _node_watching(coord):
    client, joined, _ = await coord.join("n")
    stream = client.watch(0)
    assert (await next_event(stream)).type == "snapshot"
    return stream, joined


async def test_a_gateway_that_stops_leaves_the_nodes_configs_and_comes_back_with_its_watch(coord):
    gw_client, gw, _ = await coord.gateway("gw-a", endpoint="192.0.2.1:51820")
    coord.clock.advance(1)  # nodes list gateways oldest first
    _, other, _ = await coord.gateway("gw-b", endpoint="192.0.2.2:51820")
    stream, joined = await _node_watching(coord)

    view = await gw_client.gateway_gone(gw.gateway_id)  # as it stops: its own credential
    assert view.gone_at is not None and view.gone_reason == "stopped"
    event = await next_event(stream)
    assert event.type == "gateway_changed" and [g.id for g in event.config.gateways] == [other.gateway_id]
    assert event.config.dns == [other.address]
    assert [g.id for g in (await coord.admin.get_config(joined.node_id)).gateways] == [other.gateway_id]
    listed = {g.id: g for g in (await coord.admin.list_gateways()).gateways}
    assert listed[gw.gateway_id].gone_at is not None and listed[other.gateway_id].gone_at is None
    assert not await gateways.mark_gone(coord.ctx, gw.gateway_id, "again")  # gone once: no second event

    back = gw_client.watch(0)  # it starts again from its saved registration: its stream opens
    assert (await next_event(back)).type == "snapshot"
    event = await next_event(stream)
    assert event.type == "gateway_changed"
    assert [g.id for g in event.config.gateways] == [gw.gateway_id, other.gateway_id]  # in its place again
    assert (await coord.admin.list_gateways()).gateways[0].gone_at is None
    await back.aclose()
    await stream.aclose()


async def test_only_the_gateway_itself_or_the_admin_may_mark_it_gone(coord):
    _, gw, _ = await coord.gateway("gw-a")
    other_client, other, _ = await coord.gateway("gw-b")
    node_client, joined, _ = await coord.join("n")
    with pytest.raises(CoordinatorError) as err:
        await other_client.gateway_gone(gw.gateway_id)
    assert err.value.status == 403
    with pytest.raises(CoordinatorError) as err:
        await node_client.gateway_gone(gw.gateway_id)
    assert err.value.status == 401  # a node's credential is none here
    with pytest.raises(CoordinatorError) as err:
        await coord.client().gateway_gone(gw.gateway_id, auth=None)
    assert err.value.status == 401
    assert all(g.gone_at is None for g in (await coord.admin.list_gateways()).gateways)
    view = await coord.admin.gateway_gone(gw.gateway_id, auth="admin")
    assert view.gone_reason == "marked gone by the admin"
    with pytest.raises(CoordinatorError) as err:
        await coord.admin.gateway_gone("g-nosuch", auth="admin")
    assert err.value.status == 404


async def test_a_silent_gateway_is_gone_after_the_setting_and_not_before(coord):
    gw_client, gw, _ = await coord.gateway("gw-a")
    _, quiet, _ = await coord.gateway("gw-b")
    stream, _ = await _node_watching(coord)
    after = coord.ctx.settings.gateway_gone_after
    coord.clock.advance(after - 1)
    assert await gateways.expire_silent(coord.ctx) == 0
    await gw_client.get_peers(gw.gateway_id)  # a sign of life from gw-a only
    coord.clock.advance(2)
    assert await gateways.expire_silent(coord.ctx) == 1
    event = await next_event(stream)
    assert event.type == "gateway_changed" and [g.id for g in event.config.gateways] == [gw.gateway_id]
    listed = {g.id: g for g in (await coord.admin.list_gateways()).gateways}
    assert listed[quiet.gateway_id].gone_reason == f"nothing heard of it for {after:.0f} s"
    await stream.aclose()


async def test_an_open_watch_stream_keeps_a_gateway_present(coord):
    gw_client, gw, _ = await coord.gateway("gw-a")
    stream = gw_client.watch(0)
    assert (await next_event(stream)).type == "snapshot"
    before = (await coord.admin.list_gateways()).gateways[0].last_seen_at
    coord.clock.advance(30)
    await gateways.touch(coord.ctx, gw.gateway_id)  # what the stream's presence task does every few seconds
    assert (await coord.admin.list_gateways()).gateways[0].last_seen_at > before
    await gateways.mark_gone(coord.ctx, gw.gateway_id, "stopped")
    await gateways.touch(coord.ctx, gw.gateway_id)  # a touch does not undo a stop
    assert (await coord.admin.list_gateways()).gateways[0].gone_at is not None
    await stream.aclose()


async def test_no_gateway_expires_before_the_coordinator_listened_that_long(coord):
    await coord.gateway("gw-a")
    coord.clock.advance(3 * coord.ctx.settings.gateway_gone_after)
    coord.ctx.started_at = coord.clock()  # as after a restart: the gateways had nowhere to reach
    assert await gateways.expire_silent(coord.ctx) == 0


async def test_gone_survives_a_coordinator_restart(tmp_path, database_url, clock):
    first = await start_harness(tmp_path, database_url, clock)
    try:
        _, gw, _ = await first.gateway("gw-a")
        await first.admin.gateway_gone(gw.gateway_id, auth="admin")
    finally:
        await stop_harness(first)
        await first.ctx.close()
    second = await start_harness(tmp_path, database_url, clock)
    try:
        (view,) = (await second.admin.list_gateways()).gateways
        assert view.gone_at is not None
    finally:
        await stop_harness(second)
        await second.ctx.close()
