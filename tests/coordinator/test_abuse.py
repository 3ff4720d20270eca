"""The coordinator under abuse: body limits (413), join tokens checked before the body and
before the write lock, failed-auth rate limit (429), header/body timeouts, connection cap,
bounded watch queues (1012), fleet /metrics behind a token, GET /v1/nodes without telemetry."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
import sys
import time

import aiohttp
import pytest
from aiohttp import web

from anex_agent.wire import keys
from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.nodes import NodeJoinRequest
from anex_agent.client.rest import proven_body
from anex_agent.coordinator import auth as auth_module
from anex_agent.coordinator import changes, limits, metrics
from anex_agent.coordinator.routes import fleet_metrics as telemetry_metrics
from anex_agent.coordinator.app import build_app
from anex_agent.coordinator.limits import Limits
from anex_agent.errors import ConfigError

from tests.polling import GENEROUS

from .conftest import start_harness, stop_harness

BAD_TOKEN = "anexjt_" + "x" * 43


@pytest.fixture
async def harness_with(tmp_path, database_url, clock):
    made = []

    async def make(**overrides):
        h = await start_harness(tmp_path, database_url, clock, **overrides)
        made.append(h)
        return h

    yield make
    for h in made:
        await stop_harness(h)


def join_body(token: str, name: str = "n", **extra) -> dict:
    pair = keys.KeyPair(keys.generate_private_key())
    return {"token": token, "public_key": pair.public_b64, "name": name, "provider": "vastai", **extra}


def proven_join_body(ctx, token: str, name: str = "n") -> dict:
    """A join body with its proof of key possession, made against ``ctx``'s key and clock."""
    body = {"token": token, "name": name, "provider": "vastai"}
    return proven_body(NodeJoinRequest, body, keys.KeyPair(keys.generate_private_key()),
                       ctx.coordinator_public, now=ctx.clock())


async def request(coord, method, path, *, token=None, body=None, data=None, headers=None):
    hdrs = dict(headers or {})
    if token:
        hdrs["Authorization"] = f"Bearer {token}"
    async with aiohttp.ClientSession() as session:
        kwargs = {"json": body} if body is not None else {"data": data}
        async with session.request(method, coord.url + path, headers=hdrs, **kwargs) as resp:
            return resp.status, dict(resp.headers), await resp.read()


