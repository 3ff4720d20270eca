"""The HTTP proxy against real origins (aiohttp) with real clients (aiohttp, raw sockets with h11)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import os
import shutil

import aiohttp
import h11
import pytest

from anex_agent.net.dialer import OSDialer
from anex_agent.errors import PortInUseError
from anex_agent.frontends.proxy import ProxyServer
from anex_agent.frontends.proxy_core import ProxyAuth
from anex_agent.net.resolver import Resolver

from tests.polling import wait_until

from .servers import PEERS, echo_server, free_port, loads, non_loopback_ipv4, pattern, run_origin, tiny_dns

CLUSTER_NAME = "web.default.svc.cluster.local"


@contextlib.asynccontextmanager
async def proxy_env(auth: ProxyAuth | None = None):
    """A proxy on a random loopback port whose dialer resolves CLUSTER_NAME via a real DNS server."""
    async with tiny_dns({CLUSTER_NAME: ["127.0.0.1"]}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"], timeout=2.0))
        async with ProxyServer(dialer, host="127.0.0.1", port=0, auth=auth) as proxy:
            yield f"http://127.0.0.1:{proxy.address[1]}", proxy.address[1]


class RawClient:
    """One client connection to the proxy, speaking HTTP/1.1 through h11."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer
        self.h11 = h11.Connection(h11.CLIENT)

    @classmethod
    async def open(cls, port: int) -> RawClient:
        return cls(*await asyncio.open_connection("127.0.0.1", port))

    async def request(self, method: str, target: str, headers=(), body: bytes = b"") -> tuple[h11.Response, bytes]:
        if self.h11.our_state is h11.DONE:
            self.h11.start_next_cycle()
        hdrs = [("Host", "ignored.example")] + list(headers)
        if body:
            hdrs.append(("Content-Length", str(len(body))))
        self.writer.write(self.h11.send(h11.Request(method=method, target=target, headers=hdrs)))
        if body:
            self.writer.write(self.h11.send(h11.Data(data=body)))
        self.writer.write(self.h11.send(h11.EndOfMessage()))
        await self.writer.drain()
        response, data = None, b""
        while True:
            event = self.h11.next_event()
            if event is h11.NEED_DATA:
                self.h11.receive_data(await self.reader.read(65536))
            elif isinstance(event, h11.Response):
                response = event
            elif isinstance(event, h11.Data):
                data += event.data
            elif isinstance(event, h11.EndOfMessage):
                return response, data
            else:
                raise AssertionError(f"unexpected {event!r}")

    async def close(self) -> None:
        self.writer.close()
        with contextlib.suppress(OSError):
            await self.writer.wait_closed()


async def test_get_by_cluster_name_goes_through_with_rewritten_headers():
    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.get(
                f"http://{CLUSTER_NAME}:{port}/info?x=1",
                proxy=proxy_url,
                headers={"Connection": "keep-alive, X-Hop", "X-Hop": "secret", "X-End": "kept"},
            ) as response:
                assert response.status == 200
                assert response.headers["Via"] == "1.1 anex-agent"
                info = await response.json()
    assert info["method"] == "GET"
    assert info["path_qs"] == "/info?x=1"
    assert info["host"] == f"{CLUSTER_NAME}:{port}"  # Host comes from the absolute URL
    assert info["via"] == "1.1 anex-agent"
    assert "x-hop" not in info["headers"]  # named in Connection: hop-by-hop
    assert info["headers"]["x-end"] == "kept"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"])
async def test_every_method_is_forwarded(method):
    async with run_origin("a") as (port, _), proxy_env() as (_, proxy_port):
        client = await RawClient.open(proxy_port)
        try:
            body = b"payload" if method in ("POST", "PUT", "PATCH") else b""
            response, data = await client.request(method, f"http://127.0.0.1:{port}/info/m", body=body)
        finally:
            await client.close()
    assert response.status_code == 200
    info = loads(data)
    assert info["method"] == method and info["path_qs"] == "/info/m" and info["body_len"] == len(body)


async def test_head_gets_headers_and_no_body():
    async with run_origin("a") as (port, _), proxy_env() as (_, proxy_port):
        client = await RawClient.open(proxy_port)
        try:
            response, data = await client.request("HEAD", f"http://127.0.0.1:{port}/info")
            # the connection stays usable: h11 on both sides knew there was no body
            again, data2 = await client.request("GET", f"http://127.0.0.1:{port}/info")
        finally:
            await client.close()
    assert response.status_code == 200 and data == b""
    assert int(dict(response.headers)[b"content-length"]) > 0
    assert again.status_code == 200 and loads(data2)["method"] == "GET"


