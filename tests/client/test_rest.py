"""The coordinator client: error classification, response parsing, watch reconnect and resume.

The coordinator itself is exercised through this client in tests/coordinator/; here a
small aiohttp server plays a misbehaving or restarting coordinator.
"""

from __future__ import annotations

import asyncio
import json
import socket

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anex_agent.wire.heartbeat import Heartbeat
from anex_agent.wire.watch import WatchEvent
from anex_agent.client.rest import CoordinatorClient
from anex_agent.errors import CoordinatorError

PEER = {"node_id": "n-1", "name": "a", "public_key": "A" * 43 + "=", "allowed_ips": ["10.254.0.2/32"]}


def problem(status: int, detail: str) -> web.Response:
    return web.Response(status=status, content_type="application/problem+json",
                        text=json.dumps({"title": "x", "status": status, "detail": detail}))


@pytest.fixture
async def server():
    state = {"watch_calls": [], "seen_auth": []}

    async def status(request):
        code = int(request.match_info["code"])
        return problem(code, f"status {code}")

    async def garbage(request):
        return web.json_response({"unexpected": True})

    async def slow(request):
        await asyncio.sleep(5)
        return web.json_response({})

    async def watch(request):
        state["watch_calls"].append(int(request.query["since"]))
        state["seen_auth"].append(request.headers.get("Authorization"))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        n = len(state["watch_calls"])
        if n == 1:
            await ws.send_str(json.dumps({"type": "snapshot", "version": 5, "peers": [PEER]}))
            await ws.close()  # the coordinator restarts
        elif n == 2:
            await ws.send_str(json.dumps({"type": "peer_removed", "version": 6, "peer": PEER}))
            await ws.close(code=4001, message=b"credential revoked")
        return ws

    async def nginx(request):  # another service at the coordinator's URL
        code = int(request.match_info["code"])
        return web.Response(status=code, content_type="text/html",
                            text="<html><head><title>404 Not Found</title></head><body><center><h1>404 Not Found"
                                 "</h1></center><hr><center>nginx/1.22.1</center></body></html>\n")

    async def bare_html(request):  # no Content-Type worth the name, a page all the same
        return web.Response(status=200, body=b"  <!DOCTYPE html>\n<html><body>Welcome</body></html>",
                            content_type="application/octet-stream")

    app = web.Application()
    app.router.add_get("/v1/nodes/{node}/config", garbage)
    app.router.add_get("/v1/gateways/{code}/peers", status)
    app.router.add_get("/v1/nodes/{code}/ssh-revocations", nginx)
    app.router.add_get("/v1/coordinator", bare_html)
    app.router.add_post("/v1/nodes/{node}/heartbeat", slow)
    app.router.add_get("/v1/watch", watch)
    srv = TestServer(app)
    await srv.start_server()
    srv.state = state
    yield srv
    await srv.close()


@pytest.mark.parametrize("code, retryable", [(400, False), (401, False), (403, False), (404, False),
                                             (429, True), (500, True), (503, True)])
async def test_http_errors_are_classified(server, code, retryable):
    async with CoordinatorClient(str(server.make_url("")), credential="anexgc_x") as client:
        with pytest.raises(CoordinatorError) as err:
            await client.get_peers(str(code))
    assert err.value.status == code
    assert err.value.retryable is retryable
    assert err.value.problem["detail"] == f"status {code}"


@pytest.mark.parametrize("code, retryable", [(404, False), (502, True)])
async def test_an_html_answer_says_the_url_may_be_wrong_without_the_page(server, code, retryable):
    base = str(server.make_url("")).rstrip("/")
    async with CoordinatorClient(base, credential="anexnc_x") as client:
        with pytest.raises(CoordinatorError) as err:
            await client.ssh_revocations(str(code))
    text = str(err.value)
    assert text == (f"URL {base} answered {code} with HTML to GET /v1/nodes/{code}/ssh-revocations: "
                    "is it the coordinator's URL?")
    assert err.value.status == code and err.value.retryable is retryable


async def test_an_html_page_with_status_200_is_no_coordinator_either(server):
    base = str(server.make_url("")).rstrip("/")
    async with CoordinatorClient(base) as client:
        with pytest.raises(CoordinatorError) as err:
            await client.coordinator_info()
    assert "answered 200 with HTML" in str(err.value) and "<" not in str(err.value)


async def test_unexpected_response_is_not_retryable(server):
    async with CoordinatorClient(str(server.make_url("")), credential="anexnc_x") as client:
        with pytest.raises(CoordinatorError) as err:
            await client.get_config("n-1")
    assert err.value.status == 200 and not err.value.retryable and "unexpected response" in str(err.value)


async def test_timeout_and_refused_connection_are_retryable(server):
    async with CoordinatorClient(str(server.make_url("")), credential="anexnc_x", timeout=0.3) as client:
        with pytest.raises(CoordinatorError) as err:
            await client.heartbeat("n-1", Heartbeat())
    assert err.value.retryable and err.value.status is None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens here
    async with CoordinatorClient(f"http://127.0.0.1:{port}", admin_token="t" * 20) as client:
        with pytest.raises(CoordinatorError) as err:
            await client.list_nodes()
    assert err.value.retryable and err.value.status is None