async def raw_exchange(coord, payload: bytes, *, read_timeout: float = 5.0) -> bytes:
    """Send ``payload`` on a fresh connection; return what comes back until the server closes
    or ``read_timeout`` passes."""
    host, port = coord.server.host, coord.server.port
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(payload)
    await writer.drain()
    got = b""
    try:
        async with asyncio.timeout(read_timeout):
            while chunk := await reader.read(65536):
                got += chunk
                if b"\r\n\r\n" in got and b"Content-Length: " in got:
                    head, _, rest = got.partition(b"\r\n\r\n")
                    length = int(head.split(b"Content-Length: ")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
    except TimeoutError:
        pass
    writer.close()
    return got


# ---------------------------------------------------------------- join: token before body and lock


class CountingLock(asyncio.Lock):
    def __init__(self) -> None:
        super().__init__()
        self.acquired = 0

    async def acquire(self) -> bool:
        self.acquired += 1
        return await super().acquire()


FLOOD = """
import asyncio, sys, aiohttp
async def main(url, concurrency, body, token):
    count = 0
    headers = {"Content-Type": "application/json", **({"Authorization": "Bearer " + token} if token else {})}
    async def one():
        nonlocal count
        async with aiohttp.ClientSession() as session:
            while True:
                async with session.post(url, data=body, headers=headers) as r:
                    assert r.status == 401, r.status
                    await r.read()
                    count += 1
                    if count == 20:
                        print("flooding", flush=True)
    await asyncio.gather(*(one() for _ in range(concurrency)))
asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]))
"""


async def test_bad_join_token_flood_never_takes_the_lock_and_config_reads_go_on(harness_with):
    """During a flood of bad join tokens (16 clients, each request refused with 401) the join
    lock is never taken, a node's config reads all succeed with its own config while the flood
    runs, and afterwards a good token still joins (taking the lock). How much the flood delays
    those reads, beside a flood of bad heartbeat credentials, is measured by
    ``bench/bench_auth_flood.py``, not here."""
    coord = await harness_with(limits=Limits(failed_auth_max=10**9))
    client, joined, _ = await coord.join("victim")
    lock = coord.ctx.join_lock = CountingLock()

    flood = await asyncio.create_subprocess_exec(
        sys.executable, "-c", FLOOD, coord.url + "/v1/nodes", "16", json.dumps(join_body(BAD_TOKEN)), "",
        stdout=asyncio.subprocess.PIPE,
    )
    def refused_so_far() -> float:
        return coord.ctx.metrics.requests.labels(route="POST /v1/nodes", status="401")._value.get()

    try:
        async with asyncio.timeout(GENEROUS):
            assert await flood.stdout.readline() == b"flooding\n"
        # config reads while the flood runs: until it was refused more than 200 times (and 20 reads
        # at least), each read with the node's own config; the deadline only bounds a stalled flood
        reads = 0
        async with asyncio.timeout(GENEROUS):
            while reads < 20 or refused_so_far() <= 200:
                config = await client.get_config(joined.node_id)
                assert config.node_id == joined.node_id
                reads += 1
        assert flood.returncode is None, "the flood stopped early"
    finally:
        if flood.returncode is None:
            flood.kill()
        await flood.wait()
    refused = refused_so_far()
    assert refused > 200
    assert lock.acquired == 0  # no unauthenticated join took the lock (nor its transaction)
    # a good token still joins (and takes the lock)
    await coord.join("after")
    assert lock.acquired == 1


async def test_oversized_join_body_is_413_before_the_token_is_looked_up(harness_with, monkeypatch):
    coord = await harness_with()
    lookups = []
    real = auth_module.tokens.lookup

    async def spy(*args, **kwargs):
        lookups.append(args)
        return await real(*args, **kwargs)

    monkeypatch.setattr(auth_module.tokens, "lookup", spy)
    token = (await coord.admin.create_join_token()).token
    body = join_body(token, facts={"hostname": "h" * (limits.JOIN_BODY_LIMIT + 1)})
    status, headers, payload = await request(coord, "POST", "/v1/nodes", body=body)
    assert status == 413 and headers["Content-Type"].startswith("application/problem+json")
    problem = json.loads(payload)
    assert problem["limit"] == limits.JOIN_BODY_LIMIT and str(limits.JOIN_BODY_LIMIT) in problem["detail"]
    assert lookups == []
    # the same without Content-Length (chunked): refused once the limit is passed
    async def chunks():
        data = json.dumps(body).encode()
        for i in range(0, len(data), 4096):
            yield data[i:i + 4096]

    status, _, payload = await request(coord, "POST", "/v1/gateways", data=chunks(),
                                       headers={"Content-Type": "application/json"})
    assert status == 413 and json.loads(payload)["limit"] == limits.JOIN_BODY_LIMIT
    assert lookups == []
    # a secret that is no join token at all is refused without a lookup
    status, _, _ = await request(coord, "POST", "/v1/nodes", body=join_body("anexadm_" + "x" * 43))
    assert status == 401 and lookups == []
    status, _, _ = await request(coord, "POST", "/v1/nodes", body=join_body(BAD_TOKEN))
    assert status == 401 and len(lookups) == 1


async def test_join_token_in_the_header_is_checked_before_the_body_is_read(harness_with):
    coord = await harness_with()
    # headers promise a body that never comes: a bad bearer token is refused at once
    head = (f"POST /v1/nodes HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {BAD_TOKEN}\r\n"
            "Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n{").encode()
    started = time.perf_counter()
    answer = await raw_exchange(coord, head, read_timeout=3.0)
    assert answer.startswith(b"HTTP/1.1 401"), answer[:80]
    assert time.perf_counter() - started < 2.0
    # a good header token: the body's token must be the same one
    token = (await coord.admin.create_join_token()).token
    other = (await coord.admin.create_join_token()).token
    status, _, _ = await request(coord, "POST", "/v1/nodes", token=token, body=join_body(other))
    assert status == 401
    status, _, payload = await request(coord, "POST", "/v1/nodes", token=token, body=proven_join_body(coord.ctx, token))
    assert status == 201 and json.loads(payload)["credential"].startswith("anexnc_")
    # another bearer (a client sending its admin token along) is no join token: the body's token counts
    status, _, _ = await request(coord, "POST", "/v1/nodes", token=coord.ctx.admin_token,
                                 body=proven_join_body(coord.ctx, other))
    assert status == 201
    # a gateway join token is no node join token, also on the pre-check
    gw_token = (await coord.admin.create_join_token("gateway")).token
    status, _, _ = await request(coord, "POST", "/v1/nodes", body=join_body(gw_token))
    assert status == 401


# ---------------------------------------------------------------- failed authentications


async def test_repeated_failed_auths_get_429_with_retry_after(harness_with, clock):
    coord = await harness_with(limits=Limits(failed_auth_max=3, failed_auth_window=60))
    client, joined, _ = await coord.join("known")
    await client.get_config(joined.node_id)  # now a credential this process has verified
    for _ in range(3):
        status, _, _ = await request(coord, "GET", "/v1/nodes", token="anexadm_wrong")
        assert status == 401
    status, headers, payload = await request(coord, "GET", "/v1/nodes", token="anexadm_wrong")
    assert status == 429 and headers["Retry-After"] == "60"
    assert json.loads(payload)["type"].endswith("too-many-requests")
    status, _, _ = await request(coord, "POST", "/v1/nodes", body=join_body(BAD_TOKEN))
    assert status == 429  # join tokens too: no lookup for a blocked source
    # a credential already verified here is not blocked (same source address)
    assert (await client.get_config(joined.node_id)).node_id == joined.node_id
    assert (await coord.admin.list_nodes()).nodes
    clock.advance(30)
    status, headers, _ = await request(coord, "GET", "/v1/nodes", token="anexadm_wrong")
    assert status == 429 and headers["Retry-After"] == "30"
    clock.advance(31)  # the window is over
    status, _, _ = await request(coord, "GET", "/v1/nodes", token="anexadm_wrong")
    assert status == 401


def test_source_behind_a_trusted_proxy_is_the_forwarded_client():
    from aiohttp.test_utils import make_mocked_request

    def source(remote: str, forwarded: str | None, trusted: frozenset[str]) -> str:
        headers = {"X-Forwarded-For": forwarded} if forwarded else {}
        request = make_mocked_request("GET", "/", headers=headers)
        request = request.clone(remote=remote)
        return limits.source_of(request, trusted)

    proxy = frozenset({"10.0.0.5"})
    assert source("10.0.0.5", "203.0.113.9", frozenset()) == "10.0.0.5"  # untrusted proxy: the peer
    assert source("198.51.100.1", "203.0.113.9", proxy) == "198.51.100.1"  # not the proxy: header ignored
    assert source("10.0.0.5", "192.0.2.1, 203.0.113.9", proxy) == "203.0.113.9"  # the hop the proxy saw
    assert source("10.0.0.5", "203.0.113.9, 10.0.0.5", proxy) == "203.0.113.9"  # chained trusted proxies
    assert source("10.0.0.5", "not-an-ip", proxy) == "10.0.0.5"
    assert source("10.0.0.5", None, proxy) == "10.0.0.5"


def test_failed_auths_remember_a_bounded_number_of_sources():
    now = [0.0]
    failed = limits.FailedAuths(Limits(failed_auth_max=1, failed_auth_sources=100), lambda: now[0])
    for i in range(1000):
        failed.failed(f"198.51.100.{i}")
    assert len(failed) == 100
    assert failed.retry_after("198.51.100.999") == 60.0
    assert failed.retry_after("198.51.100.0") == 0.0  # forgotten first


# ---------------------------------------------------------------- heartbeat bounds


async def test_oversized_telemetry_is_413_and_too_many_gpus_422(harness_with):
    coord = await harness_with()
    client, joined, _ = await coord.join("big")
    path = f"/v1/nodes/{joined.node_id}/heartbeat"
    big = {"telemetry": {"v": 1, "host": {f"k{i}": "x" * 2000 for i in range(140)}}}
    status, _, payload = await request(coord, "POST", path, token=client.credential, body=big)
    assert status == 413
    assert json.loads(payload)["limit"] == limits.HEARTBEAT_BODY_LIMIT
    gpus = {"telemetry": {"v": 1, "gpus": [{"index": i} for i in range(65)]}}
    status, _, payload = await request(coord, "POST", path, token=client.credential, body=gpus)
    assert status == 422
    problem = json.loads(payload)
    assert problem["errors"][0]["field"] == "telemetry" and "telemetry.gpus" in problem["errors"][0]["message"]
    fine = {"telemetry": {"v": 1, "gpus": [{"index": i} for i in range(64)]}}
    status, _, _ = await request(coord, "POST", path, token=client.credential, body=fine)
    assert status == 200


async def test_a_body_that_does_not_arrive_is_408(harness_with):
    coord = await harness_with(limits=Limits(body_timeout=0.3))
    client, joined, _ = await coord.join("slow")
    head = (f"POST /v1/nodes/{joined.node_id}/heartbeat HTTP/1.1\r\nHost: x\r\n"
            f"Authorization: Bearer {client.credential}\r\nContent-Type: application/json\r\n"
            "Content-Length: 100\r\n\r\n{\"status\"").encode()
    answer = await raw_exchange(coord, head, read_timeout=3.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]


# ---------------------------------------------------------------- connections


async def test_slow_request_head_is_closed_and_excess_requests_get_503(tmp_path, database_url, clock):
    from anex_agent.coordinator.context import Coordinator
    from anex_agent.coordinator.settings import Settings

    settings = Settings.for_tests(tmp_path, database_url, poll_interval=0.2, sweep_interval=3600,
                                  limits=Limits(header_timeout=0.5, max_concurrent=1))
    ctx = await Coordinator.open(settings, clock=clock, environ={})
    runner = limits.make_runner(build_app(ctx), settings.limits)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # the head never ends
        started = time.perf_counter()
        async with asyncio.timeout(5):
            assert await reader.read() == b""  # closed by the server
        assert 0.3 < time.perf_counter() - started < 3
        writer.close()

        async with aiohttp.ClientSession() as session:
            # one request in progress (a watch stream) fills the cap
            token = await _admin_token_join(session, port, ctx)
            async with session.ws_connect(f"http://127.0.0.1:{port}/v1/watch",
                                          headers={"Authorization": f"Bearer {token}"}) as ws:
                await ws.receive()  # the snapshot
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    assert resp.status == 503 and resp.headers["Retry-After"] == "5"
            for _ in range(50):  # the stream is gone: requests are served again
                async with session.get(f"http://127.0.0.1:{port}/healthz") as resp:
                    if resp.status == 200:
                        break
                await asyncio.sleep(0.05)
            assert resp.status == 200
    finally:
        await runner.cleanup()


async def _admin_token_join(session, port, ctx) -> str:
    base = f"http://127.0.0.1:{port}"
    async with session.post(base + "/v1/join-tokens", json={"kind": "node"},
                            headers={"Authorization": f"Bearer {ctx.admin_token}"}) as resp:
        token = (await resp.json())["token"]
    async with session.post(base + "/v1/nodes", json=proven_join_body(ctx, token)) as resp:
        return (await resp.json())["credential"]


# ---------------------------------------------------------------- watch queues


def _config_change(version: int, node_id: str) -> changes.Change:
    return changes.Change(version, changes.Scope.ONE_NODE, node_id, changes.ChangeType.CONFIG, {})


async def test_a_watcher_that_cannot_keep_up_is_closed_with_1012(harness_with):
    coord = await harness_with(limits=Limits(watch_queue=8))
    client, joined, _ = await coord.join("w")
    async with aiohttp.ClientSession() as session:
        async with session.ws_connect(coord.url + "/v1/watch",
                                      headers={"Authorization": f"Bearer {client.credential}"}) as ws:
            snapshot = json.loads((await ws.receive()).data)
            assert snapshot["type"] == "snapshot"
            base = coord.ctx.feed.version + 1000
            for i in range(100):  # faster than anyone can send: the queue overflows
                coord.ctx.feed._deliver(_config_change(base + i, joined.node_id))
            (sub,) = coord.ctx.feed._subscriptions
            assert sub.queue.qsize() <= 8
            async with asyncio.timeout(10):
                while (msg := await ws.receive()).type == aiohttp.WSMsgType.TEXT:
                    pass
            assert msg.type == aiohttp.WSMsgType.CLOSE and ws.close_code == 1012
    for _ in range(100):
        if coord.ctx.feed.watcher_count == 0:
            break
        await asyncio.sleep(0.02)
    assert coord.ctx.feed.watcher_count == 0
    assert coord.ctx.metrics.watch_resyncs._value.get() == 1


async def test_a_watcher_that_never_reads_is_dropped_with_bounded_memory(harness_with):
    coord = await harness_with(limits=Limits(watch_queue=16, watch_send_timeout=0.5))
    _, joined, _ = await coord.join("sleepy")
    credential = joined.credential
    # a raw WebSocket client with a tiny receive buffer that never reads after the handshake
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (coord.server.host, coord.server.port))
    key = "dGhlIHNhbXBsZSBub25jZQ=="
    handshake = (f"GET /v1/watch HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                 f"Sec-WebSocket-Key: {key}\r\nSec-WebSocket-Version: 13\r\n"
                 f"Authorization: Bearer {credential}\r\n\r\n").encode()
    await asyncio.get_running_loop().sock_sendall(sock, handshake)
    head = await asyncio.get_running_loop().sock_recv(sock, 200)
    assert head.startswith(b"HTTP/1.1 101")
    for _ in range(100):
        if coord.ctx.feed.watcher_count:
            break
        await asyncio.sleep(0.01)
    (sub,) = coord.ctx.feed._subscriptions
    largest = 0
    base = coord.ctx.feed.version + 1000
    try:
        for i in range(3000):
            coord.ctx.feed._deliver(changes.Change(base + i, changes.Scope.ALL_NODES, None, changes.ChangeType.GATEWAY_CHANGED, {}))
            largest = max(largest, sub.queue.qsize())
            if i % 20 == 0:
                await asyncio.sleep(0)
            if coord.ctx.feed.watcher_count == 0:
                break
        for _ in range(200):  # closed within send timeout + close timeout
            if coord.ctx.feed.watcher_count == 0:
                break
            await asyncio.sleep(0.05)
        assert coord.ctx.feed.watcher_count == 0
        assert largest <= 16
        assert not coord.ctx.websockets
    finally:
        sock.close()