async def test_large_upload_with_content_length_is_streamed_intact():
    body = os.urandom(8 * 1024 * 1024)
    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.post(f"http://127.0.0.1:{port}/upload", data=body, proxy=proxy_url) as response:
                result = await response.json()
    assert result == {"len": len(body), "sha256": hashlib.sha256(body).hexdigest(), "chunked": False}


async def test_large_chunked_upload_stays_chunked_and_intact():
    parts = [os.urandom(300_000) for _ in range(20)]

    async def gen():
        for part in parts:
            yield part

    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.put(f"http://127.0.0.1:{port}/upload", data=gen(), proxy=proxy_url) as response:
                result = await response.json()
    whole = b"".join(parts)
    assert result == {"len": len(whole), "sha256": hashlib.sha256(whole).hexdigest(), "chunked": True}


async def test_expect_100_continue_is_answered_and_the_body_arrives():
    body = os.urandom(200_000)
    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.post(
                f"http://127.0.0.1:{port}/upload", data=body, proxy=proxy_url, expect100=True
            ) as response:
                result = await response.json()
    assert result["len"] == len(body) and result["sha256"] == hashlib.sha256(body).hexdigest()


async def test_large_chunked_download_is_streamed_intact():
    n = 6 * 1024 * 1024 + 123
    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/download?n={n}", proxy=proxy_url) as response:
                assert response.headers.get("Transfer-Encoding") == "chunked"
                data = await response.read()
    assert data == pattern(n)


async def test_keep_alive_across_two_origins_reuses_origin_connections():
    async with run_origin("a") as (port_a, app_a), run_origin("b") as (port_b, app_b), proxy_env() as (_, proxy_port):
        client = await RawClient.open(proxy_port)
        try:
            seen = []
            for port in (port_a, port_b, port_a, port_b):
                response, data = await client.request("GET", f"http://127.0.0.1:{port}/info")
                assert response.status_code == 200
                seen.append(loads(data)["origin"])
        finally:
            await client.close()
    assert seen == ["a", "b", "a", "b"]
    # each origin saw both of its requests on one connection (same client port)
    assert len(app_a[PEERS]) == 2 and app_a[PEERS][0] == app_a[PEERS][1]
    assert len(app_b[PEERS]) == 2 and app_b[PEERS][0] == app_b[PEERS][1]


@contextlib.asynccontextmanager
async def one_shot_origin():
    """An origin that answers one request per connection, claims keep-alive, then closes.

    Yields (port, connections, closed) where connections counts accepted connections and
    closed the ones the origin has closed.
    """
    connections, closed = [], []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(writer.get_extra_info("peername"))
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
        await writer.drain()
        writer.close()  # an idle keep-alive connection the origin drops
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        closed.append(writer.get_extra_info("peername"))

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1], connections, closed
    finally:
        server.close()


async def test_stale_reused_origin_connection_is_retried_for_bodyless_requests():
    async with one_shot_origin() as (port, connections, closed), proxy_env() as (_, proxy_port):
        client = await RawClient.open(proxy_port)
        try:
            first, data1 = await client.request("GET", f"http://127.0.0.1:{port}/one")
            await wait_until(lambda: closed, what="the origin closing the idle proxy connection")
            second, data2 = await client.request("GET", f"http://127.0.0.1:{port}/two")
        finally:
            await client.close()
    assert (first.status_code, data1) == (200, b"ok")
    assert (second.status_code, data2) == (200, b"ok")
    assert len(connections) == 2  # the stale connection was replaced by a fresh one


async def test_stale_reused_origin_connection_is_not_retried_for_a_post():
    """RFC 9110 §9.2.2: a proxy MUST NOT retry a non-idempotent request by itself (the origin may
    have acted on it): the client gets a 502 and decides."""
    async with one_shot_origin() as (port, connections, closed), proxy_env() as (_, proxy_port):
        client = await RawClient.open(proxy_port)
        try:
            first, _ = await client.request("GET", f"http://127.0.0.1:{port}/one")
            await wait_until(lambda: closed, what="the origin closing the idle proxy connection")
            second, text = await client.request("POST", f"http://127.0.0.1:{port}/two", [("Content-Length", "0")])
        finally:
            await client.close()
    assert first.status_code == 200
    assert second.status_code == 502 and f"127.0.0.1:{port}".encode() in text
    assert len(connections) == 1  # not sent again on a fresh connection


