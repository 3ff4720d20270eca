"""UdpBind: datagrams both ways on loopback, close semantics, errors at the edge."""

import asyncio
import socket

import pytest

from anex_agent.errors import EngineError
from anex_agent.tunnels.binds.udp import Bind, BindClosed, UdpBind
from tests.polling import GENEROUS, wait_until


async def test_send_and_receive_on_loopback():
    a = await UdpBind.open(0, "127.0.0.1")
    b = await UdpBind.open(0, "127.0.0.1")
    try:
        assert isinstance(a, Bind) and a.local_port and a.local_port != b.local_port
        a.send(b"hello", ("127.0.0.1", b.local_port))
        data, endpoint = await asyncio.wait_for(b.receive(), GENEROUS)
        assert data == b"hello" and endpoint == ("127.0.0.1", a.local_port)
        b.send(b"x" * 1500, endpoint)
        assert (await asyncio.wait_for(a.receive(), GENEROUS))[0] == b"x" * 1500
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
        await asyncio.wait_for(waiter, GENEROUS)
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
        assert (await asyncio.wait_for(bind.receive(), GENEROUS))[0] == b"y"
    finally:
        bind.close()


async def test_dual_stack_bind():
    try:
        bind = await UdpBind.open(0, "::")
    except EngineError as err:
        pytest.skip(f"no IPv6 here: {err}")
    try:
        bind.send(b"v4", ("127.0.0.1", bind.local_port))
        data, endpoint = await asyncio.wait_for(bind.receive(), GENEROUS)
        assert data == b"v4"
    finally:
        bind.close()


async def test_a_burst_is_read_in_few_readiness_events(monkeypatch):
    from anex_agent.tunnels.binds import udp as udp_bind

    events = 0
    original = udp_bind.UdpBind._hand_over

    def counting(self, batch):
        nonlocal events
        events += 1
        original(self, batch)

    monkeypatch.setattr(udp_bind.UdpBind, "_hand_over", counting)
    bind = await UdpBind.open(0, "127.0.0.1")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(100):  # all queued in the socket before the loop looks at it
            sender.sendto(i.to_bytes(2, "big"), ("127.0.0.1", bind.local_port))
        got = [await asyncio.wait_for(bind.receive(), GENEROUS) for _ in range(100)]
        assert [int.from_bytes(d, "big") for d, _ in got] == list(range(100))  # all, in order
        assert 1 <= events <= 100 // udp_bind.READ_BATCH + 2  # not one event per datagram
    finally:
        sender.close()
        bind.close()


async def test_a_receiver_gets_whole_batches_and_receive_only_reports_the_close():
    bind = await UdpBind.open(0, "127.0.0.1")
    batches: list[list] = []
    all_in = asyncio.Event()

    def receiver(batch):
        batches.append(batch)
        if sum(map(len, batches)) == 100:
            all_in.set()

    bind.set_receiver(receiver)
    waiter = asyncio.create_task(bind.receive(), name="test-receive")
    sender = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        for i in range(100):
            sender.sendto(i.to_bytes(2, "big"), ("127.0.0.1", bind.local_port))
        await asyncio.wait_for(all_in.wait(), GENEROUS)
        got = [item for batch in batches for item in batch]
        assert [int.from_bytes(d, "big") for d, _ in got] == list(range(100))
        assert {endpoint for _, endpoint in got} == {("127.0.0.1", sender.getsockname()[1])}
        assert len(batches) < 100 and not waiter.done()  # batches, and nothing went to the queue
    finally:
        sender.close()
        bind.close()
    with pytest.raises(BindClosed):
        await asyncio.wait_for(waiter, GENEROUS)


async def test_a_failing_receiver_does_not_stop_the_bind():
    bind = await UdpBind.open(0, "127.0.0.1")
    seen = []
    second = asyncio.Event()

    def receiver(batch):
        seen.extend(batch)
        if len(seen) == 1:
            raise RuntimeError("a bug in the driver")
        second.set()

    bind.set_receiver(receiver)
    try:
        bind.send(b"one", ("127.0.0.1", bind.local_port))
        await wait_until(lambda: seen, what="the first datagram")
        bind.send(b"two", ("127.0.0.1", bind.local_port))
        await asyncio.wait_for(second.wait(), GENEROUS)
        assert [d for d, _ in seen] == [b"one", b"two"]
    finally:
        bind.close()