async def test_calls_without_the_needed_secret_fail_before_sending():
    async with CoordinatorClient("http://127.0.0.1:9") as client:
        with pytest.raises(CoordinatorError, match="no admin"):
            await client.list_nodes()


async def test_watch_reconnects_resumes_and_stops_on_revocation(server, monkeypatch):
    monkeypatch.setattr("anex_agent.client.rest.WATCH_BACKOFF_INITIAL", 0.05)
    async with CoordinatorClient(str(server.make_url("")), credential="anexgc_secret") as client:
        stream = client.watch(0)
        first = await asyncio.wait_for(anext(stream), 5)
        second = await asyncio.wait_for(anext(stream), 5)
        assert (first.type, first.version) == ("snapshot", 5)
        assert (second.type, second.version, second.peer.node_id) == ("peer_removed", 6, "n-1")
        with pytest.raises(CoordinatorError) as err:
            await asyncio.wait_for(anext(stream), 5)
    assert err.value.status == 401 and not err.value.retryable
    assert server.state["watch_calls"] == [0, 5]  # resumed from the last version it yielded
    assert set(server.state["seen_auth"]) == {"Bearer anexgc_secret"}


async def test_watch_backoff_starts_over_after_a_stream_that_was_up(monkeypatch):
    """Failed connects back off exponentially; a drop after a good connect retries at once.

    Otherwise a gateway whose coordinator was down for a while would stay blind for the
    whole grown delay after the coordinator came back and dropped it once more.
    """
    monkeypatch.setattr("anex_agent.client.rest.WATCH_BACKOFF_INITIAL", 0.05)
    calls: list[float] = []
    loop = asyncio.get_running_loop()

    async def watch(request):
        calls.append(loop.time())
        if len(calls) <= 4:
            return problem(503, "starting")
        if len(calls) == 5:  # up, then dropped without any event
            ws = web.WebSocketResponse()
            await ws.prepare(request)
            await ws.close()
            return ws
        return problem(401, "revoked")

    app = web.Application()
    app.router.add_get("/v1/watch", watch)
    async with TestServer(app) as srv, CoordinatorClient(str(srv.make_url("")), credential="anexnc_x") as client:
        with pytest.raises(CoordinatorError) as err:
            async for _ in client.watch(0):
                pass
    assert err.value.status == 401
    gaps = [b - a for a, b in zip(calls, calls[1:])]
    assert gaps[3] >= 0.2  # fourth failed connect: the delay had grown to 0.2-0.4 s
    assert gaps[4] < 0.2  # after the stream that was up: back to 0.025-0.05 s


async def test_watch_resumes_from_a_snapshot_even_when_it_is_older(monkeypatch):
    """A coordinator whose change log starts over (database restored or recreated) answers a
    too-new ``since`` with a snapshot at its own, lower version: the client must resume from
    that snapshot, or it would skip every change up to the version it had before."""
    monkeypatch.setattr("anex_agent.client.rest.WATCH_BACKOFF_INITIAL", 0.05)
    calls: list[int] = []

    async def watch(request):
        calls.append(int(request.query["since"]))
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        if len(calls) == 1:
            await ws.send_str(json.dumps({"type": "snapshot", "version": 3, "peers": [PEER]}))
        else:
            await ws.send_str(json.dumps({"type": "peer_removed", "version": 4, "peer": PEER}))
        await ws.close()
        return ws

    app = web.Application()
    app.router.add_get("/v1/watch", watch)
    srv = TestServer(app)
    await srv.start_server()
    try:
        async with CoordinatorClient(str(srv.make_url("")), credential="anexgc_secret") as client:
            stream = client.watch(since=900)
            first = await asyncio.wait_for(anext(stream), 5)
            second = await asyncio.wait_for(anext(stream), 5)
            await stream.aclose()
    finally:
        await srv.close()
    assert (first.type, first.version, second.version) == ("snapshot", 3, 4)
    assert calls == [900, 3]


async def test_watch_losing_the_connection_while_receiving_is_retryable(monkeypatch):
    """The connection is lost while the watch receives (a reset, or closed without a close frame),
    and closing it fails too: the watch reconnects instead of the error ending the gateway or
    agent that follows it."""
    import websockets.asyncio.client
    from websockets.exceptions import ConnectionClosedError

    class BrokenWs:
        close_code = None

        def __init__(self, error):
            self.error = error

        def __aiter__(self):
            return self

        async def __anext__(self):
            raise self.error

        async def close(self):
            raise ConnectionResetError("Cannot write to closing transport")

    for error in (ConnectionResetError("reset by peer"), ConnectionClosedError(None, None)):
        async def connect(*args, error=error, **kwargs):
            return BrokenWs(error)

        monkeypatch.setattr(websockets.asyncio.client, "connect", connect)
        client = CoordinatorClient("http://127.0.0.1:9", credential="c")
        stream = client._watch_once("/v1/watch?since=0", WatchEvent, "credential", [])
        if isinstance(error, OSError):
            with pytest.raises(CoordinatorError) as info:
                await stream.__anext__()
            assert info.value.retryable and "connection lost" in str(info.value)
        else:  # closed without a close frame: the stream ends, and watch() reconnects
            with pytest.raises(StopAsyncIteration):
                await stream.__anext__()
