"""The asyncio adapter: drives a :class:`~anex_agent.netstack.stack.Stack` on the event loop.

:class:`NetstackRuntime` takes IP packets from the tunnel (:meth:`NetstackRuntime.deliver`,
the tunnel's ``on_packet`` callback) and gives packets to ``send_packet``; it keeps one
``loop.call_at`` timer at the stack's next deadline. Work is batched: every input only
marks the runtime dirty and one ``call_soon`` flush per loop iteration sends what all of
them made due (several writes become full segments, several received segments one ACK).

:class:`TcpStream` is a :class:`anex_agent.net.dialer.Connection` (``recv_into``, ``sendall``,
``shutdown_write``, ``aclose``; ``socket`` is None). Back-pressure both ways: ``sendall``
waits while the connection's send buffer is full (it drains as the peer acknowledges),
and a reader that does not read lets the receive buffer fill, which closes the window
advertised to the peer. :class:`UdpSocket` sends and receives datagrams (DNS, the SOCKS5
proxy's UDP relay, inbound UDP ports).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import Callable

from anex_agent.netstack.stack import Stack, UdpPort
from anex_agent.netstack.trim import BurstTrimmer
from anex_agent.netstack.tcp.connection import Connection
from anex_agent.netstack.tcp.states import CLOSED, REFUSED, TIMED_OUT

log = logging.getLogger(__name__)

#: After aclose() without the peer's FIN, how long we keep discarding its data before a reset.
ORPHAN_LINGER = 60.0


class NetstackRuntime:
    """See the module docstring. ``send_packet(packet)`` puts one IP packet into the tunnel;
    ``send_packets(packets)``, when given, all that one flush made in one call (the tunnel then
    encrypts and writes them as a burst)."""

    def __init__(self, stack: Stack, send_packet: Callable[[bytes], None], *,
                 send_packets: Callable[[list[bytes]], None] | None = None) -> None:
        self.stack = stack
        self.send_packet = send_packet
        self.send_packets = send_packets
        self._loop = asyncio.get_running_loop()
        self._flush_handle: asyncio.Handle | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._listeners: dict[int, Callable[[TcpStream], None]] = {}
        self._udp: dict[UdpPort, UdpSocket] = {}
        self.send_failures = 0
        self.closed = False
        self.trimmer = BurstTrimmer()  # the heap a burst of connections used goes back once it is over

    # ------------------------------------------------------------------ packets in, flushes

    def deliver(self, packet: bytes, peer: bytes | None = None) -> None:
        """An IP packet out of the tunnel (the tunnel's ``on_packet``)."""
        self.stack.receive(packet, self._loop.time())
        self.kick()

    def deliver_packets(self, packets: list[bytes]) -> None:
        """IP packets out of the tunnel, all at once (one clock read, one flush)."""
        receive, now = self.stack.receive, self._loop.time()
        for packet in packets:
            receive(packet, now)
        self.kick()

    def kick(self) -> None:
        """Flush at the end of this loop iteration (once, however many inputs came)."""
        if self._flush_handle is None and not self.closed:
            self._flush_handle = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_handle = None
        stack = self.stack
        stack.flush(self._loop.time())
        packets = stack.take_packets()
        if packets:
            self._send(packets)
        for conn in stack.take_dirty():
            user = conn.user
            if user is not None:
                user._wake()
        if stack.accepted:
            for port, conn in stack.take_accepted():
                handler = self._listeners.get(port)
                if handler is None:
                    conn.abort()
                    continue
                handler(TcpStream(self, conn))
        if stack.udp_ready:
            for port in stack.take_udp_ready():
                sock = self._udp.get(port)
                if sock is not None:
                    sock._wake()
        if stack.flush_due():  # a handler wrote or closed: go round once more
            self.kick()
        self.trimmer.observe(len(stack.conns))
        self._arm(stack.next_deadline())

    def _send(self, packets: list[bytes]) -> None:
        if self.send_packets is not None:
            try:
                self.send_packets(packets)
                return
            except Exception as err:  # the tunnel's bug: TCP retransmits what was lost
                self.send_failures += 1
                log.debug("netstack: packets not sent: %s", err)
                return
        send = self.send_packet
        for packet in packets:
            try:
                send(packet)
            except Exception as err:  # a packet the tunnel cannot carry (no peer for it): TCP retransmits
                self.send_failures += 1
                log.debug("netstack: packet not sent: %s", err)

    def _arm(self, deadline: float | None) -> None:
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = None
        self._timer_at = deadline
        if deadline is not None and not self.closed:
            self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_at = None
        self.stack.poll(self._loop.time())
        self._flush()

    # ------------------------------------------------------------------ TCP

    def open(self, address: str, port: int) -> TcpStream:
        """Start connecting to ``address:port`` (IPv4 literal); await :meth:`TcpStream.connected`."""
        conn = self.stack.tcp_connect(address, port, self._loop.time())
        stream = TcpStream(self, conn)
        self.kick()
        return stream

    def listen(self, port: int, on_accept: Callable[[TcpStream], None], *, backlog: int = 128) -> None:
        """Accept connections to ``port`` of our address; ``on_accept(stream)`` gets each established one."""
        self.stack.tcp_listen(port, backlog=backlog)
        self._listeners[port] = on_accept

    def unlisten(self, port: int) -> None:
        self.stack.tcp_unlisten(port)
        self._listeners.pop(port, None)

    @property
    def listening(self) -> frozenset[int]:
        return frozenset(self._listeners)

    # ------------------------------------------------------------------ UDP

    def udp_open(self, port: int = 0) -> UdpSocket:
        """A UDP socket bound to ``port`` of our address (0: a free ephemeral port); StackError when
        ``port`` is in use."""
        sock = UdpSocket(self, self.stack.udp_bind(port))
        self._udp[sock.port] = sock
        return sock

    # ------------------------------------------------------------------ teardown

    def close(self) -> None:
        """Reset every connection, wake every waiter, stop the timer. The stack is unusable afterwards."""
        if self.closed:
            return
        for conn in list(self.stack.conns.values()):
            conn.abort()
        self._flush()
        self.closed = True
        self._arm(None)
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        for sock in list(self._udp.values()):
            sock.close()

    def report(self) -> dict:
        stack = self.stack
        return {"connections": len(stack.conns), "listening": sorted(self._listeners),
                "drops": dict(stack.drops), "send_failures": self.send_failures, "heap_trims": self.trimmer.trims,
                "packets_in": stack.counters["packets_in"]}


def _error_for(conn: Connection) -> OSError:
    if conn.error == REFUSED:
        return ConnectionRefusedError("connection refused")
    if conn.error == TIMED_OUT:
        return TimeoutError("connection timed out")
    return ConnectionResetError("connection reset")


class TcpStream:
    """A :class:`anex_agent.net.dialer.Connection` over one netstack TCP connection."""

    socket = None

    def __init__(self, runtime: NetstackRuntime, conn: Connection) -> None:
        self._rt = runtime
        self.conn = conn
        conn.user = self
        self._waiter: asyncio.Future | None = None
        self._closed = False
        self._orphan_timer: asyncio.TimerHandle | None = None

    def __repr__(self) -> str:
        return f"<TcpStream {self.conn!r}>"

    @property
    def peername(self) -> tuple[str, int]:
        """The remote end: (IPv4 address, port)."""
        remote, rport, _ = self.conn.key
        return str(ipaddress.IPv4Address(remote)), rport

    @property
    def sockname(self) -> tuple[str, int]:
        """Our end: (the stack's address, port)."""
        return str(ipaddress.IPv4Address(self._rt.stack.address)), self.conn.key[2]

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    async def _wait(self) -> None:
        if self._waiter is None:
            self._waiter = self._rt._loop.create_future()
        await self._waiter

    async def connected(self) -> None:
        """Wait for the handshake; raise ConnectionRefusedError, TimeoutError or ConnectionResetError."""
        conn = self.conn
        while not conn.connected:
            if conn.error is not None or conn.state == CLOSED:
                raise _error_for(conn)
            await self._wait()

    async def recv_into(self, buf) -> int:
        conn = self.conn
        while True:
            n = conn.readinto(buf)
            if n:
                if self._rt.stack.events.pending:
                    self._rt.kick()  # a window update is due
                return n
            if conn.error is not None:
                raise _error_for(conn)
            if conn.at_eof or self._closed or (conn.state == CLOSED):
                return 0
            await self._wait()

    async def sendall(self, data) -> None:
        view = memoryview(data)
        if view.ndim != 1 or view.itemsize != 1:
            view = view.cast("B")
        conn = self.conn
        while view:
            if conn.error is not None:
                raise _error_for(conn)
            if self._closed or conn.state == CLOSED or conn.send_space == 0 and conn._fin_queued:
                raise BrokenPipeError("the connection is closed for writing")
            n = conn.write(view)
            if n:
                view = view[n:]
                self._rt.kick()
            if view:
                await self._wait()

    async def shutdown_write(self) -> None:
        if self._closed:
            return
        self.conn.close()
        self._rt.kick()

    async def aclose(self) -> None:
        """Close both directions: our FIN after queued data; data still arriving is discarded and
        a peer that never finishes is reset after :data:`ORPHAN_LINGER` s."""
        if self._closed:
            return
        self._closed = True
        conn = self.conn
        conn.close()
        if conn.state != CLOSED and not conn.at_eof:
            conn.user = _Orphan(conn, self._rt)
            conn.user._wake()
        self._wake()
        self._rt.kick()

    def abort(self) -> None:
        """Reset the connection now."""
        self._closed = True
        self.conn.abort()
        self._wake()
        self._rt.kick()


class _Orphan:
    """Reads away what a closed stream's peer still sends, so its FIN can arrive; resets after a while."""

    __slots__ = ("conn", "rt", "timer")

    def __init__(self, conn: Connection, rt: NetstackRuntime) -> None:
        self.conn, self.rt = conn, rt
        self.timer = rt._loop.call_later(ORPHAN_LINGER, self._expire)

    def _wake(self) -> None:
        conn = self.conn
        if conn.readable:
            conn.readinto(bytearray(conn.readable))
            self.rt.kick()
        if conn.state == CLOSED or conn.at_eof:
            self.timer.cancel()

    def _expire(self) -> None:
        if self.conn.state != CLOSED and not self.rt.closed:
            self.conn.abort()
            self.rt.kick()


class UdpSocket:
    """A bound UDP port of the stack: :meth:`sendto` and ``await`` :meth:`recvfrom`, or, with
    ``on_datagram`` set, every datagram handed to ``on_datagram(data, (ip, port))`` as it
    arrives (then :meth:`recvfrom` is not used)."""

    def __init__(self, runtime: NetstackRuntime, port: UdpPort) -> None:
        self._rt = runtime
        self.port = port
        self._waiter: asyncio.Future | None = None
        self.closed = False
        self.on_datagram: Callable[[bytes, tuple[str, int]], None] | None = None

    def _wake(self) -> None:
        on_datagram, queue = self.on_datagram, self.port.queue
        if on_datagram is not None:
            while queue and not self.closed:
                d = queue.popleft()
                try:
                    on_datagram(d.data, (str(ipaddress.IPv4Address(d.src)), d.src_port))
                except Exception:  # a handler's bug must not stop the stack's flush (other sockets, timers)
                    log.exception("UDP port %d: the datagram handler failed", self.port.port)
            return
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)
        self._waiter = None

    @property
    def runtime(self) -> NetstackRuntime:
        """The runtime whose stack holds the port."""
        return self._rt

    def sendto(self, data: bytes, address: str, port: int) -> None:
        if self.closed:
            raise OSError("the UDP socket is closed")
        self._rt.stack.udp_send(self.port, address, port, data)
        self._rt.kick()

    async def recvfrom(self) -> tuple[bytes, tuple[str, int]]:
        while not self.port.queue:
            if self.closed or self._rt.closed:
                raise OSError("the UDP socket is closed")
            self._waiter = self._rt._loop.create_future()
            await self._waiter
        d = self.port.queue.popleft()
        return d.data, (str(ipaddress.IPv4Address(d.src)), d.src_port)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._rt.stack.udp_unbind(self.port)
        self._rt._udp.pop(self.port, None)
        self._wake()


