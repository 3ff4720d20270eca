"""The built-in engine with its TCP/IP stack, end to end in this process: two engines over real
UDP, one dials the other's mesh address through its dialer, the other relays its inbound port
to a loopback server; DNS over the stack; the workload's datagrams (the datagram dialer, the
SOCKS5 proxy's UDP ASSOCIATE) over the stack; destinations outside the tunnel go through the OS."""

from __future__ import annotations

import asyncio
import hashlib
import os

import pytest

from anex_agent.wire import keys
from anex_agent.errors import DialRefused, DialTimeout
from anex_agent.net.resolver import Resolver, ResolverSlot
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.userspace import UserspaceEngine

IP_A, IP_B = "10.45.0.1", "10.45.0.2"


def desired(key, peer_key, address, peer_ip, endpoint):
    return DesiredConfig(private_key=key, listen_port=None, address=f"{address}/24", mtu=1420, peers=(
        PeerConfig(public_key=keys.encode_key(keys.public_key(peer_key)), endpoint=endpoint,
                   allowed_ips=(f"{peer_ip}/32",), persistent_keepalive=25 if endpoint else 0),))


async def _echo_server():
    async def handle(reader, writer):
        h = hashlib.sha256()
        n = 0
        while data := await reader.read(65536):
            h.update(data)
            n += len(data)
        writer.write(f"{n} {h.hexdigest()}".encode())
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


@pytest.fixture
async def pair(tasks):
    ka, kb = keys.generate_private_key(), keys.generate_private_key()
    a, b = UserspaceEngine(ifname=None), UserspaceEngine(ifname=None)
    await a.start(tasks)
    await b.start(tasks)
    server, port = await _echo_server()
    await b.apply(desired(kb, ka, IP_B, IP_A, None), WorkloadConfig(inbound_ports=(port,)))
    port_b = (await b.status()).listen_port
    await a.apply(desired(ka, kb, IP_A, IP_B, f"127.0.0.1:{port_b}"))
    try:
        yield a, b, port
    finally:
        server.close()
        await a.stop()
        await b.stop()


async def test_dial_through_the_stack_to_an_inbound_port(pair):
    a, b, port = pair
    dialer = a.dialer(ResolverSlot())
    conn = await asyncio.wait_for(dialer.open_connection(IP_B, port), 10)
    data = os.urandom(3_000_000)
    await conn.sendall(data)
    await conn.shutdown_write()
    buf = bytearray(65536)
    answer = bytearray()
    while n := await asyncio.wait_for(conn.recv_into(buf), 10):
        answer += buf[:n]
    await conn.aclose()
    assert answer.decode() == f"{len(data)} {hashlib.sha256(data).hexdigest()}"
    assert conn.socket is None  # a stream of the stack, not a kernel socket


async def test_a_port_nobody_serves_is_refused_and_an_unanswered_address_times_out(pair):
    a, b, port = pair
    dialer = a.dialer(ResolverSlot())
    with pytest.raises(DialRefused):
        await asyncio.wait_for(dialer.open_connection(IP_B, 1), 10)
    dialer.connect_timeout = 0.5
    b.runtime.close()  # the peer's stack is gone: SYNs go unanswered
    with pytest.raises(DialTimeout):
        await dialer.open_connection(IP_B, port)


async def test_addresses_outside_the_tunnel_go_through_the_os(pair):
    a, b, port = pair
    dialer = a.dialer(ResolverSlot())
    conn = await asyncio.wait_for(dialer.open_connection("127.0.0.1", port), 10)
    assert conn.socket is not None  # a kernel socket: the OS dialer
    await conn.aclose()


def stack_udp_port(engine, port: int):
    """A UDP socket of ``engine``'s stack bound to ``port`` of its mesh address."""
    return engine.runtime.udp_open(port)


async def serve_dns(engine, answered: list[str]):
    """A DNS server on ``engine``'s stack (UDP port 53 of its mesh address): every A is 10.96.0.7."""
    import dns.message
    import dns.rrset

    sock = stack_udp_port(engine, 53)
    while True:
        data, (host, sport) = await sock.recvfrom()
        query = dns.message.from_wire(data)
        reply = dns.message.make_response(query)
        reply.answer.append(dns.rrset.from_text(query.question[0].name, 30, "IN", "A", "10.96.0.7"))
        answered.append(host)
        sock.sendto(reply.to_wire(), host, sport)


