"""The UDP Bind: a UDP socket as the datagram path under the WireGuard core.

The Bind contract (and :class:`BindClosed`) lives in :mod:`anex_agent.tunnels.bind`;
both are re-exported here. Endpoints of :class:`UdpBind` are ``(ip, port)`` tuples with an
IP literal (resolve names before handing them in). A datagram that cannot be sent
(unreachable, buffer full) is dropped, as UDP would; WireGuard's timers recover.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Hashable

from anex_agent.errors import EngineError
from anex_agent.tunnels.bind import Bind, BindClosed, admit, next_datagram

__all__ = ["Bind", "BindClosed", "UdpBind", "RECEIVE_QUEUE"]

log = logging.getLogger(__name__)

#: Datagrams queued between the socket and the driver before we drop (like a full socket buffer).
RECEIVE_QUEUE = 4096


#: Datagrams read per readiness event: asyncio reads one; the rest of a burst is read here at once,
#: so the driver handles the burst in one task step and the stack above answers it with one flush.
READ_BATCH = 64


class _Protocol(asyncio.DatagramProtocol):
    def __init__(self, bind: UdpBind, sock: socket.socket | None = None) -> None:
        self.bind = bind
        self.sock = sock

    def datagram_received(self, data: bytes, addr) -> None:  # type: ignore[override]
        deliver = self.bind._deliver
        host = addr[0]
        if host.startswith("::ffff:") and "." in host:  # IPv4 on a dual-stack socket: report it as IPv4
            host = host[7:]
        deliver(data, (host, addr[1]))
        sock = self.sock
        if sock is None:
            return
        for _ in range(READ_BATCH - 1):
            try:
                data, addr = sock.recvfrom(65535)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                self.error_received(exc)
                return
            host = addr[0]
            if host.startswith("::ffff:") and "." in host:
                host = host[7:]
            deliver(data, (host, addr[1]))

    def error_received(self, exc: Exception) -> None:
        log.debug("udp bind: %s", exc)  # ICMP unreachable and friends: UDP semantics, drop

    def connection_lost(self, exc: Exception | None) -> None:
        self.bind._deliver(None, None)


class UdpBind:
    """A UDP socket as a Bind. Create with ``await UdpBind.open(port, host)``.

    It listens on ``host`` (default all IPv4 addresses: ``0.0.0.0``; ``"::"`` for dual
    stack) -- WireGuard is authenticated end to end, anyone may send to it, and anything
    not authenticated is dropped by the core.
    """

    def __init__(self, transport: asyncio.DatagramTransport, protocol: _Protocol) -> None:
        self._transport = transport
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self._closed = False
        self.dropped = 0
        sock = transport.get_extra_info("socket")
        self._v6 = sock is not None and sock.family == socket.AF_INET6
        sockname = transport.get_extra_info("sockname")
        self.local_port: int = sockname[1] if sockname else 0

    @classmethod
    async def open(cls, port: int | None = 0, host: str = "0.0.0.0") -> UdpBind:
        loop = asyncio.get_running_loop()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            sock.setblocking(False)
            for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
                try:
                    sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
                except OSError:
                    pass
            sock.bind((host, port or 0))
        except OSError as err:
            raise EngineError(f"cannot open UDP port {port or 0} on {host}: {err.strerror or err}") from None
        protocol = _Protocol(None, sock)  # type: ignore[arg-type]
        transport, _ = await loop.create_datagram_endpoint(lambda: protocol, sock=sock)
        bind = cls(transport, protocol)  # type: ignore[arg-type]
        protocol.bind = bind
        return bind

    def _deliver(self, data: bytes | None, addr: Hashable | None) -> None:
        if data is None:
            self._closed = True
            try:
                self._queue.put_nowait(None)
            except asyncio.QueueFull:
                pass
            return
        if not admit(self._queue, (data, addr)):
            self.dropped += 1

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        if self._closed:
            return
        if self._v6 and isinstance(endpoint, tuple) and "." in str(endpoint[0]):
            endpoint = ("::ffff:" + endpoint[0], endpoint[1])
        try:
            self._transport.sendto(datagram, endpoint)  # type: ignore[arg-type]
        except (OSError, ValueError, TypeError) as err:
            log.debug("udp bind: cannot send to %r: %s", endpoint, err)

    async def receive(self) -> tuple[bytes, Hashable]:
        return await next_datagram(self._queue, self._closed)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.close()
            try:
                self._queue.put_nowait(None)
            except asyncio.QueueFull:
                pass

