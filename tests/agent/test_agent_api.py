"""Agent API: routes, loopback without token, mesh side with a verified bearer token."""

import pytest
from tests.agent.api_client import ApiClient
from prometheus_client import Counter

from anex_agent.wire import access_token
from anex_agent.wire.access_token import Claims
from anex_agent.agent.api import AgentApi

SIGNING_KEY = access_token.generate_signing_key()
VERIFY_KEY = access_token.verify_key_of(SIGNING_KEY)


def make_api(ready=(True, "handshake 3 s ago"), local=True, seen=None):
    async def status():
        return {"engine": "wireguard-go", "tunnels": [{"listen_port": 5000}]}

    async def is_ready():
        return ready

    def verify(token, now):
        if seen is not None:
            seen.append(token)
        return Claims("n-1", int(now), int(now) + 60, token_id=token) if token == "good" else None

    return AgentApi(status, is_ready, verify, is_local=lambda request: local)


async def client_for(api):
    client = ApiClient(api)
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
    api = AgentApi(lambda: None, lambda: None, lambda t, now: 1 / 0, is_local=lambda r: False)
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


class FakeClock:
    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def token_api(clock, replay=None):
    """An agent API that verifies real coordinator-signed tokens for node n-1, as the agent does."""

    async def status():
        return {"engine": "wireguard-go"}

    async def ready():
        return True, "ok"

    def verify(token, now):
        try:
            return access_token.verify(VERIFY_KEY, token, node_id="n-1", now=now)
        except access_token.InvalidAccessToken:
            return None

    return AgentApi(status, ready, verify, is_local=lambda request: False, clock=clock, replay=replay)


async def test_a_replayed_token_is_401_over_real_http():
    """One token, one call: the second use of the same token is refused, on a real socket."""
    import socket

    import aiohttp

    clock = FakeClock()
    api = token_api(clock)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    await api.start("127.0.0.1", port)
    try:
        token, _ = access_token.sign(SIGNING_KEY, "n-1", now=clock(), ttl=300)
        fresh, _ = access_token.sign(SIGNING_KEY, "n-1", now=clock(), ttl=300)
        url = f"http://127.0.0.1:{port}/status"
        async with aiohttp.ClientSession() as session:
            async def call(t):
                async with session.get(url, headers={"Authorization": f"Bearer {t}"}) as resp:
                    return resp.status, await resp.json(content_type=None), resp.headers

            first, body, _ = await call(token)
            assert first == 200 and body["engine"] == "wireguard-go"
            second, problem, headers = await call(token)
            assert second == 401 and "used already" in problem["detail"] and "engine" not in problem
            assert headers["Content-Type"].startswith("application/problem+json")
            assert "Bearer" in headers["WWW-Authenticate"]
            clock.now += 299
            assert (await call(token))[0] == 401  # still alive, still remembered
            assert (await call(fresh))[0] == 200  # a new token per call works
            clock.now += 1
            assert (await call(token))[0] == 403  # expired now
            assert len(api._replay) == 2
            later, _ = access_token.sign(SIGNING_KEY, "n-1", now=clock(), ttl=300)
            assert (await call(later))[0] == 200
            assert len(api._replay) == 1  # the ids of the two expired tokens were forgotten
    finally:
        await api.close()


async def test_a_full_replay_cache_answers_429_with_retry_after():
    clock = FakeClock()
    api = token_api(clock, replay=access_token.ReplayCache(capacity=2))
    client = await client_for(api)
    try:
        tokens = [access_token.sign(SIGNING_KEY, "n-1", now=clock(), ttl=ttl)[0] for ttl in (60, 300, 300)]
        for token in tokens[:2]:
            assert (await client.get("/healthz", headers={"Authorization": f"Bearer {token}"})).status == 200
        resp = await client.get("/healthz", headers={"Authorization": f"Bearer {tokens[2]}"})
        assert resp.status == 429 and resp.headers["Retry-After"] == "60"
        assert (await resp.json())["status"] == 429
        clock.now += 60  # the first token expired: its slot is free
        assert (await client.get("/healthz", headers={"Authorization": f"Bearer {tokens[2]}"})).status == 200
    finally:
        await client.close()


async def test_a_token_living_longer_than_an_hour_is_refused():
    import base64
    import json

    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    clock = FakeClock()
    body = {"v": 1, "sub": "n-1", "iat": int(clock()), "exp": int(clock()) + 3601, "jti": "long"}
    payload = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    signature = Ed25519PrivateKey.from_private_bytes(SIGNING_KEY).sign(f"anexat.{payload}".encode())
    token = f"anexat.{payload}.{base64.urlsafe_b64encode(signature).rstrip(b'=').decode()}"
    client = await client_for(token_api(clock))
    try:
        assert (await client.get("/healthz", headers={"Authorization": f"Bearer {token}"})).status == 403
    finally:
        await client.close()


async def test_unknown_routes_and_methods_are_problem_documents():
    client = await client_for(make_api())
    try:
        resp = await client.get("/nope")
        assert resp.status == 404 and resp.headers["Content-Type"] == "application/problem+json"
        assert (await resp.json())["status"] == 404
        resp = await client.post("/healthz")
        assert resp.status == 405 and resp.headers["Allow"] == "GET, HEAD"
        resp = await client.request("HEAD", "/healthz")
        assert resp.status == 200 and resp.headers["Content-Length"] == "3" and await resp.read() == b""
    finally:
        await client.close()