async def test_connect_tunnel_moves_bytes_both_ways_with_half_close():
    sent = os.urandom(3 * 1024 * 1024)
    async with echo_server() as (port, events), proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        # the first tunnel bytes ride in the same packet as the CONNECT head
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n".encode() + sent[:1000])
        head = await reader.readuntil(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 ")
        assert b"content-length" not in head.lower() and b"transfer-encoding" not in head.lower()

        async def send_rest():
            writer.write(sent[1000:])
            await writer.drain()
            writer.write_eof()  # half-close: we still read the echo

        sender = asyncio.create_task(send_rest())
        received = await reader.read()  # until the echo server's FIN comes back through the tunnel
        await sender
        writer.close()
    assert hashlib.sha256(received).digest() == hashlib.sha256(sent).digest()
    assert events == ["eof"]


async def test_connect_to_refused_port_is_502_naming_it():
    port = free_port()
    async with proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        response = await reader.read()
        writer.close()
    assert response.startswith(b"HTTP/1.1 502 Bad Gateway\r\n")
    assert f"cannot reach 127.0.0.1:{port}: connection refused".encode() in response


async def test_unresolvable_host_is_502_naming_the_host():
    async with proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.get("http://nosuch.default.svc.cluster.local/x", proxy=proxy_url) as response:
                text = await response.text()
                status = response.status
    assert status == 502
    assert "cannot reach nosuch.default.svc.cluster.local:80" in text
    assert "does not resolve" in text


async def test_refused_origin_is_502():
    port = free_port()
    async with proxy_env() as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/", proxy=proxy_url) as response:
                text = await response.text()
                status = response.status
    assert status == 502 and f"127.0.0.1:{port}" in text and "refused" in text


@pytest.mark.parametrize(
    "raw, words",
    [
        (b"garbage\r\n\r\n", b"malformed"),
        (b"GET /index.html HTTP/1.1\r\nHost: x\r\n\r\n", b"absolute URL"),
        (b"GET https://example.com/ HTTP/1.1\r\nHost: x\r\n\r\n", b"CONNECT"),
    ],
)
async def test_bad_requests_get_400_with_a_reason(raw, words):
    async with proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(raw)
        response = await reader.read()  # the proxy closes after an error
        writer.close()
    assert response.startswith(b"HTTP/1.1 400 Bad Request\r\n")
    assert words in response


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


async def test_auth_required_gives_407_and_accepts_basic_credentials():
    auth = ProxyAuth("alice", "s3cret")
    async with run_origin("a") as (port, _), proxy_env(auth=auth) as (proxy_url, _):
        async with aiohttp.ClientSession() as session:
            async with session.get(f"http://127.0.0.1:{port}/info", proxy=proxy_url) as response:
                assert response.status == 407
                assert response.headers["Proxy-Authenticate"].startswith("Basic ")
            async with session.get(
                f"http://127.0.0.1:{port}/info", proxy=proxy_url, headers={"Proxy-Authorization": _basic("alice", "wrong")}
            ) as response:
                assert response.status == 407
            async with session.get(
                f"http://127.0.0.1:{port}/info", proxy=proxy_url, headers={"Proxy-Authorization": _basic("alice", "s3cret")}
            ) as response:
                assert response.status == 200
                info = await response.json()
    assert "proxy-authorization" not in info["headers"]  # consumed by the proxy, never forwarded


async def test_port_in_use_is_reported_naming_the_setting():
    async with proxy_env() as (_, proxy_port):
        with pytest.raises(PortInUseError) as info:
            async with ProxyServer(OSDialer(), host="127.0.0.1", port=proxy_port):
                pass
    assert "ANEX_PROXY_LISTEN" in str(info.value) and str(proxy_port) in str(info.value)


async def test_binding_beyond_loopback_without_auth_warns(caplog):
    caplog.set_level(logging.WARNING, logger="anex_agent.frontends.proxy")
    async with ProxyServer(OSDialer(), host="0.0.0.0", port=0):
        pass
    assert any("WITHOUT authentication" in r.message for r in caplog.records)
    caplog.clear()
    async with ProxyServer(OSDialer(), host="127.0.0.1", port=0):
        pass
    assert not caplog.records


async def test_connect_needs_credentials_when_auth_is_configured():
    auth = ProxyAuth("alice", "s3cret")
    async with echo_server() as (port, _), proxy_env(auth=auth) as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        denied = await reader.read()
        writer.close()
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(
            f"CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: x\r\nProxy-Authorization: {_basic('alice', 's3cret')}\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        writer.write(b"ping")
        writer.write_eof()
        echoed = await reader.read()
        writer.close()
    assert denied.startswith(b"HTTP/1.1 407 Proxy Authentication Required\r\n")
    assert b"Proxy-Authenticate: Basic" in denied
    assert head.startswith(b"HTTP/1.1 200 ")
    assert echoed == b"ping"


@contextlib.asynccontextmanager
async def raw_origin(respond):
    """An origin whose handler gets the raw (reader, writer) after the request head was read."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            await respond(head, reader, writer)
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()


async def test_early_response_during_a_streamed_upload_reaches_the_client():
    async def refuse(head, reader, writer):
        # answers before reading the body (like a 413), then drains politely
        writer.write(b"HTTP/1.1 413 Content Too Large\r\nContent-Length: 8\r\n\r\ntoo big!")
        await writer.drain()
        writer.write_eof()
        while await reader.read(1 << 16):
            pass

    async with raw_origin(refuse) as port, proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        total = 64 * 1024 * 1024  # far more than the socket buffers hold
        writer.write(
            f"POST http://127.0.0.1:{port}/up HTTP/1.1\r\nHost: x\r\nContent-Length: {total}\r\n\r\n".encode()
        )
        writer.write(b"\0" * (1024 * 1024))  # only part of the promised body
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=10)
        body = await asyncio.wait_for(reader.readexactly(8), timeout=10)
        rest = await asyncio.wait_for(reader.read(), timeout=10)  # the proxy closes: body unfinished
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 ")
    assert body == b"too big!" and rest == b""


async def test_response_trailers_pass_through_between_chunked_ends():
    async def with_trailer(head, reader, writer):
        writer.write(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Checksum\r\n\r\n"
            b"5\r\nhello\r\n0\r\nX-Checksum: abc123\r\n\r\n"
        )
        await writer.drain()

    async with raw_origin(with_trailer) as port, proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        conn = h11.Connection(h11.CLIENT)
        writer.write(conn.send(h11.Request(method="GET", target=f"http://127.0.0.1:{port}/t", headers=[("Host", "x")])))
        writer.write(conn.send(h11.EndOfMessage()))
        events = []
        while not events or not isinstance(events[-1], h11.EndOfMessage):
            event = conn.next_event()
            if event is h11.NEED_DATA:
                conn.receive_data(await reader.read(65536))
            else:
                events.append(event)
        writer.close()
    body = b"".join(e.data for e in events if isinstance(e, h11.Data))
    assert body == b"hello"
    assert (b"x-checksum", b"abc123") in list(events[-1].headers)


async def test_pipelined_requests_are_answered_in_order():
    async with run_origin("a") as (port_a, _), run_origin("b") as (port_b, _), proxy_env() as (_, proxy_port):
        reader, writer = await asyncio.open_connection("127.0.0.1", proxy_port)
        writer.write(
            f"GET http://127.0.0.1:{port_a}/info/1 HTTP/1.1\r\nHost: x\r\n\r\n"
            f"GET http://127.0.0.1:{port_b}/info/2 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
        )
        raw = await asyncio.wait_for(reader.read(), timeout=10)  # the second asked to close
        writer.close()
    conn = h11.Connection(h11.CLIENT)
    conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
    conn.send(h11.EndOfMessage())
    conn.receive_data(raw)
    bodies = []
    for _ in range(2):
        data = b""
        while not isinstance(event := conn.next_event(), h11.EndOfMessage):
            if isinstance(event, h11.Data):
                data += event.data
        bodies.append(loads(data))
        if conn.our_state is h11.DONE and conn.their_state is h11.DONE:
            conn.start_next_cycle()
            conn.send(h11.Request(method="GET", target="/", headers=[("Host", "x")]))
            conn.send(h11.EndOfMessage())
    assert [(b["origin"], b["path_qs"]) for b in bodies] == [("a", "/info/1"), ("b", "/info/2")]


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")
async def test_curl_get_post_and_connect_through_the_proxy():
    body = os.urandom(100_000).hex().encode()
    async with run_origin("a") as (port, _), proxy_env() as (proxy_url, _):

        async def curl(*args: str, data: bytes | None = None) -> bytes:
            proc = await asyncio.create_subprocess_exec(
                "curl", "-sS", "--max-time", "20", "-x", proxy_url, *args,
                stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            )
            out, err = await proc.communicate(data)
            assert proc.returncode == 0, err.decode()
            return out

        got = loads(await curl(f"http://{CLUSTER_NAME}:{port}/info?curl=1"))
        assert (got["method"], got["host"]) == ("GET", f"{CLUSTER_NAME}:{port}")
        posted = loads(await curl("--data-binary", "@-", f"http://127.0.0.1:{port}/upload", data=body))
        assert posted["sha256"] == hashlib.sha256(body).hexdigest()
        tunneled = loads(await curl("-p", f"http://127.0.0.1:{port}/info"))  # -p: CONNECT, then plain HTTP inside
        assert tunneled["via"] is None  # the proxy did not see inside the tunnel


async def test_clients_from_beyond_loopback_cannot_reach_loopback_services():
    address = non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    async with run_origin("a") as (port, app):
        async with ProxyServer(OSDialer(), host=address, port=0, auth=None) as proxy:
            reader, writer = await asyncio.open_connection(address, proxy.address[1])  # source = address
            writer.write(f"GET http://127.0.0.1:{port}/info HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            response = await asyncio.wait_for(reader.read(), timeout=10)
            writer.close()
    assert response.startswith(b"HTTP/1.1 403 Forbidden\r\n")
    assert b"only local clients" in response
    assert app[PEERS] == []  # the origin never saw a request
