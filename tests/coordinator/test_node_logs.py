"""GET /v1/nodes/{id}/logs: the coordinator streams a node's workload logs from its agent API,
with a single-use access token of its own; admin only; 502 when the node cannot be reached.

The node's mesh addresses come from 127.77.0.0/24 here, so a real agent API on loopback
stands in for the node (it is told every caller is remote: the token is checked)."""

from __future__ import annotations

import asyncio
import socket

import aiohttp
import pytest

from anex_agent.wire import access_token
from anex_agent.agent.api import AgentApi
from anex_agent.agent.logs import LogStore
from anex_agent.agent.logs_api import add_routes
from anex_agent.errors import CoordinatorError
from tests.coordinator.conftest import start_harness, stop_harness

NETWORK = "127.77.0.0/24"


def _free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@pytest.fixture
async def mesh_coord(tmp_path, clock):
    harness = await start_harness(tmp_path, None, clock, network=NETWORK)
    try:
        yield harness
    finally:
        await stop_harness(harness)


async def _agent(coord, node_id, address, store, seen):
    config_key = coord.ctx.verify_key

    def verify(token, now):
        seen.append(token)
        try:
            return access_token.verify(config_key, token, node_id=node_id, now=now)
        except Exception:
            return None

    async def status():
        return {}

    async def ready():
        return True, ""

    api = AgentApi(status, ready, verify, is_local=lambda request: False, clock=coord.clock)
    add_routes(api.app, lambda: store)
    await api.start(address, 9555)
    return api


async def test_logs_are_streamed_through_the_coordinator(mesh_coord):
    coord = mesh_coord
    _, joined, _ = await coord.join("n1")
    address = joined.config.address
    store = LogStore(None)
    for i in range(3):
        store.append("stdout" if i != 1 else "stderr", b"line %d" % i)
    seen: list[str] = []
    try:
        api = await _agent(coord, joined.node_id, address, store, seen)
    except OSError as err:
        pytest.skip(f"cannot listen on {address}:9555 here: {err}")
    try:
        text = b"".join([c async for c in coord.admin.node_logs(joined.node_id, tail=2)])
        assert text == b"line 1\nline 2\n"
        text = b"".join([c async for c in coord.admin.node_logs(joined.node_id, stream="stdout", timestamps=1)])
        assert [line.split(b" ", 1)[1] for line in text.splitlines()] == [b"line 0", b"line 2"]
        assert len(seen) == 2 and seen[0] != seen[1]  # a fresh token for each call
        direct = b"".join([c async for c in coord.admin.node_logs(joined.node_id, direct=True, tail=1)])
        assert direct == b"line 2\n" and len(seen) == 3  # the client's own token, straight to the agent
        # follow: lines arrive while the stream is open, and it ends with the workload
        chunks = coord.admin.node_logs(joined.node_id, follow=1, since="2000-01-01T00:00:00Z")
        got = b""
        while got.count(b"\n") < 3:
            got += await asyncio.wait_for(chunks.__anext__(), 5)
        store.append("stdout", b"live")
        while not got.endswith(b"live\n"):
            got += await asyncio.wait_for(chunks.__anext__(), 5)
        store.close()
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(chunks.__anext__(), 5)
        # a bad parameter: the agent's 400 comes back naming it
        with pytest.raises(CoordinatorError) as err:
            [c async for c in coord.admin.node_logs(joined.node_id, stream="both")]
        assert err.value.status == 400 and err.value.problem["field"] == "stream"
        with pytest.raises(CoordinatorError) as err:
            [c async for c in coord.admin.node_logs(joined.node_id, tail="x")]
        assert err.value.status == 400
    finally:
        await api.close()


async def test_node_logs_need_the_admin_and_report_an_unreachable_node(mesh_coord):
    coord = mesh_coord
    node_client, joined, _ = await coord.join("n1")
    async with aiohttp.ClientSession() as session:
        for headers in ({}, {"Authorization": f"Bearer {node_client.credential}"}):
            async with session.get(f"{coord.url}/v1/nodes/{joined.node_id}/logs", headers=headers) as resp:
                assert resp.status in (401, 403)
    with pytest.raises(CoordinatorError) as err:  # nothing listens at the node's address
        [c async for c in coord.admin.node_logs(joined.node_id)]
    assert err.value.status == 502 and joined.config.address in err.value.problem["detail"]
    with pytest.raises(CoordinatorError) as err:
        [c async for c in coord.admin.node_logs("n_missing")]
    assert err.value.status == 404