async def test_send_batch_sends_each_in_order_and_skips_unsendable_ones():
    a = await UdpBind.open(0, "127.0.0.1")
    b = await UdpBind.open(0, "127.0.0.1")
    try:
        to_b = ("127.0.0.1", b.local_port)
        a.send_batch([(b"1", to_b), (b"x", ("not an address", 1)), (b"2", to_b), (b"3", to_b)])
        got = [(await asyncio.wait_for(b.receive(), GENEROUS))[0] for _ in range(3)]
        assert got == [b"1", b"2", b"3"]
    finally:
        a.close()
        b.close()
    a.send_batch([(b"after close is ignored", ("127.0.0.1", 9))])


async def test_runs_of_equal_datagrams_go_out_with_segmentation_offload_and_arrive_whole():
    """Runs of one size to one endpoint (the last of a run may be shorter), other endpoints and
    sizes between them: every datagram arrives intact and in order, at either receiver."""
    a = await UdpBind.open(0, "127.0.0.1")
    b = await UdpBind.open(0, "127.0.0.1")
    plain = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # no GRO: the kernel cuts the runs for it
    plain.bind(("127.0.0.1", 0))
    plain.setblocking(False)
    to_b, to_plain = ("127.0.0.1", b.local_port), plain.getsockname()
    got_b: list[bytes] = []
    b.set_receiver(lambda batch: got_b.extend(d for d, _ in batch))
    try:
        for_b = [bytes([i]) * 1452 for i in range(70)] + [b"short end"] + [bytes([7]) * 80 for _ in range(5)]
        for_plain = [b"p%d" % i for i in range(3)]
        batch = [(d, to_b) for d in for_b[:40]] + [(d, to_plain) for d in for_plain] + [(d, to_b) for d in for_b[40:]]
        a.send_batch(batch)
        await wait_until(lambda: len(got_b) == len(for_b), what="every datagram at b")
        assert got_b == for_b
        assert [plain.recv(65535) for _ in for_plain] == for_plain
    finally:
        a.close()
        b.close()
        plain.close()


class _NoOffload:
    """A socket whose kernel refuses segmentation offload (EIO, as a device without checksum offload)."""

    def __init__(self, sock):
        self.sock, self.refused = sock, 0

    def sendmsg(self, *args):
        import errno

        self.refused += 1
        raise OSError(errno.EIO, "Input/output error")

    def __getattr__(self, name):
        return getattr(self.sock, name)


async def test_a_refused_offload_falls_back_to_one_send_each_for_good():
    a = await UdpBind.open(0, "127.0.0.1")
    b = await UdpBind.open(0, "127.0.0.1")
    fake = a._sock = _NoOffload(a._sock)
    try:
        to_b = ("127.0.0.1", b.local_port)
        first = [(bytes([i]) * 100, to_b) for i in range(10)]
        a.send_batch(first)
        assert not a.gso and fake.refused == 1
        a.send_batch(first[:3])
        assert fake.refused == 1  # not tried again
        got = [(await asyncio.wait_for(b.receive(), GENEROUS))[0] for _ in range(13)]
        assert got == [d for d, _ in first + first[:3]]
    finally:
        a._sock = fake.sock
        a.close()
        b.close()


async def test_a_backed_up_queue_takes_data_but_not_more_handshakes():
    """Queued for receive() (no receiver set): past HANDSHAKE_QUEUE_SHARE waiting datagrams a
    handshake message is dropped at the Bind; transport data is still queued (the data of
    established sessions first)."""
    from anex_agent.tunnels.binds.base import HANDSHAKE_QUEUE_SHARE
    from anex_agent.tunnels.binds.udp import RECEIVE_QUEUE

    bind = await UdpBind.open(0, "127.0.0.1")
    try:
        initiation, transport = b"\x01\0\0\0" + bytes(144), b"\x04\0\0\0" + bytes(28)
        for _ in range(HANDSHAKE_QUEUE_SHARE):
            bind._hand_over([(initiation, ("192.0.2.1", 1))])
        assert bind.dropped == 0
        bind._hand_over([(initiation, ("192.0.2.1", 1)), (b"\x02\0\0\0" + bytes(88), ("192.0.2.1", 1))])
        assert bind.dropped == 2
        bind._hand_over([(transport, ("192.0.2.2", 2))])
        assert bind.dropped == 2
        bind._hand_over([(transport, ("192.0.2.2", 2))] * RECEIVE_QUEUE)
        assert bind.dropped == 2 + HANDSHAKE_QUEUE_SHARE + 1  # full: data dropped too, as a full socket buffer would
        got = [await bind.receive() for _ in range(HANDSHAKE_QUEUE_SHARE + 1)]
        assert got[-1] == (transport, ("192.0.2.2", 2))
    finally:
        bind.close()
