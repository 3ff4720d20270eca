"""The stack: one IPv4 address, TCP connections and listeners, UDP ports, ICMP echo. Sans-I/O.

Driving it (the asyncio adapter does this; tests do it by hand)::

    stack = Stack("10.254.0.5", mtu=1420)
    stack.receive(ip_packet, now)          # a packet from the tunnel
    conn = stack.tcp_connect("10.96.0.10", 80, now)
    conn.write(b"GET / ...")               # bounded: returns how much it took
    stack.flush(now)                       # send what writes, reads and ACKs made due
    stack.poll(now)                        # timers (at or after next_deadline())
    for packet in stack.take_packets(): ...       # into the tunnel
    for conn in stack.take_dirty(): ...           # streams to look at (readable, writable, connected, closed)
    for port, conn in stack.take_accepted(): ...  # established connections to a listener
    stack.next_deadline()                  # when to call poll() again (None: never)

After ``receive``, ``tcp_connect``, ``poll`` or user calls on a connection, call
``flush(now)`` and then take packets, dirty connections and accepted ones.

Connections never call the stack: they report into the one
:class:`~anex_agent.netstack.tcp.events.Events` the stack gives each of them (``self.events``;
``self.out`` is its packet list). The stack acts on handshakes completed and connections
closed right after each call into a connection (a segment, a timer), and on those the
user's side closed (``close`` before the handshake, ``abort``) before its next lookup, connect
or flush.
"""

from __future__ import annotations

import collections
import hashlib
import heapq
import ipaddress
import os
from collections.abc import Callable

from anex_agent.errors import AnexError
from anex_agent.netstack import icmp, ipv4, udp
from anex_agent.netstack.tcp import segment as tcpwire
from anex_agent.netstack.tcp.autotune import MemoryBudget
from anex_agent.netstack.tcp.connection import Connection, TcpParams
from anex_agent.netstack.tcp.events import Events
from anex_agent.netstack.tcp.states import CLOSED

EPHEMERAL = (49152, 65535)  # RFC 6335 §6
UDP_QUEUE = 256  # datagrams held per UDP port before new ones are dropped
ISN_TICK = 250_000  # RFC 6528: the clock part of the ISN advances every 4 µs
MIN_TIMER_STEP = 0.001


class StackError(AnexError):
    """A local misuse (port in use, no ephemeral port left, not an IPv4 destination)."""


def _ip(value) -> bytes:
    if isinstance(value, bytes) and len(value) == 4:
        return value
    addr = ipaddress.ip_address(value)
    if addr.version != 4:
        raise StackError(f"{value}: only IPv4 is supported")
    return addr.packed


class Listener:
    """A TCP port accepting connections; at most ``backlog`` half-open or unaccepted at a time."""

    __slots__ = ("port", "backlog", "half_open")

    def __init__(self, port: int, backlog: int) -> None:
        self.port, self.backlog, self.half_open = port, backlog, 0


class UdpPort:
    __slots__ = ("port", "queue", "dropped")

    def __init__(self, port: int) -> None:
        self.port = port
        self.queue: collections.deque[udp.Datagram] = collections.deque()
        self.dropped = 0


