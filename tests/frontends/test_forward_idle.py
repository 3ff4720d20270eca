"""Idle forwards cost little, bulk still flows, and a port refuses connections past its cap.

The forwards' upstream here is a :class:`StreamConnection` (no kernel socket), so the relay
takes the generic copy path, as it does on the user-space engine.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import tracemalloc

from anex_agent.net.dialer import StreamConnection
from anex_agent.frontends import relay as relay_mod
from anex_agent.frontends.forward import running_forwards
from anex_agent.wire.nodes import TunnelSpec
from tests.polling import wait_until

from .servers import echo_server, free_port

#: what the relay may allocate for one idle forwarded connection (its old fixed buffers: 512 KiB)
RELAY_IDLE_BUDGET = 12 * 1024  # two 2 KiB idle buffers plus its tasks and coroutines (~7 KiB measured)
#: what one idle forwarded connection may cost, everything in this process counted (the
#: client's and the echo server's ends, asyncio's transports and tasks)
IDLE_BUDGET = 64 * 1024


class StreamDialer:
    """Dials with asyncio streams: connections without a kernel socket (no splice)."""

    async def open_connection(self, host: str, port: int) -> StreamConnection:
        reader, writer = await asyncio.open_connection(host, port)
        return StreamConnection(reader, writer)


async def _open_echoing(port: int, count: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """``count`` connections to the forward, each proven relayed by one echoed byte."""
    conns = []
    for _ in range(count):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"x")
        assert await reader.readexactly(1) == b"x"
        conns.append((reader, writer))
    return conns


async def _close_all(conns) -> None:
    for _, writer in conns:
        writer.close()
    for _, writer in conns:
        await writer.wait_closed()


async def _echo_bulk(reader, writer, payload: bytes) -> bytes:
    async def send() -> None:
        writer.write(payload)
        await writer.drain()

    sender = asyncio.create_task(send())
    received = await reader.readexactly(len(payload))
    await sender
    return received


async def test_idle_forwarded_connections_hold_a_few_kilobytes_each():
    count = 40
    async with echo_server() as (target, _):
        listen = free_port()
        async with running_forwards(StreamDialer(), [TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target}")]):
            warm = await _open_echoing(listen, 2)  # first-use allocations out of the measurement
            tracemalloc.start()
            try:
                before, _ = tracemalloc.get_traced_memory()
                first = tracemalloc.take_snapshot()
                conns = await _open_echoing(listen, count)
                after, _ = tracemalloc.get_traced_memory()
                last = tracemalloc.take_snapshot()
            finally:
                tracemalloc.stop()
            per_connection = (after - before) / count
            only_relay = [tracemalloc.Filter(True, relay_mod.__file__)]
            relay_bytes = sum(d.size_diff for d in last.filter_traces(only_relay).compare_to(
                first.filter_traces(only_relay), "filename"))
            await _close_all(conns + warm)
    relay_per_connection = relay_bytes / count
    assert relay_per_connection <= RELAY_IDLE_BUDGET, f"the relay holds {relay_per_connection:.0f} bytes per idle connection"
    assert per_connection < IDLE_BUDGET, f"{per_connection:.0f} bytes per idle forwarded connection"


async def test_a_connection_that_went_idle_after_bulk_gives_its_large_buffers_back():
    payload = os.urandom(3 * 1024 * 1024 + 123)
    async with echo_server() as (target, _):
        listen = free_port()
        async with running_forwards(StreamDialer(), [TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target}")]):
            conns = await _open_echoing(listen, 3)
            results = await asyncio.gather(*(_echo_bulk(r, w, payload) for r, w in conns))
            # the connections stay open, idle: every large buffer is back in the pool
            await wait_until(lambda: relay_mod._pool.lent == 0, what="large relay buffers given back")
            await _close_all(conns)
    assert all(hashlib.sha256(r).digest() == hashlib.sha256(payload).digest() for r in results)


async def test_bulk_transfer_through_the_copy_path_is_intact_both_ways():
    payload = os.urandom(16 * 1024 * 1024 + 7)
    async with echo_server() as (target, events):
        listen = free_port()
        async with running_forwards(StreamDialer(), [TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target}")]):
            reader, writer = await asyncio.open_connection("127.0.0.1", listen)

            async def send() -> None:
                for i in range(0, len(payload), 1 << 20):
                    writer.write(payload[i : i + (1 << 20)])
                    await writer.drain()
                writer.write_eof()

            sender = asyncio.create_task(send())
            received = await reader.read()  # until the echo server's FIN came back
            await sender
            writer.close()
    assert hashlib.sha256(received).hexdigest() == hashlib.sha256(payload).hexdigest()
    assert events == ["eof"]


async def _closed_at_once(port: int) -> bool:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(b"hello")
        try:
            return await reader.read() == b""  # EOF (or a reset) and never an echo
        except ConnectionResetError:
            return True
    finally:
        writer.close()


async def test_connections_past_the_cap_are_refused_counted_and_logged_once(caplog):
    caplog.set_level(logging.WARNING, logger="anex_agent.frontends.forward")
    async with echo_server() as (target, _):
        listen = free_port()
        spec = TunnelSpec(listen_port=listen, target=f"127.0.0.1:{target}")
        async with running_forwards(StreamDialer(), [spec], max_connections=3) as manager:
            conns = await _open_echoing(listen, 3)
            assert manager.open_connections == {listen: 3}
            assert await _closed_at_once(listen)
            assert await _closed_at_once(listen)
            assert manager.refused == {listen: 2}
            lines = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
            assert len(lines) == 1, lines  # rate-limited: the second refusal is not logged
            assert f"127.0.0.1:{listen}" in lines[0] and "ANEX_FORWARD_MAX_CONNECTIONS" in lines[0]
            # below the cap again, connections are served
            first = conns.pop(0)
            await _close_all([first])
            await wait_until(lambda: manager.open_connections == {listen: 2}, what="a relayed connection to end")
            conns += await _open_echoing(listen, 1)
            assert manager.refused == {listen: 2}
            await _close_all(conns)
