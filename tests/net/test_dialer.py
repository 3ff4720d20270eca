"""OSDialer against real loopback servers: connect, refused, timeout, unresolvable; both Connection kinds."""

from __future__ import annotations

import asyncio
import socket

import pytest

from anex_agent.net.dialer import Dialer, OSDialer, SocketConnection, StreamConnection
from anex_agent.errors import DialError, DialRefused, DialTimeout, ResolveError
from anex_agent.net.resolver import Resolver
from frontends.servers import echo_server, free_port, tiny_dns


async def _roundtrip(conn) -> bytes:
    await conn.sendall(b"hello")
    await conn.shutdown_write()
    await conn.shutdown_write()  # twice is harmless
    buf = bytearray(100)
    got = b""
    while n := await conn.recv_into(buf):
        got += bytes(buf[:n])
    return got


async def test_os_dialer_is_a_dialer_and_connects_by_ip_with_a_raw_socket():
    dialer = OSDialer()
    assert isinstance(dialer, Dialer)
    async with echo_server() as (port, events):
        conn = await dialer.open_connection("127.0.0.1", port)
        try:
            assert isinstance(conn, SocketConnection)
            assert isinstance(conn.socket, socket.socket)
            assert conn.socket.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
            assert await _roundtrip(conn) == b"hello"
            assert events == ["eof"]  # our half-close reached the server
        finally:
            await conn.aclose()
            await conn.aclose()


async def test_os_dialer_resolves_cluster_names_through_the_resolver():
    async with echo_server() as (port, _), tiny_dns({"echo.default.svc.cluster.local": ["127.0.0.1"]}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"]))
        conn = await dialer.open_connection("echo.default.svc.cluster.local", port)
        try:
            assert await _roundtrip(conn) == b"hello"
        finally:
            await conn.aclose()


async def test_refused_names_the_destination():
    port = free_port()
    with pytest.raises(DialRefused) as info:
        await OSDialer().open_connection("127.0.0.1", port)
    assert info.value.host == "127.0.0.1" and info.value.port == port
    assert "refused" in info.value.reason


async def test_unresolvable_name_raises_resolve_error_with_port():
    async with tiny_dns({}) as dns:
        dialer = OSDialer(Resolver([f"127.0.0.1:{dns.port}"]))
        with pytest.raises(ResolveError) as info:
            await dialer.open_connection("nosuch.default.svc.cluster.local", 80)
    assert isinstance(info.value, DialError)
    assert info.value.port == 80
    assert "nosuch.default.svc.cluster.local:80" in str(info.value)


async def test_timeout_when_the_destination_never_accepts():
    # a listener with a full accept queue drops further SYNs: connect() hangs until our timeout
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(4):
            s = socket.socket()
            s.setblocking(False)
            try:
                s.connect(("127.0.0.1", port))
            except BlockingIOError:
                pass
            fillers.append(s)
        await asyncio.sleep(0.2)
        with pytest.raises(DialTimeout) as info:
            await OSDialer(connect_timeout=0.5).open_connection("127.0.0.1", port)
        assert "0.5 s" in info.value.reason
    finally:
        for s in fillers:
            s.close()
        listener.close()


async def test_bad_port_is_a_dial_error():
    with pytest.raises(DialError):
        await OSDialer().open_connection("127.0.0.1", 0)


async def test_stream_connection_has_no_socket_and_half_closes():
    async with echo_server() as (port, events):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = StreamConnection(reader, writer)
        try:
            assert conn.socket is None
            assert await _roundtrip(conn) == b"hello"
            assert events == ["eof"]
        finally:
            await conn.aclose()


class _Held:
    """An inner dialer whose attempts wait until released (a SYN lost to a dead gateway), counted."""

    def __init__(self, outcome) -> None:
        self.started: list[asyncio.Event] = []
        self.first = asyncio.Event()
        self.cancelled = 0
        self.outcome = outcome  # what an attempt after the first gives (a connection, or a DialError raised)

    async def open_connection(self, host: str, port: int):
        started = asyncio.Event()
        self.started.append(started)
        started.set()
        self.first.set()
        if len(self.started) == 1:
            try:
                await asyncio.Event().wait()  # never answered
            except asyncio.CancelledError:
                self.cancelled += 1
                raise
        if isinstance(self.outcome, Exception):
            raise self.outcome
        return self.outcome


async def test_a_dial_in_flight_starts_again_when_the_routes_move():
    from anex_agent.net.dialer import RedialDialer, RouteChanges

    changes, conn = RouteChanges(), object()
    inner = _Held(conn)
    dialer = RedialDialer(inner, changes)
    assert isinstance(dialer, Dialer)
    dial = asyncio.create_task(dialer.open_connection("echo.default.svc", 80))
    await asyncio.wait_for(inner.first.wait(), 10)  # the first attempt is under way
    assert not dial.done()
    changes.moved()  # the node moved its routes to a gateway that answers
    assert await asyncio.wait_for(dial, 10) is conn
    assert len(inner.started) == 2 and inner.cancelled == 1


async def test_a_dial_error_after_a_move_is_the_inner_dialer_s():
    from anex_agent.net.dialer import RedialDialer, RouteChanges

    changes = RouteChanges()
    inner = _Held(DialRefused("echo", 80, "connection refused"))
    dial = asyncio.create_task(RedialDialer(inner, changes).open_connection("echo", 80))
    await asyncio.wait_for(inner.first.wait(), 10)
    changes.moved()
    with pytest.raises(DialRefused):
        await asyncio.wait_for(dial, 10)
