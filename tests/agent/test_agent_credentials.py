"""The agent's heartbeat loop against the real coordinator app (SQLite, in-process): it keeps
working across credential rotations, joins again when its node expired, and stops clearly
when it cannot."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from anex_agent.agent import heartbeat
from anex_agent.agent.settings import AgentSettings
from anex_agent.agent.supervisor import Agent
from anex_agent.client.rest import CoordinatorClient
from anex_agent.coordinator import sweeper
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.settings import Settings
from anex_agent.coordinator.states import Timings
from anex_agent.wire.heartbeat import TransportStatus
from anex_agent.wire.nodes import NodeFacts
from tests.coordinator.conftest import FakeClock

TIMINGS = Timings(heartbeat_interval=0.2, not_ready_after=5, expired_after=10, credential_rotation=0.5,
                  credential_grace=30)


class FakeDataPlane:
    """What the heartbeat loop and apply_config touch; no engine."""

    host_address = None

    def __init__(self) -> None:
        self.config = None

    async def transport_status(self) -> TransportStatus:
        return TransportStatus(engine="fake")

    async def apply(self, config) -> None:
        self.config = config

    async def reset_gateway_sessions(self) -> None:
        pass


@pytest.fixture
async def fast_coordinator(tmp_path: Path):
    clock = FakeClock()
    settings = Settings.for_tests(tmp_path / "coord", poll_interval=0.2, sweep_interval=3600, timings=TIMINGS)
    settings.state_dir.mkdir()
    ctx = await Coordinator.open(settings, environ={}, clock=clock)
    server = TestServer(build_app(ctx))
    await server.start_server()
    url = str(server.make_url("")).rstrip("/")
    admin = CoordinatorClient(url, admin_token=ctx.admin_token)
    try:
        yield url, admin, ctx, clock
    finally:
        await admin.close()
        await server.close()


async def joined_agent(url: str, state: Path, token: str) -> Agent:
    agent = Agent(AgentSettings(coordinator_url=url, join_token=token, state_dir=state, name="unit-node"))
    agent.link.keypair = agent.state.keypair()
    agent.facts = NodeFacts()
    config = await agent._join_or_load(agent.link.keypair.public_b64, agent.facts)
    agent.dataplane = FakeDataPlane()
    await agent.apply_config(config)
    return agent


async def run_loop_until(agent: Agent, predicate, timeout: float) -> asyncio.Task:
    task = asyncio.create_task(heartbeat.heartbeat_loop(agent), name="test-heartbeat")
    try:
        async with asyncio.timeout(timeout):
            while not predicate() and not task.done():
                await asyncio.sleep(0.05)
    finally:
        if not task.done():
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    return task


async def test_the_agent_keeps_working_across_rotations(fast_coordinator, tmp_path):
    url, admin, ctx, clock = fast_coordinator
    agent = await joined_agent(url, tmp_path / "st", (await admin.create_join_token()).token)
    first = agent.identity.credential
    seen = {first}

    def rotated_twice() -> bool:
        seen.add(agent.identity.credential)
        if len(seen) < 3:
            clock.advance(0.2)  # rotation is due every 0.5 s of the coordinator's clock
        return len(seen) >= 3

    try:
        await run_loop_until(agent, rotated_twice, 15)
        assert len(seen) >= 3
        saved = json.loads((tmp_path / "st" / "node.json").read_text())
        assert saved["credential"] == agent.identity.credential != first
        assert (tmp_path / "st" / "node.json").stat().st_mode & 0o777 == 0o600
        assert agent.coordinator_reachable is True
        clock.advance(TIMINGS.credential_grace + 1)
        async with CoordinatorClient(url, credential=first) as old:
            with pytest.raises(Exception) as err:
                await old.get_config(agent.identity.node_id)
            assert getattr(err.value, "status", None) == 401
        async with CoordinatorClient(url, credential=agent.identity.credential) as current:
            await current.get_config(agent.identity.node_id)
    finally:
        await agent.link.close()


async def test_an_expired_node_joins_again_with_a_reusable_token(fast_coordinator, tmp_path):
    url, admin, ctx, clock = fast_coordinator
    agent = await joined_agent(url, tmp_path / "st", (await admin.create_join_token(reusable=True)).token)
    old = agent.identity
    clock.advance(TIMINGS.expired_after + 1)
    assert await sweeper.sweep(ctx) == 1
    try:
        await run_loop_until(agent, lambda: agent.identity.node_id != old.node_id, 15)
        assert agent.identity.node_id != old.node_id and agent.credential_revoked is None
        assert json.loads((tmp_path / "st" / "node.json").read_text())["node_id"] == agent.identity.node_id
        assert agent.dataplane.config.node_id == agent.identity.node_id
        assert [n.id for n in (await admin.list_nodes()).nodes] == [agent.identity.node_id]
    finally:
        await agent.link.close()


async def test_an_expired_node_with_a_used_token_stops_and_says_so(fast_coordinator, tmp_path, caplog):
    url, admin, ctx, clock = fast_coordinator
    agent = await joined_agent(url, tmp_path / "st", (await admin.create_join_token()).token)
    clock.advance(TIMINGS.expired_after + 1)
    assert await sweeper.sweep(ctx) == 1
    caplog.set_level(logging.ERROR)
    try:
        task = await run_loop_until(agent, lambda: False, 10)
    except TimeoutError:
        pytest.fail("the heartbeat loop kept going after its credential and token were refused")
    finally:
        await agent.link.close()
    assert task.done() and not task.cancelled()
    assert agent.credential_revoked and "join token" in agent.credential_revoked
    assert any("joining again was refused" in r.getMessage() for r in caplog.records)
    assert agent.coordinator_reachable is False


async def test_a_restarted_agent_with_its_key_joins_again_and_keeps_its_address(fast_coordinator, tmp_path):
    url, admin, ctx, clock = fast_coordinator
    token = (await admin.create_join_token(reusable=True)).token
    first = await joined_agent(url, tmp_path / "st", token)
    await first.link.close()
    (tmp_path / "st" / "node.json").unlink()  # the credential is gone, the key is not: it proves the same key
    second = await joined_agent(url, tmp_path / "st", token)
    try:
        assert second.identity.node_id == first.identity.node_id
        assert second.dataplane.config.address == first.dataplane.config.address
    finally:
        await second.link.close()
    (tmp_path / "st" / "private.key").unlink()  # a lost state dir: a new key is a new node
    (tmp_path / "st" / "node.json").unlink()
    third = await joined_agent(url, tmp_path / "st", token)
    try:
        assert third.identity.node_id != first.identity.node_id
        assert third.dataplane.config.address != first.dataplane.config.address
    finally:
        await third.link.close()