@contextlib.contextmanager
def udp_socket(runtime: NetstackRuntime):
    sock = runtime.udp_open()
    try:
        yield sock
    finally:
        sock.close()


WRITE_HIGH_WATER = 1 << 20  # bytes a StreamTransport holds beyond the send buffer before pause_writing


class StreamTransport(asyncio.Transport):
    """An asyncio transport over a :class:`TcpStream`, for protocol-based servers (the agent API's
    HTTP server on the mesh side). ``peername`` is the mesh peer, so a server that trusts
    loopback callers does not trust these. Run :meth:`pump` in a task: it feeds the protocol
    and returns when the connection is done. Writes go into the connection's send buffer; what
    does not fit waits, in order, for :meth:`pump`'s writer: a later write never goes straight to
    the connection while earlier bytes wait (nor while the writer is sending them). More than
    :data:`WRITE_HIGH_WATER` waiting calls the protocol's ``pause_writing``, and
    ``resume_writing`` follows once it is all sent (asyncssh ignores both; its channel windows
    bound what it writes)."""

    def __init__(self, stream: TcpStream, protocol: asyncio.Protocol, peername: tuple[str, int],
                 sockname: tuple[str, int]) -> None:
        super().__init__({"peername": peername, "sockname": sockname, "socket": None})
        self._stream = stream
        self._protocol = protocol
        self._pending = bytearray()  # written, not yet in the connection's send buffer (the writer's, in order)
        self._sending = False  # the writer is moving _pending's head into the connection
        self._paused = False  # pause_writing was called, resume_writing not yet
        self._more = asyncio.Event()
        self._closing = False

    def get_protocol(self) -> asyncio.BaseProtocol:
        return self._protocol

    def is_closing(self) -> bool:
        return self._closing

    def write(self, data) -> None:
        if self._closing:
            return
        if not self._pending and not self._sending:  # nothing waits: straight into the send buffer
            n = self._stream.conn.write(data)
            if n:
                self._stream._rt.kick()
            data = memoryview(data)[n:]
        if data:
            self._pending += data
            self._more.set()
            if not self._paused and len(self._pending) > WRITE_HIGH_WATER:
                self._paused = True
                self._protocol.pause_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self._closing = True
        self._more.set()

    def close(self) -> None:
        self._closing = True
        self._more.set()

    def abort(self) -> None:
        self._closing = True
        self._stream.abort()
        self._more.set()

    def get_write_buffer_size(self) -> int:
        return len(self._pending)

    def pause_reading(self) -> None:  # the stack's receive window is the flow control
        pass

    def resume_reading(self) -> None:
        pass

    async def _write_loop(self) -> None:
        while True:
            await self._more.wait()
            self._more.clear()
            while self._pending:  # what write() adds meanwhile goes after it, in _pending
                data = bytes(self._pending)
                self._sending = True
                try:
                    await self._stream.sendall(data)
                finally:
                    self._sending = False
                del self._pending[:len(data)]
            if self._paused:
                self._paused = False
                self._protocol.resume_writing()
            if self._closing and not self._pending:
                await self._stream.aclose()
                return

    async def _read_loop(self) -> None:
        buf = bytearray(65536)
        while not self._closing:
            n = await self._stream.recv_into(buf)
            if not n:
                if not self._protocol.eof_received():
                    self.close()
                return
            self._protocol.data_received(bytes(buf[:n]))

    async def pump(self) -> None:
        """Connect the protocol, feed it until EOF, and return once the answers were sent."""
        self._protocol.connection_made(self)
        error: Exception | None = None
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._write_loop(), name="stream-transport-write")
                await self._read_loop()
        except* OSError as failed:
            error = failed.exceptions[0]
            self._stream.abort()
        finally:
            self._closing = True
            self._protocol.connection_lost(error)
