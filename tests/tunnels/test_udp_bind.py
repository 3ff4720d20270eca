"""UdpBind: datagrams both ways on loopback, close semantics, errors at the edge."""

import asyncio
import socket

import pytest

from anex_agent.errors import EngineError
from anex_agent.tunnels.udp_bind import Bind, BindClosed, UdpBind


async def test_send_and_receive_on_loopback():
    a = await UdpBind.open(0, "127.0.0.1")
    b = await UdpBind.open(0, "127.0.0.1")
    try:
        assert isinstance(a, Bind) and a.local_port and a.local_port != b.local_port
        a.send(b"hello", ("127.0.0.1", b.local_port))
        data, endpoint = await asyncio.wait_for(b.receive(), 5)
        assert data == b"hello" and endpoint == ("127.0.0.1", a.local_port)
        b.send(b"x" * 1500, endpoint)
        assert (await asyncio.wait_for(a.receive(), 5))[0] == b"x" * 1500
    finally:
        a.close()
        b.close()


async def test_close_wakes_a_pending_receive_and_is_idempotent():
    bind = await UdpBind.open(0, "127.0.0.1")
    waiter = asyncio.create_task(bind.receive(), name="test-receive")
    await asyncio.sleep(0.01)
    bind.close()
    bind.close()
    with pytest.raises(BindClosed):
        await asyncio.wait_for(waiter, 5)
    with pytest.raises(BindClosed):
        await bind.receive()
    bind.send(b"after close is ignored", ("127.0.0.1", 9))


async def test_port_in_use_is_an_engine_error_naming_the_port():
    holder = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    holder.bind(("127.0.0.1", 0))
    port = holder.getsockname()[1]
    try:
        with pytest.raises(EngineError, match=str(port)):
            await UdpBind.open(port, "127.0.0.1")
    finally:
        holder.close()


async def test_unsendable_datagrams_are_dropped_not_raised():
    bind = await UdpBind.open(0, "127.0.0.1")
    try:
        bind.send(b"x", ("not an address", 1))
        bind.send(b"x", ("127.0.0.1", 1))  # nobody there: ICMP unreachable is swallowed
        await asyncio.sleep(0.05)
        bind.send(b"y", ("127.0.0.1", bind.local_port))
        assert (await asyncio.wait_for(bind.receive(), 5))[0] == b"y"
    finally:
        bind.close()


async def test_dual_stack_bind():
    try:
        bind = await UdpBind.open(0, "::")
    except EngineError as err:
        pytest.skip(f"no IPv6 here: {err}")
    try:
        bind.send(b"v4", ("127.0.0.1", bind.local_port))
        data, endpoint = await asyncio.wait_for(bind.receive(), 5)
        assert data == b"v4"
    finally:
        bind.close()


async def test_a_burst_is_read_in_few_readiness_events():
    from anex_agent.tunnels import udp_bind

    bind = await UdpBind.open(0, "127.0.0.1")
    events = 0
    original = udp_bind._Protocol.datagram_received

    def counting(self, data, addr):
        nonlocal events
        events += 1
        original(self, data, addr)

    udp_bind._Protocol.datagram_received = counting
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(100):  # all queued in the socket before the loop looks at it
            sender.sendto(i.to_bytes(2, "big"), ("127.0.0.1", bind.local_port))
        got = [await asyncio.wait_for(bind.receive(), 5) for _ in range(100)]
        assert [int.from_bytes(d, "big") for d, _ in got] == list(range(100))  # all, in order
        assert events <= 100 // udp_bind.READ_BATCH + 2  # not one event per datagram
    finally:
        udp_bind._Protocol.datagram_received = original
        sender.close()
        bind.close()


async def test_a_backed_up_queue_takes_data_but_not_more_handshakes():
    """Past HANDSHAKE_QUEUE_SHARE waiting datagrams a handshake message is dropped at the Bind;
    transport data is still queued (the data of established sessions first)."""
    from anex_agent.tunnels.bind import HANDSHAKE_QUEUE_SHARE
    from anex_agent.tunnels.udp_bind import RECEIVE_QUEUE

    bind = await UdpBind.open(0, "127.0.0.1")
    try:
        initiation, transport = b"\x01\0\0\0" + bytes(144), b"\x04\0\0\0" + bytes(28)
        for _ in range(HANDSHAKE_QUEUE_SHARE):
            bind._deliver(initiation, ("192.0.2.1", 1))
        assert bind.dropped == 0
        bind._deliver(initiation, ("192.0.2.1", 1))
        bind._deliver(b"\x02\0\0\0" + bytes(88), ("192.0.2.1", 1))
        assert bind.dropped == 2
        bind._deliver(transport, ("192.0.2.2", 2))
        assert bind.dropped == 2
        for _ in range(RECEIVE_QUEUE):
            bind._deliver(transport, ("192.0.2.2", 2))
        assert bind.dropped == 2 + HANDSHAKE_QUEUE_SHARE + 1  # full: data dropped too, as a full socket buffer would
        got = [await bind.receive() for _ in range(HANDSHAKE_QUEUE_SHARE + 1)]
        assert got[-1] == (transport, ("192.0.2.2", 2))
    finally:
        bind.close()