# ---------------------------------------------------------------- /metrics


async def test_fleet_metrics_need_the_admin_or_metrics_token(harness_with, tmp_path, monkeypatch):
    monkeypatch.setattr(telemetry_metrics, "REFRESH_INTERVAL", 0.05)
    token_file = tmp_path / "metrics-token"
    token_file.write_text("prometheus-scrape-secret-1234\n")
    os.chmod(token_file, 0o600)
    coord = await harness_with(metrics_token_file=token_file)
    client, joined, _ = await coord.join("gpu-host")
    telemetry = {"v": 1, "hostname": "secret-host", "taken_at": time.time(),
                 "gpus": [{"index": 0, "uuid": "GPU-secret", "state": "ok", "gpu_util": 5}],
                 "nvml": {"state": "ok"}, "health": {"verdict": "healthy", "reasons": []}}
    await client.heartbeat(joined.node_id, Heartbeat(telemetry=telemetry))

    async def scrape(token=None) -> tuple[int, str]:
        for _ in range(100):
            status, _, body = await request(coord, "GET", "/metrics", token=token)
            text = body.decode()
            if status != 200 or token is None or "anex_fleet_nodes_with_telemetry 1.0" in text:
                return status, text
            await asyncio.sleep(0.05)
        return status, text

    for token in (coord.ctx.admin_token, "prometheus-scrape-secret-1234"):
        status, text = await scrape(token)
        assert status == 200
        assert "GPU-secret" in text and "secret-host" in text and 'node="gpu-host"' in text
    status, text = await scrape()
    assert status == 200
    assert "anex_coordinator_heartbeats_total 1.0" in text and "process_resident_memory_bytes" in text
    assert "GPU-secret" not in text and "gpu-host" not in text and "anex_fleet" not in text
    status, _ = await scrape("anexadm_not-the-token")
    assert status == 401
    # the metrics token opens /metrics only
    status, _, _ = await request(coord, "GET", "/v1/nodes", token="prometheus-scrape-secret-1234")
    assert status == 401


