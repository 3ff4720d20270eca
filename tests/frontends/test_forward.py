"""GW_TUNNEL forwards: ForwardManager against real loopback servers; relay on both copy paths."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket

import pytest

from anex_agent.net.dialer import OSDialer, SocketConnection, StreamConnection
from anex_agent.errors import ConfigError, PortInUseError
from anex_agent.frontends import relay as relay_mod
from anex_agent.frontends.forward import ForwardManager, running_forwards
from anex_agent.wire.nodes import TunnelSpec

from .servers import echo_server, free_port


async def _echo_through(port: int, payload: bytes) -> bytes:
    """Send ``payload`` to 127.0.0.1:port while reading the echo; half-close; return what came back."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)

    async def send() -> None:
        for i in range(0, len(payload), 1 << 18):
            writer.write(payload[i : i + (1 << 18)])
            await writer.drain()
        writer.write_eof()

    sender = asyncio.create_task(send())
    received = await reader.read()  # until EOF: the server's FIN came back through the forward
    await sender
    writer.close()
    return received


async def _refused_or_closed(port: int) -> bool:
    """True when nothing accepts on the port, or the connection is closed without data."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except ConnectionRefusedError:
        return True
    try:
        data = await asyncio.wait_for(reader.read(), timeout=10)
        return data == b""
    except ConnectionResetError:
        return True
    finally:
        writer.close()


async def test_forward_moves_megabytes_both_ways_intact_with_half_close():
    payload = os.urandom(5 * 1024 * 1024)
    async with echo_server() as (target_port, events):
        listen = free_port()
        async with running_forwards(OSDialer(), [TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target_port}")]):
            received = await _echo_through(listen, payload)
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(payload).hexdigest()
    assert events == ["eof"]


async def test_several_connections_at_once():
    async with echo_server() as (target_port, _):
        listen = free_port()
        async with running_forwards(OSDialer(), [TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target_port}")]):
            payloads = [os.urandom(300_000 + i) for i in range(5)]
            results = await asyncio.gather(*(_echo_through(listen, p) for p in payloads))
    assert results == payloads


async def test_apply_adds_removes_and_is_idempotent():
    async with echo_server() as (target_a, _), echo_server() as (target_b, _):
        port_a, port_b = free_port(), free_port()
        spec_a = TunnelSpec(listen_port=port_a, target=f"127.0.0.1:{target_a}")
        spec_b = TunnelSpec(listen_port=port_b, target=f"127.0.0.1:{target_b}")
        async with ForwardManager(OSDialer()) as manager:
            await manager.apply([spec_a])
            assert manager.active == {port_a: spec_a.target}

            # a connection open across a re-apply of the same specs keeps working
            reader, writer = await asyncio.open_connection("127.0.0.1", port_a)
            writer.write(b"before")
            assert await reader.readexactly(6) == b"before"
            await manager.apply([spec_a])
            writer.write(b"after")
            assert await reader.readexactly(5) == b"after"
            writer.close()

            await manager.apply([spec_a, spec_b])
            assert manager.active == {port_a: spec_a.target, port_b: spec_b.target}
            assert await _echo_through(port_b, b"to b") == b"to b"

            await manager.apply([spec_b])
            assert manager.active == {port_b: spec_b.target}
            assert await _refused_or_closed(port_a)
            assert await _echo_through(port_b, b"still b") == b"still b"

            await manager.apply([])
            assert manager.active == {}
            assert await _refused_or_closed(port_b)
            # a removed port is free again at once: re-adding it works
            await manager.apply([spec_a])
            assert await _echo_through(port_a, b"again") == b"again"


async def test_removing_a_port_closes_its_open_connections():
    async with echo_server() as (target, _):
        port = free_port()
        async with ForwardManager(OSDialer()) as manager:
            await manager.apply([TunnelSpec(listen_port=port, target=f"127.0.0.1:{target}")])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"x")
            assert await reader.readexactly(1) == b"x"
            await manager.apply([])
            assert await asyncio.wait_for(reader.read(), timeout=10) == b""
            writer.close()


async def test_retarget_applies_to_new_connections():
    async with echo_server() as (target_a, events_a), echo_server() as (target_b, events_b):
        port = free_port()
        async with ForwardManager(OSDialer()) as manager:
            await manager.apply([TunnelSpec(listen_port=port, target=f"127.0.0.1:{target_a}")])
            assert await _echo_through(port, b"1") == b"1"
            await manager.apply([TunnelSpec(listen_port=port, target=f"127.0.0.1:{target_b}")])
            assert manager.active == {port: f"127.0.0.1:{target_b}"}
            assert await _echo_through(port, b"2") == b"2"
    assert events_a == ["eof"] and events_b == ["eof"]


async def test_port_in_use_is_reported_naming_the_port_and_the_rest_is_applied():
    async with echo_server() as (target, _):
        busy = socket.socket()
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        busy_port = busy.getsockname()[1]
        free = free_port()
        try:
            async with ForwardManager(OSDialer()) as manager:
                with pytest.raises(PortInUseError) as info:
                    await manager.apply(
                        [
                            TunnelSpec(listen_port=busy_port, target=f"127.0.0.1:{target}"),
                            TunnelSpec(listen_port=free, target=f"127.0.0.1:{target}"),
                        ]
                    )
                assert isinstance(info.value, ConfigError)
                assert info.value.ports == [busy_port]
                assert f"GW_TUNNEL_{busy_port}" in str(info.value)
                assert "already in use" in str(info.value)
                assert manager.active == {free: f"127.0.0.1:{target}"}
                assert await _echo_through(free, b"ok") == b"ok"
        finally:
            busy.close()


async def test_unreachable_target_closes_the_client_connection():
    port = free_port()
    async with running_forwards(OSDialer(), [TunnelSpec(listen_port=port, target=f"127.0.0.1:{free_port()}")]):
        assert await _refused_or_closed(port)


async def test_apply_outside_the_context_is_an_error():
    manager = ForwardManager(OSDialer())
    with pytest.raises(Exception, match="async with"):
        await manager.apply([])


@pytest.mark.parametrize("use_splice", [True, False])
async def test_relay_between_socket_connections_on_both_paths(use_splice):
    payload = os.urandom(2 * 1024 * 1024)
    async with echo_server() as (target, events):
        accepted: asyncio.Queue = asyncio.Queue()

        async def on_client(reader, writer):
            await accepted.put(writer.get_extra_info("socket").dup())
            writer.transport.abort()

        server = await asyncio.start_server(on_client, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        client_side = SocketConnection(await accepted.get())
        upstream = await OSDialer().open_connection("127.0.0.1", target)
        relay_task = asyncio.create_task(relay_mod.relay(client_side, upstream, use_splice=use_splice))

        async def send() -> None:
            writer.write(payload)
            await writer.drain()
            writer.write_eof()

        sender = asyncio.create_task(send())
        received = await reader.read()
        await sender
        stats = await relay_task
        writer.close()
        await client_side.aclose()
        await upstream.aclose()
        server.close()
    assert received == payload
    assert stats.a_to_b == stats.b_to_a == len(payload)
    assert events == ["eof"]


async def test_relay_with_a_stream_only_connection_uses_the_copy_path():
    async with echo_server() as (target, events):
        reader, writer = await asyncio.open_connection("127.0.0.1", target)
        stream_side = StreamConnection(reader, writer)  # no socket: no splice
        a, b = socket.socketpair()
        a_conn = SocketConnection(a)
        relay_task = asyncio.create_task(relay_mod.relay(a_conn, stream_side, a_to_b_prefix=b"prefix-"))
        loop = asyncio.get_running_loop()
        b.setblocking(False)
        await loop.sock_sendall(b, b"payload")
        b.shutdown(socket.SHUT_WR)
        got = b""
        while chunk := await loop.sock_recv(b, 65536):
            got += chunk
        stats = await relay_task
        b.close()
        await a_conn.aclose()
        await stream_side.aclose()
    assert got == b"prefix-payload"
    assert stats.a_to_b == len(b"prefix-payload")
    assert events == ["eof"]


async def test_concurrent_applies_do_not_trip_over_each_other():
    async with echo_server() as (target, _):
        ports = [free_port() for _ in range(3)]
        specs = [TunnelSpec(listen_port=p, target=f"127.0.0.1:{target}") for p in ports]
        async with ForwardManager(OSDialer()) as manager:
            await asyncio.gather(manager.apply(specs), manager.apply(specs), manager.apply(specs[:1]), manager.apply(specs))
            assert manager.active == {p: f"127.0.0.1:{target}" for p in ports}
            for p in ports:
                assert await _echo_through(p, b"x") == b"x"