async def test_cluster_dns_goes_over_the_stack(pair):
    a, b, port = pair
    answered = []
    server = asyncio.create_task(serve_dns(b, answered), name="test-dns-on-the-stack")
    try:
        slot = ResolverSlot()
        a.dialer(slot)
        slot.use(Resolver([IP_B], timeout=3))
        assert await slot.resolve("web.default.svc.cluster.local") == ["10.96.0.7"]
        assert answered and answered[0] == IP_A
    finally:
        server.cancel()


async def test_a_protocol_served_on_the_mesh_sees_the_mesh_peer(pair):
    """The agent API's mesh side: an asyncio protocol on the stack's connection, peer = the caller."""
    a, b, port = pair
    seen = []

    class Answer(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            seen.append(transport.get_extra_info("peername"))

        def data_received(self, data):
            self.transport.write(b"got " + data)
            self.transport.close()

    assert await b.serve_on_mesh(9555, Answer)
    conn = await asyncio.wait_for(a.dialer(ResolverSlot()).open_connection(IP_B, 9555), 10)
    await conn.sendall(b"hello")
    buf = bytearray(100)
    answer = b""
    while n := await asyncio.wait_for(conn.recv_into(buf), 10):
        answer += bytes(buf[:n])
    await conn.aclose()
    assert answer == b"got hello"
    assert seen and seen[0][0] == IP_A  # not loopback: a server trusting local callers does not trust this one


async def test_a_protocol_writing_more_than_the_send_buffer_gets_its_bytes_through_in_order(pair):
    """The node's SSH server on the mesh side writes as fast as it likes (asyncssh does no transport
    flow control): what does not fit in the connection's send buffer waits, and a later write
    must not overtake it when the buffer frees up (it did: big downloads over SSH were corrupt)."""
    a, b, port = pair
    chunks = [hashlib.sha256(str(i).encode()).digest() * 2048 for i in range(48)]  # 64 KiB each, 3 MiB
    paused = []

    class Talker(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.left = transport, list(chunks)
            # a burst first: more than the send buffer (which grows with the path) plus the
            # high-water mark waits at once; then one write per loop turn
            for _ in range(24):
                self.transport.write(self.left.pop(0))
            asyncio.get_running_loop().call_soon(self.more)

        def more(self):  # one write per loop turn, interleaved with ACKs freeing the buffer
            self.transport.write(self.left.pop(0))
            if self.left:
                asyncio.get_running_loop().call_soon(self.more)
            else:
                self.transport.close()

        def pause_writing(self):
            paused.append(self.transport.get_write_buffer_size())

    assert await b.serve_on_mesh(2222, Talker)
    conn = await asyncio.wait_for(a.dialer(ResolverSlot()).open_connection(IP_B, 2222), 10)
    got = hashlib.sha256()
    buf = bytearray(65536)
    total = 0
    while n := await asyncio.wait_for(conn.recv_into(buf), 30):
        got.update(buf[:n])
        total += n
    await conn.aclose()
    assert total == len(chunks) * 65536
    assert got.hexdigest() == hashlib.sha256(b"".join(chunks)).hexdigest()
    assert paused and min(paused) > 0  # told to pause once more than its high-water mark waited


async def test_the_agent_api_served_through_the_stack_wants_a_token(pair):
    """The agent API itself on the stack's connection: a mesh caller is not local, so without a
    token it gets the 401 problem document; with the port kept alive, a second request too."""
    from anex_agent.agent.api import AgentApi

    a, b, port = pair

    async def status():
        return {}

    async def ready():
        return True, "ok"

    api = AgentApi(status, ready, lambda token, now: None)
    assert await b.serve_on_mesh(9556, await api.protocol_factory())
    conn = await asyncio.wait_for(a.dialer(ResolverSlot()).open_connection(IP_B, 9556), 10)
    try:
        answers = b""
        buf = bytearray(4096)
        for _ in range(2):
            await conn.sendall(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            while answers.count(b'"status": 401') < _ + 1:
                n = await asyncio.wait_for(conn.recv_into(buf), 10)
                assert n, answers
                answers += bytes(buf[:n])
        assert answers.count(b"HTTP/1.1 401") == 2 and b"application/problem+json" in answers
        assert b'WWW-Authenticate: Bearer realm="anex-agent"' in answers
    finally:
        await conn.aclose()
        await api.close()


async def test_datagrams_to_the_tunnel_go_through_a_udp_port_of_the_stack(pair):
    a, b, port = pair
    echo = stack_udp_port(b, 7777)
    got: asyncio.Queue = asyncio.Queue()
    sock = a.datagram_dialer(ResolverSlot()).open_datagram(lambda data, source: got.put_nowait((data, source)))
    try:
        sock.sendto(b"over the stack", IP_B, 7777)
        data, (host, sport) = await asyncio.wait_for(echo.recvfrom(), 10)
        assert data == b"over the stack" and host == IP_A  # it came through the tunnel
        echo.sendto(b"echo:" + data, host, sport)
        assert await asyncio.wait_for(got.get(), 10) == (b"echo:over the stack", (IP_B, 7777))
        with pytest.raises(OSError, match="does not fit"):
            sock.sendto(bytes(1500), IP_B, 7777)  # beyond the tunnel's MTU: said, not sent
    finally:
        sock.close()
        echo.close()
    assert sport not in a.runtime.stack.udp_ports  # closing the socket gave the stack's port back


async def test_datagrams_outside_the_tunnel_go_through_the_os_and_none_while_the_mesh_is_down(pair):
    a, b, port = pair
    loop = asyncio.get_running_loop()
    got: asyncio.Queue = asyncio.Queue()

    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport):
            self.transport = transport

        def datagram_received(self, data, addr):
            self.transport.sendto(data, addr)

    transport, _ = await loop.create_datagram_endpoint(Echo, local_addr=("127.0.0.1", 0))
    echo_port = transport.get_extra_info("sockname")[1]
    sock = a.datagram_dialer(ResolverSlot()).open_datagram(lambda data, source: got.put_nowait((data, source)))
    try:
        sock.sendto(b"kernel", "127.0.0.1", echo_port)
        assert await asyncio.wait_for(got.get(), 10) == (b"kernel", ("127.0.0.1", echo_port))
        a.runtime.close()
        with pytest.raises(OSError, match="not up"):
            sock.sendto(b"x", IP_B, 7777)
    finally:
        sock.close()
        transport.close()


async def test_a_stack_without_a_free_udp_port_is_an_oserror_for_the_sender(pair, monkeypatch):
    """The DatagramSocket contract: a destination that cannot be reached raises OSError (the
    SOCKS5 relay counts it and goes on), also when the stack has no UDP port left to send from."""
    from anex_agent.netstack.stack import StackError

    from tests.polling import wait_until

    a, _b, _port = pair
    sock = a.datagram_dialer(ResolverSlot()).open_datagram(lambda data, source: None)

    def no_port(*args, **kwargs):
        raise StackError("no free UDP port")
    try:
        await wait_until(lambda: a.runtime is not None, what="the stack of the tunnel")
        monkeypatch.setattr(a.runtime, "udp_open", no_port)
        with pytest.raises(OSError, match="no free UDP port"):
            sock.sendto(b"x", IP_B, 7777)
    finally:
        sock.close()


async def test_a_failing_datagram_handler_does_not_stop_other_udp_ports(pair):
    """One port's handler raising (a bug) is logged; the stack's flush goes on to the next port."""
    a, b, _port = pair
    got: asyncio.Queue = asyncio.Queue()
    broken = b.runtime.udp_open(7001)
    broken.on_datagram = lambda data, source: 1 / 0
    working = b.runtime.udp_open(7002)
    working.on_datagram = lambda data, source: got.put_nowait(data)
    sender = a.datagram_dialer(ResolverSlot()).open_datagram(lambda data, source: None)
    try:
        sender.sendto(b"to the broken one", IP_B, 7001)
        sender.sendto(b"to the working one", IP_B, 7002)
        assert await asyncio.wait_for(got.get(), 30) == b"to the working one"
    finally:
        sender.close()
        broken.close()
        working.close()


async def test_pysocks_dns_over_udp_associate_through_the_stack(pair):
    """The SOCKS5 proxy on the built-in engine: PySocks' DNS query to the peer's mesh address
    travels in the stack (no OS interface), and the answer comes back through the relay."""
    from anex_agent.frontends.socks5 import Socks5Server
    from tests.frontends.test_socks5 import a_records, pysocks_dns_query

    a, b, port = pair
    answered: list[str] = []
    server = asyncio.create_task(serve_dns(b, answered), name="test-dns-on-the-stack")
    try:
        slot = ResolverSlot()
        async with Socks5Server(a.dialer(slot), host="127.0.0.1", port=0, datagrams=a.datagram_dialer(slot)) as socks:
            answer, source = await asyncio.to_thread(pysocks_dns_query, socks.address[1], (IP_B, 53),
                                                     "web.default.svc.cluster.local")
        assert a_records(answer) == ["10.96.0.7"] and source == (IP_B, 53)
        assert answered == [IP_A]  # the query reached the peer through the tunnel
    finally:
        server.cancel()


async def test_the_cluster_reaches_an_inbound_udp_port_and_two_clients_keep_their_replies_apart(tasks):
    """``ANEX_INBOUND_PORTS=<port>/udp``: engine B's stack binds the UDP port at its mesh address and
    relays each mesh peer's datagrams to the workload's loopback server through a socket of its own,
    so each of A's two sockets gets the answers to its own questions, from B's mesh address and port."""
    loop = asyncio.get_running_loop()

    class Workload(asyncio.DatagramProtocol):
        def connection_made(self, transport):
            self.transport, self.sources = transport, set()

        def datagram_received(self, data, addr):
            self.sources.add(addr)
            self.transport.sendto(b"answer to " + data, addr)

    transport, workload = await loop.create_datagram_endpoint(Workload, local_addr=("127.0.0.1", 0))
    port = transport.get_extra_info("sockname")[1]
    ka, kb = keys.generate_private_key(), keys.generate_private_key()
    a, b = UserspaceEngine(ifname=None), UserspaceEngine(ifname=None)
    await a.start(tasks)
    await b.start(tasks)
    try:
        assert await b.apply(desired(kb, ka, IP_B, IP_A, None), WorkloadConfig(inbound_udp_ports=(port,))) is True
        assert port in b.runtime.stack.udp_ports and port not in b.runtime.stack.listeners  # UDP, not TCP
        assert await b.apply(desired(kb, ka, IP_B, IP_A, None), WorkloadConfig(inbound_udp_ports=(port,))) is False
        await a.apply(desired(ka, kb, IP_A, IP_B, f"127.0.0.1:{(await b.status()).listen_port}"))
        dialer = a.datagram_dialer(ResolverSlot())
        got = {name: asyncio.Queue() for name in ("one", "two")}
        socks = {name: dialer.open_datagram(lambda data, source, q=q: q.put_nowait((data, source)))
                 for name, q in got.items()}
        for round_ in range(3):
            for name, sock in socks.items():
                sock.sendto(f"{name} #{round_}".encode(), IP_B, port)
            for name, q in got.items():
                assert await asyncio.wait_for(q.get(), 10) == (f"answer to {name} #{round_}".encode(), (IP_B, port))
        assert len(workload.sources) == 2  # one loopback socket per mesh peer
        assert b.report()["inbound_udp"][f"{port}/udp"]["sessions"] == 2
        for sock in socks.values():
            sock.close()
        # the port no longer listed: unbound, its sessions closed
        assert await b.apply(desired(kb, ka, IP_B, IP_A, None), WorkloadConfig()) is True
        assert port not in b.runtime.stack.udp_ports and "inbound_udp" not in b.report()
    finally:
        transport.close()
        await a.stop()
        await b.stop()
