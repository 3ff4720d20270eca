"""Agent API: routes, loopback without token, mesh side with a verified bearer token."""

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client import Counter

from anex_agent.agent.api import AgentApi
from anex_agent.agent.backoff import Backoff


def make_api(ready=(True, "handshake 3 s ago"), local=True, seen=None):
    async def status():
        return {"engine": "wireguard-go", "tunnels": [{"listen_port": 5000}]}

    async def is_ready():
        return ready

    def verify(token):
        if seen is not None:
            seen.append(token)
        return token == "good"

    return AgentApi(status, is_ready, verify, is_local=lambda request: local)


async def client_for(api):
    client = TestClient(TestServer(api.app))
    await client.start_server()
    return client


async def test_loopback_routes_without_token():
    api = make_api()
    Counter("anex_test_total", "a test counter", registry=api.registry).inc(3)
    client = await client_for(api)
    try:
        assert (await client.get("/healthz")).status == 200
        resp = await client.get("/readyz")
        assert resp.status == 200 and "handshake 3 s ago" in await resp.text()
        resp = await client.get("/status")
        assert (await resp.json())["engine"] == "wireguard-go"
        resp = await client.get("/metrics")
        assert "anex_test_total 3.0" in await resp.text()
    finally:
        await client.close()


async def test_not_ready_is_503_with_reason():
    client = await client_for(make_api(ready=(False, "no handshake yet")))
    try:
        resp = await client.get("/readyz")
        assert resp.status == 503 and "no handshake yet" in await resp.text()
    finally:
        await client.close()


@pytest.mark.parametrize("header,status", [(None, 401), ("Basic Z29vZA==", 401), ("Bearer bad", 403), ("Bearer good", 200)])
async def test_mesh_side_needs_valid_bearer(header, status):
    seen = []
    client = await client_for(make_api(local=False, seen=seen))
    try:
        resp = await client.get("/status", headers={"Authorization": header} if header else {})
        assert resp.status == status
        if status != 200:
            body = await resp.json()
            assert body["status"] == status and body["detail"]
            assert "engine" not in body
    finally:
        await client.close()
    if header and header.startswith("Bearer"):
        assert seen == [header.split()[1]]


async def test_verifier_crash_denies():
    api = AgentApi(lambda: None, lambda: None, lambda t: 1 / 0, is_local=lambda r: False)
    client = await client_for(api)
    try:
        assert (await client.get("/healthz", headers={"Authorization": "Bearer x"})).status == 403
    finally:
        await client.close()


async def test_serves_on_a_real_socket_and_closes():
    import aiohttp

    api = make_api(local=True)
    from anex_agent.agent.api import is_loopback_peer

    api._is_local = is_loopback_peer
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await api.start("127.0.0.1", port)
    try:
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/status") as resp:
                assert resp.status == 200  # real loopback peer: no token needed
    finally:
        await api.close()
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", port))  # released


def test_backoff_grows_with_jitter_and_caps():
    import random

    b = Backoff(base=1, cap=8, rng=random.Random(1))
    delays = [b.next_delay() for _ in range(8)]
    for i, d in enumerate(delays):
        ceiling = min(8, 2**i)
        assert ceiling / 2 <= d <= ceiling
    b.reset()
    assert b.next_delay() <= 1
