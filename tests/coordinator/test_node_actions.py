"""The cluster's actions through the coordinator: signal, restart, push a file, forwarded to
a real agent API (on a loopback mesh address, every caller treated as remote: the
coordinator's own single-use token is checked); admin only."""

from __future__ import annotations

import asyncio
import sys

import aiohttp
import pytest

from anex_agent.wire import access_token
from anex_agent.agent.actions import add_routes
from anex_agent.agent.api import AgentApi
from anex_agent.agent.workload import Workload
from tests.coordinator.test_node_logs import mesh_coord  # noqa: F401

TRAP = ("import signal,sys,time\n"
        "def h(n,f): print(signal.Signals(n).name, flush=True)\n"
        "signal.signal(signal.SIGUSR2, h)\n"
        "print('up', flush=True)\n"
        "while True: time.sleep(0.05)\n")


async def test_signal_restart_and_push_through_the_coordinator(mesh_coord, tmp_path):  # noqa: F811
    coord = mesh_coord
    node_client, joined, _ = await coord.join("n1")
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    w = Workload([sys.executable, "-c", TRAP], grace=0.5)
    await w.start(stdout=asyncio.subprocess.PIPE)
    assert (await w.proc.stdout.readline()).strip() == b"up"

    def verify(token, now):
        try:
            return access_token.verify(coord.ctx.verify_key, token, node_id=joined.node_id, now=now)
        except Exception:
            return None

    async def status():
        return {}

    async def ready():
        return True, ""

    api = AgentApi(status, ready, verify, is_local=lambda request: False, clock=coord.clock)
    add_routes(api, lambda: w, push_dirs=[str(inbox)])
    try:
        await api.start(joined.config.address, 9555)
    except OSError as err:
        pytest.skip(f"cannot listen on {joined.config.address}:9555 here: {err}")
    base = f"{coord.url}/v1/nodes/{joined.node_id}"
    admin = {"Authorization": f"Bearer {coord.ctx.admin_token}"}
    waiter = asyncio.create_task(w.wait())
    try:
        async with aiohttp.ClientSession() as session:
            for headers in ({}, {"Authorization": f"Bearer {node_client.credential}"}):
                async with session.post(f"{base}/signal", params={"name": "USR2"}, headers=headers) as resp:
                    assert resp.status in (401, 403)
            async with session.post(f"{base}/signal", params={"name": "USR2"}, headers=admin) as resp:
                assert resp.status == 202, await resp.text()
            assert (await asyncio.wait_for(w.proc.stdout.readline(), 5)).strip() == b"SIGUSR2"
            async with session.post(f"{base}/signal", params={"name": "nope"}, headers=admin) as resp:
                assert resp.status == 400 and (await resp.json())["field"] == "name"

            async with session.put(f"{base}/files", params={"path": f"{inbox}/cfg.json", "mode": "0600"},
                                   data=b'{"lr": 0.1}', headers=admin) as resp:
                assert resp.status == 201, await resp.text()
            assert (inbox / "cfg.json").read_bytes() == b'{"lr": 0.1}'
            async with session.put(f"{base}/files", params={"path": f"{inbox}/../escape"}, data=b"x",
                                   headers=admin) as resp:
                assert resp.status == 400
            assert not (tmp_path / "escape").exists()

            first = w.proc.pid
            async with session.post(f"{base}/restart", headers=admin) as resp:
                assert resp.status == 202
            for _ in range(100):  # the trap ignores nothing but SIGTERM ends it: restarted
                if w.proc.pid != first and w.state.state == "running":
                    break
                await asyncio.sleep(0.05)
            assert w.state.restart_count == 1
        await api.close()
        async with aiohttp.ClientSession() as session:  # the node is out of reach now
            async with session.post(f"{base}/restart", headers=admin) as resp:
                assert resp.status == 502
    finally:
        await api.close()
        w.kill_group()
        await asyncio.wait_for(waiter, 10)
