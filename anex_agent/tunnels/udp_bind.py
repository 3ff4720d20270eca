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
from anex_agent.tunnels.bind import Bind, BindClosed, Receiver, next_datagram

__all__ = ["Bind", "BindClosed", "UdpBind", "RECEIVE_QUEUE"]

log = logging.getLogger(__name__)

#: Datagrams queued between the socket and a reader of receive() before we drop (like a full socket buffer).
RECEIVE_QUEUE = 4096


#: Datagrams read per readiness event, then handed on as one batch (to the receiver, or the
#: queue), so the driver handles a burst in one step and the stack above answers it with one flush.
READ_BATCH = 64
#: Bytes asked of each recvfrom: any datagram fits. (asyncio's datagram transport asks 256 KiB,
#: an allocation that costs ten times the read itself on every readiness event.)
RECV_SIZE = 65535


class UdpBind:
    """A UDP socket as a Bind. Create with ``await UdpBind.open(port, host)``.

    It listens on ``host`` (default all IPv4 addresses: ``0.0.0.0``; ``"::"`` for dual
    stack) -- WireGuard is authenticated end to end, anyone may send to it, and anything
    not authenticated is dropped by the core.

    The socket is read by the event loop's reader callback, :data:`READ_BATCH` datagrams per
    readiness event, and written with plain ``sendto`` calls (a full socket buffer drops the
    datagram, as UDP does). Both batch methods of the Bind contract are here:
    :meth:`set_receiver` (no queue, no task step per datagram) and :meth:`send_batch`.
    """

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self._receiver: Receiver | None = None
        self._closed = False
        self.dropped = 0
        self.send_dropped = 0
        self._v6 = sock.family == socket.AF_INET6
        self.local_port: int = sock.getsockname()[1]
        self._loop.add_reader(sock.fileno(), self._read_ready)

    @classmethod
    async def open(cls, port: int | None = 0, host: str = "0.0.0.0") -> UdpBind:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = None
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
            if sock is not None:
                sock.close()
            raise EngineError(f"cannot open UDP port {port or 0} on {host}: {err.strerror or err}") from None
        return cls(sock)

    def _read_ready(self) -> None:
        batch: list[tuple[bytes, Hashable]] = []
        recvfrom = self._sock.recvfrom
        for _ in range(READ_BATCH):
            try:
                batch.append(recvfrom(RECV_SIZE))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:  # ICMP unreachable and friends: UDP semantics, drop
                log.debug("udp bind: %s", exc)
                break
        if not batch:
            return
        if self._v6:  # (host, port, flow, scope); IPv4 on a dual-stack socket is reported as IPv4
            batch = [(data, (_unmapped(addr[0]), addr[1])) for data, addr in batch]
        receiver = self._receiver
        if receiver is not None:
            try:
                receiver(batch)
            except Exception:  # the driver's bug must not stop reading the socket
                log.exception("udp bind: the receiver failed")
            return
        put = self._queue.put_nowait
        for item in batch:
            try:
                put(item)
            except asyncio.QueueFull:
                self.dropped += 1

    def set_receiver(self, receiver: Receiver | None) -> None:
        """Hand every batch read to ``receiver(batch)`` from now on (None: queue for receive() again)."""
        self._receiver = receiver

    def _endpoint(self, endpoint: Hashable) -> Hashable:
        if self._v6 and isinstance(endpoint, tuple) and "." in str(endpoint[0]):
            return ("::ffff:" + endpoint[0], endpoint[1])
        return endpoint

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        if self._closed:
            return
        try:
            self._sock.sendto(datagram, self._endpoint(endpoint))  # type: ignore[arg-type]
        except (BlockingIOError, InterruptedError):
            self.send_dropped += 1  # the socket buffer is full: dropped, as UDP would
        except (OSError, ValueError, TypeError) as err:
            log.debug("udp bind: cannot send to %r: %s", endpoint, err)

    def send_batch(self, datagrams: list[tuple[bytes, Hashable]]) -> None:
        """:meth:`send` of each datagram, in order, without a method call each."""
        if self._closed:
            return
        if self._v6:
            for datagram, endpoint in datagrams:
                self.send(datagram, endpoint)
            return
        sendto = self._sock.sendto
        for datagram, endpoint in datagrams:
            try:
                sendto(datagram, endpoint)  # type: ignore[arg-type]
            except (BlockingIOError, InterruptedError):
                self.send_dropped += 1
            except (OSError, ValueError, TypeError) as err:
                log.debug("udp bind: cannot send to %r: %s", endpoint, err)

    async def receive(self) -> tuple[bytes, Hashable]:
        return await next_datagram(self._queue, self._closed)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._loop.remove_reader(self._sock.fileno())
            self._sock.close()
            try:
                self._queue.put_nowait(None)
            except asyncio.QueueFull:
                pass


def _unmapped(host: str) -> str:
    return host[7:] if host.startswith("::ffff:") and "." in host else host