class Stack:
    def __init__(self, address, *, mtu: int = 1420, params: TcpParams | None = None,
                 random_bytes: Callable[[int], bytes] = os.urandom, verify_checksums: bool = True) -> None:
        """``verify_checksums`` False: the link authenticates every packet (WireGuard's AEAD), so
        the IPv4, TCP and UDP checksums of received packets are not checked again (Linux marks
        packets out of a WireGuard interface CHECKSUM_UNNECESSARY for the same reason). What we
        send always carries correct checksums."""
        self.address = _ip(address)
        self.verify = verify_checksums
        self.mtu = mtu
        self.params = params or TcpParams()
        self.budget = MemoryBudget(self.params.buffer_budget)  # TCP buffer growth, all connections together
        self.mss = mtu - ipv4.HEADER_LEN - tcpwire.HEADER_LEN  # RFC 9293 §3.7.1: clamp to the link
        self._random = random_bytes
        self._isn_key = random_bytes(16)
        self.events = Events()  # what the connections did (tcp/events.py): drained here and by flush
        self.out = self.events.packets  # our own packets (resets, ICMP, UDP) join the connections'
        self.accepted: list[tuple[int, Connection]] = []
        self.udp_ready: dict[UdpPort, None] = {}
        self.conns: dict[tuple[bytes, int, int], Connection] = {}
        self.listeners: dict[int, Listener] = {}
        self.udp_ports: dict[int, UdpPort] = {}
        self._heap: list[tuple[float, int, Connection]] = []
        self._heap_seq = 0
        self.drops: collections.Counter[str] = collections.Counter()
        self.counters: collections.Counter[str] = collections.Counter()

    # ------------------------------------------------------------------ input

    def receive(self, data: bytes, now: float) -> None:
        """One IP packet from the link. Malformed or foreign packets are counted in ``drops``."""
        try:
            packet = ipv4.parse(data, verify=self.verify)
            if packet.dst != self.address:
                raise ipv4.PacketError("not addressed to us")
            proto = packet.protocol
            if proto == ipv4.PROTO_TCP:
                self._tcp(tcpwire.parse(packet, verify=self.verify), now)
            elif proto == ipv4.PROTO_UDP:
                self._udp(udp.parse(packet, verify=self.verify))
            elif proto == ipv4.PROTO_ICMP:
                reply = icmp.echo_reply(packet)
                if reply is not None:
                    self.out.append(reply)
            else:
                raise ipv4.PacketError("protocol not supported")
        except ipv4.PacketError as err:
            self.drops[str(err)] += 1
        self.counters["packets_in"] += 1

    def _tcp(self, seg: tcpwire.Segment, now: float) -> None:
        events = self.events
        if events.closed:  # closed by their users since: their addresses are free
            self._settle()
        conn = self.conns.get((seg.src, seg.sport, seg.dport))
        if conn is not None:
            conn.segment_arrived(seg, now)
            if events.established or events.closed:  # (Events.changed(), inline: once per packet)
                self._settle()
            self._schedule(conn)
            return
        flags = seg.flags
        listener = self.listeners.get(seg.dport)
        if listener is not None and flags & (tcpwire.SYN | tcpwire.ACK | tcpwire.RST) == tcpwire.SYN:
            if listener.half_open >= listener.backlog:
                self.drops["listener backlog full"] += 1
                return
            conn = self._new(seg.src, seg.sport, seg.dport, now)
            conn.passive_port = seg.dport
            listener.half_open += 1
            conn.open_passive(seg, now)
            self._schedule(conn)  # (a SYN-ACK sent: nothing for _settle)
            return
        if not flags & tcpwire.RST:  # RFC 9293 §3.10.7.1: answer with a reset
            self.counters["resets_sent"] += 1
            builder = tcpwire.Builder(self.address, seg.dport, seg.src, seg.sport)
            if flags & tcpwire.ACK:
                self.out.append(builder.build(seg.ack, 0, tcpwire.RST, 0))
            else:
                seglen = len(seg.payload) + (1 if flags & tcpwire.SYN else 0) + (1 if flags & tcpwire.FIN else 0)
                self.out.append(builder.build(0, seg.seq + seglen, tcpwire.RST | tcpwire.ACK, 0))

    def _udp(self, dgram: udp.Datagram) -> None:
        port = self.udp_ports.get(dgram.dst_port)
        if port is None:
            self.drops["UDP port not bound"] += 1
            return
        if len(port.queue) >= UDP_QUEUE:
            port.dropped += 1
            return
        port.queue.append(dgram)
        self.udp_ready[port] = None

    # ------------------------------------------------------------------ TCP API

    def tcp_connect(self, dst, dport: int, now: float, *, sport: int | None = None) -> Connection:
        """Start an active open to ``dst:dport`` (SYN goes out with the next flush)."""
        dst = _ip(dst)
        if not 1 <= dport <= 65535:
            raise StackError("port must be from 1 to 65535")
        if self.events.closed:
            self._settle()
        sport = sport or self._ephemeral(dst, dport)
        if (dst, dport, sport) in self.conns:
            raise StackError(f"local port {sport} is in use towards that destination")
        conn = self._new(dst, dport, sport, now)
        conn.open_active(now)
        self._schedule(conn)
        return conn

    def tcp_listen(self, port: int, *, backlog: int = 128) -> None:
        if port in self.listeners:
            raise StackError(f"port {port} is already listening")
        self.listeners[port] = Listener(port, backlog)

    def tcp_unlisten(self, port: int) -> None:
        self.listeners.pop(port, None)

    def _ephemeral(self, dst: bytes, dport: int) -> int:
        lo, hi = EPHEMERAL
        start = int.from_bytes(self._random(2), "big")
        span = hi - lo + 1
        for i in range(span):
            port = lo + (start + i) % span
            if (dst, dport, port) not in self.conns and port not in self.listeners:
                return port
        raise StackError("no free local port towards that destination")

    def _new(self, remote: bytes, rport: int, lport: int, now: float) -> Connection:
        digest = hashlib.blake2s(remote + rport.to_bytes(2, "big") + lport.to_bytes(2, "big"), key=self._isn_key,
                                 digest_size=4).digest()
        iss = (int.from_bytes(digest, "big") + int(now * ISN_TICK)) & 0xFFFFFFFF  # RFC 6528
        builder = tcpwire.Builder(self.address, lport, remote, rport)
        conn = Connection(self.events, self.budget, (remote, rport, lport), builder, self.params, self.mss, iss, now)
        self.conns[conn.key] = conn
        return conn

    def _settle(self) -> None:
        """Act on the handshakes completed and the connections closed that ``events`` reports
        (all handshakes first: a connection can complete and close within one call)."""
        events = self.events
        while events.established or events.closed:
            if events.established:
                opened, events.established = events.established, []
                for conn in opened:
                    self._established(conn)
            if events.closed:
                ended, events.closed = events.closed, []
                for conn in ended:
                    self._closed(conn)

    def _established(self, conn: Connection) -> None:
        if conn.passive_port is not None:
            listener = self.listeners.get(conn.passive_port)
            if listener is not None:
                listener.half_open -= 1
                self.accepted.append((conn.passive_port, conn))
            else:  # the listener went away during the handshake
                conn.abort()

    def _closed(self, conn: Connection) -> None:
        if self.conns.get(conn.key) is conn:
            del self.conns[conn.key]
            if conn.passive_port is not None and not conn.connected:
                listener = self.listeners.get(conn.passive_port)
                if listener is not None:
                    listener.half_open -= 1

    # ------------------------------------------------------------------ UDP API

    def udp_bind(self, port: int = 0) -> UdpPort:
        if port == 0:
            lo, hi = EPHEMERAL
            start = int.from_bytes(self._random(2), "big")
            for i in range(hi - lo + 1):
                candidate = lo + (start + i) % (hi - lo + 1)
                if candidate not in self.udp_ports:
                    port = candidate
                    break
            else:
                raise StackError("no free UDP port")
        if port in self.udp_ports:
            raise StackError(f"UDP port {port} is in use")
        bound = self.udp_ports[port] = UdpPort(port)
        return bound

    def udp_unbind(self, port: UdpPort) -> None:
        if self.udp_ports.get(port.port) is port:
            del self.udp_ports[port.port]

    def udp_send(self, port: UdpPort, dst, dport: int, data: bytes) -> None:
        if len(data) > self.mtu - ipv4.HEADER_LEN - 8:
            raise StackError(f"datagram of {len(data)} bytes does not fit the MTU of {self.mtu}")
        self.out.append(udp.build(self.address, port.port, _ip(dst), dport, data))

    # ------------------------------------------------------------------ driving

    def flush(self, now: float) -> None:
        """Let connections with new data, freed window or a due ACK send."""
        events = self.events
        if events.changed():
            self._settle()
        while events.pending:
            pending, events.pending = events.pending, {}
            for conn in pending:
                if conn.state != CLOSED:
                    conn.output(now)
                    self._schedule(conn)

    def poll(self, now: float) -> None:
        """Run timers that are due."""
        heap = self._heap
        while heap and heap[0][0] <= now:
            when, _, conn = heapq.heappop(heap)
            if conn._sched != when:
                continue  # superseded
            conn._sched = None
            if conn.state != CLOSED:
                conn.on_timer(now)
                if self.events.changed():
                    self._settle()
                self._schedule(conn, floor=now + MIN_TIMER_STEP)
        self.flush(now)

    def _schedule(self, conn: Connection, floor: float | None = None) -> None:
        """Keep a heap entry at or before the connection's deadline (a later deadline keeps the
        earlier entry: the timer then finds nothing due and reschedules, which is cheaper than
        pushing on every ACK)."""
        when = conn.deadline()
        if when is None or conn.state == CLOSED:
            return
        if floor is not None and when < floor:
            when = floor
        if conn._sched is None or when < conn._sched:
            conn._sched = when
            self._heap_seq += 1
            heapq.heappush(self._heap, (when, self._heap_seq, conn))
            if len(self._heap) > 4 * len(self.conns) + 1024:
                self._heap = [e for e in self._heap if e[2]._sched == e[0]]
                heapq.heapify(self._heap)

    def next_deadline(self) -> float | None:
        heap = self._heap
        while heap and heap[0][2]._sched != heap[0][0]:
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def take_packets(self) -> list[bytes]:
        out = self.out
        if not out:
            return []
        taken = out[:]
        out.clear()  # connections hold this list: empty it in place
        return taken

    def take_dirty(self) -> list[Connection]:
        dirty = self.events.dirty
        if not dirty:
            return []
        taken = list(dirty)
        dirty.clear()
        return taken

    def flush_due(self) -> bool:
        """Packets wait to be taken or a connection has something to send: flush (again)."""
        return bool(self.out or self.events.pending)

    def take_accepted(self) -> list[tuple[int, Connection]]:
        accepted, self.accepted = self.accepted, []
        return accepted

    def take_udp_ready(self) -> list[UdpPort]:
        ready = list(self.udp_ready)
        self.udp_ready.clear()
        return ready