def test_metrics_token_file_must_be_private_and_long(tmp_path):
    path = tmp_path / "t"
    path.write_text("a-long-enough-metrics-token\n")
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="0600"):
        metrics.load_metrics_token(path, {})
    os.chmod(path, 0o600)
    assert metrics.load_metrics_token(path, {}) == "a-long-enough-metrics-token"
    assert metrics.load_metrics_token(None, {"ANEX_METRICS_TOKEN": "from-the-environment-1"}) == "from-the-environment-1"
    assert metrics.load_metrics_token(None, {}) is None
    with pytest.raises(ConfigError, match="too short"):
        metrics.load_metrics_token(None, {"ANEX_METRICS_TOKEN": "short"})


# ---------------------------------------------------------------- memory: what is read


async def test_list_nodes_does_not_read_telemetry(harness_with, monkeypatch):
    coord = await harness_with()
    client, joined, _ = await coord.join("t")
    await client.heartbeat(joined.node_id, Heartbeat(telemetry={"v": 1, "blob": "y" * 4000}))
    queries = []
    real_fetch = coord.ctx.db.fetch

    async def spy(sql, *args):
        queries.append(sql)
        return await real_fetch(sql, *args)

    monkeypatch.setattr(coord.ctx.db, "fetch", spy)
    listed = await coord.admin.list_nodes()
    assert [n.id for n in listed.nodes] == [joined.node_id]
    node_queries = [q for q in queries if "FROM nodes" in q]
    # no query names the telemetry column or reads every column (COUNT(*) of a background gauge is fine)
    assert node_queries and all("telemetry" not in q and not re.search(r"SELECT\s+\*|\.\*", q) for q in node_queries)


