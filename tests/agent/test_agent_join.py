"""Identity and join against the real coordinator app (SQLite, in-process): join once, re-use the
credential, fail static on the last good config, retry with a one-line message, rejoin when deleted."""

import asyncio
import socket
from pathlib import Path

import pytest

from anex_agent.agent.settings import AgentSettings
from anex_agent.agent.state import StateDir
from anex_agent.agent.supervisor import Agent
from anex_agent.wire.nodes import NodeFacts




def closed_port_url() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


def make_agent(url: str, state: Path, token: str = "") -> Agent:
    return Agent(AgentSettings(coordinator_url=url, join_token=token, state_dir=state, name="unit-node"))


async def join(agent: Agent):
    agent.link.keypair = agent.state.keypair()  # as Agent.run does
    try:
        return await agent._join_or_load(agent.link.keypair.public_b64, NodeFacts())
    finally:
        await agent.link.close()


async def test_join_once_then_reuse_the_credential(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token()).token
    first = make_agent(url, tmp_path / "st", token)
    config = await join(first)
    assert config.address and first.identity is not None
    assert (tmp_path / "st" / "node.json").stat().st_mode & 0o777 == 0o600
    # restart: no token needed (the single-use token is spent), same node
    second = make_agent(url, tmp_path / "st", "")
    again = await join(second)
    assert second.identity.node_id == first.identity.node_id and again.address == config.address
    assert second.coordinator_reachable is True


async def test_fail_static_start_on_the_last_good_config(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token()).token
    first = make_agent(url, tmp_path / "st", token)
    config = await join(first)
    StateDir(tmp_path / "st").save_config(config)
    # the coordinator moves away (unreachable): start from the saved config, no waiting for it
    state = StateDir(tmp_path / "st")
    ident = state.load_identity(url)
    down = closed_port_url()
    from anex_agent.agent.state import NodeIdentity

    state.save_identity(NodeIdentity(down, ident.node_id, ident.credential))
    agent = make_agent(down, tmp_path / "st")
    loaded = await asyncio.wait_for(join(agent), 10)
    assert loaded == config
    assert agent.coordinator_reachable is False and agent.last_coordinator_error


async def test_unreachable_without_identity_retries_with_one_line(tmp_path, caplog):
    agent = make_agent(closed_port_url(), tmp_path / "st", "some-token")
    task = asyncio.create_task(join(agent))
    for _ in range(100):
        await asyncio.sleep(0.05)
        lines = [r.getMessage() for r in caplog.records if "retrying in" in r.getMessage()]
        if lines:
            break
    else:
        pytest.fail("no retrying message")
    assert "unreachable" in lines[0] and "\n" not in lines[0] and not caplog.records[-1].exc_info
    assert not task.done()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_deleted_node_joins_again(coordinator, tmp_path):
    url, admin = coordinator
    token = (await admin.create_join_token(reusable=True)).token
    first = make_agent(url, tmp_path / "st", token)
    await join(first)
    await admin.delete_node(first.identity.node_id)
    second = make_agent(url, tmp_path / "st", token)
    await join(second)
    assert second.identity.node_id != first.identity.node_id


def make_agent_from(url: str, state: Path, source: str, token: str) -> Agent:
    return Agent(AgentSettings(coordinator_url=url, join_token=token, state_dir=state, name="unit-node",
                               join_token_source=source))


async def refused_line(url: str, state: Path, token: str, source: str = "ANEX_JOIN_TOKEN") -> str:
    from anex_agent.errors import ConfigError

    with pytest.raises(ConfigError) as info:  # not retried: exit status 2 and this one line
        await asyncio.wait_for(join(make_agent_from(url, state, source, token)), 30)
    assert info.value.source == source and "\n" not in str(info.value)
    assert "anex-agent admin tokens create --kind node, or POST /v1/join-tokens" in str(info.value)
    assert f"set it in {source}" in str(info.value)
    return str(info.value)


async def test_a_refused_token_is_not_retried_and_the_line_names_the_variable_and_why(coordinator, tmp_path):
    url, admin = coordinator
    assert "not valid (no such token" in await refused_line(url, tmp_path / "a", "not-a-token")
    used = (await admin.create_join_token()).token
    await join(make_agent(url, tmp_path / "b", used))
    assert "it is used up" in await refused_line(url, tmp_path / "c", used)
    gateway = (await admin.create_join_token("gateway")).token
    assert "it is a gateway join token; this needs a node join token" in await refused_line(url, tmp_path / "d", gateway)


async def test_a_token_from_a_file_names_the_file_variable(coordinator, tmp_path):
    url, _ = coordinator
    line = await refused_line(url, tmp_path / "st", "not-a-token", source="ANEX_JOIN_TOKEN_FILE")
    assert line.startswith("ANEX_JOIN_TOKEN_FILE: the coordinator refused this join token")


def test_an_expired_token_says_so_and_a_coordinator_that_does_not_say_why_gets_the_possible_causes():
    from anex_agent.client.join_token import refusal
    from anex_agent.errors import CoordinatorError

    expired = CoordinatorError("POST /v1/nodes: 401 join token refused: it expired at 2026-01-01 00:00:00 UTC",
                               status=401, problem={"reason": "expired", "errors": [
                                   {"field": "token", "message": "it expired at 2026-01-01 00:00:00 UTC"}]})
    assert str(refusal("--token-file", expired)).startswith(
        "--token-file: the coordinator refused this join token: it expired at 2026-01-01 00:00:00 UTC; get a new one")
    generic = CoordinatorError("POST /v1/nodes: 401 x", status=401, problem={"detail": "x"})
    assert "unknown, expired, used up or of another kind" in str(refusal("ANEX_JOIN_TOKEN", generic))
    assert refusal("ANEX_JOIN_TOKEN", CoordinatorError("x", status=403)) is None
