"""The coordinator client's HTTP transport (anex_agent.net.http.client): connection reuse, a
bounded answer, an egress proxy (CONNECT for https://, absolute-form for http://) with
TLS verified against the coordinator's CA, and streamed bodies."""

from __future__ import annotations

import asyncio
import base64
import ssl

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from anex_agent.client.rest import CoordinatorClient
from anex_agent.errors import CoordinatorError
from anex_agent.net.http.client import HttpClient
from tests.polling import GENEROUS
from tests.tls_certs import make_certs

ADMIN = "t" * 20


def coordinator_app(seen: list) -> web.Application:
    async def nodes(request):
        seen.append((request.transport.get_extra_info("peername")[1], request.headers.get("Authorization")))
        return web.json_response({"nodes": []})

    async def big(request):
        return web.Response(body=b"x" * 5000)

    async def slow_stream(request):
        response = web.StreamResponse()
        await response.prepare(request)
        for i in range(3):
            await response.write(f"line {i}\n".encode())
            await asyncio.sleep(0.2)
        await response.write_eof()
        return response

    app = web.Application()
    app.router.add_get("/v1/nodes", nodes)
    app.router.add_get("/big", big)
    app.router.add_get("/stream", slow_stream)
    return app


class Proxy:
    """A minimal HTTP proxy: CONNECT tunnels, and absolute-form requests relayed as they are."""

    def __init__(self) -> None:
        self.requests: list[tuple[str, str | None]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self.handle, "127.0.0.1", 0)
        return f"http://user:pa%3Ass@127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def handle(self, reader, writer):
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        line, *fields = head.split("\r\n")
        method, target, _ = line.split(" ")
        auth = next((f.split(": ", 1)[1] for f in fields if f.lower().startswith("proxy-authorization:")), None)
        self.requests.append((f"{method} {target}", auth))
        if method == "CONNECT":
            host, _, port = target.rpartition(":")
            up_r, up_w = await asyncio.open_connection(host, int(port))
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            rest = target.removeprefix("http://")
            hostport, _, path = rest.partition("/")
            host, _, port = hostport.rpartition(":")
            up_r, up_w = await asyncio.open_connection(host, int(port))
            up_w.write(head.replace(target, "/" + path, 1).encode())

        async def pipe(r, w):
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except OSError:
                pass
            finally:
                w.close()

        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    async def close(self):
        self.server.close()


async def test_calls_reuse_one_kept_alive_connection():
    seen: list = []
    async with TestServer(coordinator_app(seen)) as srv, \
            CoordinatorClient(str(srv.make_url("")), admin_token=ADMIN) as client:
        for _ in range(3):
            assert (await client.list_nodes()).nodes == []
    assert len({port for port, _ in seen}) == 1 and len(seen) == 3
    assert {auth for _, auth in seen} == {f"Bearer {ADMIN}"}


async def test_a_connection_the_server_closed_while_idle_is_replaced():
    connections: list[int] = []
    answered, closed = asyncio.Event(), asyncio.Event()

    async def handle(reader, writer):  # answers one request, keeps the connection until it was read, closes it
        connections.append(1)
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 13\r\n\r\n"
                     b'{"nodes": []}')
        await writer.drain()
        await answered.wait()
        writer.close()
        await writer.wait_closed()
        closed.set()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        async with CoordinatorClient(f"http://127.0.0.1:{port}", admin_token=ADMIN) as client:
            assert (await client.list_nodes()).nodes == []
            answered.set()
            await asyncio.wait_for(closed.wait(), GENEROUS)  # the server closed the idle connection
            assert (await client.list_nodes()).nodes == []
    finally:
        server.close()
    assert len(connections) == 2


async def test_an_answer_larger_than_the_bound_is_refused():
    async with TestServer(coordinator_app([])) as srv:
        client = HttpClient(max_body=4096)
        try:
            status, _, body = await client.request("GET", str(srv.make_url("/v1/nodes")))
            assert status == 200 and body == b'{"nodes": []}'
            with pytest.raises(Exception, match="larger than 4096 bytes"):
                await client.request("GET", str(srv.make_url("/big")))
        finally:
            await client.close()
        async with CoordinatorClient(str(srv.make_url("")), admin_token=ADMIN, max_response_bytes=8) as small:
            with pytest.raises(CoordinatorError) as err:
                await small.list_nodes()
    assert not err.value.retryable and "larger than 8 bytes" in str(err.value)


async def test_a_streamed_body_comes_chunk_by_chunk_and_only_the_head_is_timed():
    async with TestServer(coordinator_app([])) as srv:
        client = HttpClient(timeout=0.1)
        try:
            got, loop = [], asyncio.get_running_loop()
            async with client.stream("GET", str(srv.make_url("/stream")), connect_timeout=GENEROUS) as resp:
                assert resp.status == 200
                async for chunk in resp.chunks():
                    got.append((loop.time(), chunk))
        finally:
            await client.close()
    assert b"".join(c for _, c in got) == b"line 0\nline 1\nline 2\n"
    assert got[-1][0] - got[0][0] >= 0.3  # the body took longer than the whole-call timeout


async def test_https_through_a_connect_proxy_verifies_the_coordinator(tmp_path):
    certs = make_certs(tmp_path)
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_ctx.load_cert_chain(certs.cert, certs.key)
    seen: list = []
    runner = web.AppRunner(coordinator_app(seen))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server_ctx)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    proxy = Proxy()
    proxy_url = await proxy.start()
    try:
        async with CoordinatorClient(f"https://localhost:{port}", admin_token=ADMIN, ca_file=certs.ca,
                                     proxy=proxy_url) as client:
            assert (await client.list_nodes()).nodes == []
            assert (await client.list_nodes()).nodes == []
        async with CoordinatorClient(f"https://localhost:{port}", admin_token=ADMIN, proxy=proxy_url) as client:
            with pytest.raises(CoordinatorError, match="TLS|certificate") as err:  # not signed by a known CA
                await client.list_nodes()
            assert err.value.retryable
        async with CoordinatorClient(f"http://127.0.0.1:{port + 0}", admin_token=ADMIN, proxy=proxy_url) as client:
            with pytest.raises(CoordinatorError):  # plain HTTP to a TLS port through the proxy: no answer
                await client.list_nodes()
    finally:
        await proxy.close()
        await runner.cleanup()
    auth = "Basic " + base64.b64encode(b"user:pa:ss").decode()
    assert proxy.requests[0] == (f"CONNECT localhost:{port}", auth)
    assert sum(1 for r, _ in proxy.requests if r.startswith("CONNECT")) >= 2
    assert len(seen) == 2 and len({p for p, _ in seen}) == 1  # one tunnel, kept alive


async def test_http_through_a_proxy_sends_absolute_form():
    seen: list = []
    proxy = Proxy()
    proxy_url = await proxy.start()
    try:
        async with TestServer(coordinator_app(seen)) as srv, \
                CoordinatorClient(str(srv.make_url("")), admin_token=ADMIN, proxy=proxy_url) as client:
            assert (await client.list_nodes()).nodes == []
            port = srv.port
    finally:
        await proxy.close()
    assert proxy.requests[0][0] == f"GET http://127.0.0.1:{port}/v1/nodes"
    assert proxy.requests[0][1].startswith("Basic ")