async def test_fleet_refresh_reads_only_nodes_whose_telemetry_changed(harness_with):
    coord = await harness_with()
    clients = [await coord.join(f"n{i}") for i in range(3)]
    for client, joined, _ in clients:
        await client.heartbeat(joined.node_id, Heartbeat(telemetry={"v": 1, "hostname": joined.node_id}))
    await coord.ctx.heartbeats.flush()
    fleet = telemetry_metrics.FleetTelemetry(coord.ctx.db, coord.ctx.clock)
    assert await fleet.refresh() == 3 and fleet.fetched_total == 3
    assert await fleet.refresh() == 3 and fleet.fetched_total == 3  # nothing changed: nothing re-read
    coord.clock.advance(1)
    client, joined, _ = clients[1]
    await client.heartbeat(joined.node_id, Heartbeat(telemetry={"v": 1, "hostname": "renamed"}))
    await coord.ctx.heartbeats.flush()
    assert await fleet.refresh() == 3 and fleet.fetched_total == 4
    assert json.loads(fleet.nodes[joined.node_id][2])["hostname"] == "renamed"
    await coord.admin.delete_node(clients[0][1].node_id)
    assert await fleet.refresh() == 2 and fleet.fetched_total == 4


async def test_refused_join_proofs_reach_the_log_within_a_budget(harness_with, monkeypatch, caplog):
    import logging

    from anex_agent.coordinator import enrollment as registration
    from anex_agent.net.peer_log import LogBudget

    coord = await harness_with()
    monkeypatch.setattr(registration, "_REFUSALS_LOGGED", LogBudget(burst=3, interval=3600.0))
    caplog.set_level(logging.INFO, logger="anex_agent.coordinator.enrollment")
    token = (await coord.admin.create_join_token(reusable=True)).token  # a real token: the proof is checked
    for i in range(8):
        body = proven_join_body(coord.ctx, token, name=f"n{i}")
        body["proof"]["mac"] = "A" * len(body["proof"]["mac"])  # a proof that does not hold
        status, _, _ = await request(coord, "POST", "/v1/nodes", body=body)
        assert status == 401
    lines = [r.getMessage() for r in caplog.records if "refused a node request" in r.getMessage()]
    assert len(lines) == 3  # the other five are counted by the metrics, not logged
