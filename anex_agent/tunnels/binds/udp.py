"""The UDP Bind: a UDP socket as the datagram path under the WireGuard core.

The Bind contract (and :class:`BindClosed`) lives in :mod:`anex_agent.tunnels.binds.base`;
both are re-exported here. Endpoints of :class:`UdpBind` are ``(ip, port)`` tuples with an
IP literal (resolve names before handing them in). A datagram that cannot be sent
(unreachable, buffer full) is dropped, as UDP would; WireGuard's timers recover.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import socket
import sys
from collections.abc import Hashable

from anex_agent.errors import EngineError
from anex_agent.tunnels.binds.base import Bind, BindClosed, Receiver, admit, next_datagram

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

# Linux UDP segmentation offload (linux/udp.h; Python 3.11's socket module lacks the names).
# Sending, one sendmsg with a UDP_SEGMENT control message carries a run of datagrams of one
# size to one destination (the last may be shorter) and the kernel cuts it: one trip through
# the stack for up to GSO_MAX_SEGMENTS datagrams instead of one each. Receiving, UDP_GRO lets
# the kernel hand over such a run (coalesced) in one read, with the size in a control message.
UDP_SEGMENT = 103
UDP_GRO = 104
GSO_MAX_SEGMENTS = 64
GSO_MAX_BYTES = 65000  # the UDP length field bounds a run (65,507 bytes of payload over IPv4)
_GRO_CMSG_SPACE = socket.CMSG_SPACE(4)
_GSO_FAILED = (errno.EIO, errno.EINVAL, errno.ENOPROTOOPT, errno.EOPNOTSUPP)


class UdpBind:
    """A UDP socket as a Bind. Create with ``await UdpBind.open(port, host)``.

    It listens on ``host`` (default all IPv4 addresses: ``0.0.0.0``; ``"::"`` for dual
    stack) -- WireGuard is authenticated end to end, anyone may send to it, and anything
    not authenticated is dropped by the core.

    The socket is read by the event loop's reader callback, :data:`READ_BATCH` reads per
    readiness event, and written with plain ``sendto`` calls (a full socket buffer drops the
    datagram, as UDP does). Both batch methods of the Bind contract are here:
    :meth:`set_receiver` (no queue, no task step per datagram) and :meth:`send_batch`, which
    sends runs of equal-sized datagrams to one endpoint with UDP segmentation offload where
    the kernel has it (``gso``; off for good after the first refusal). ``gro``: the kernel may
    coalesce received runs, which are cut back into datagrams here.
    """

    def __init__(self, sock: socket.socket, *, offload: bool = True) -> None:
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self._receiver: Receiver | None = None
        self._closed = False
        self.dropped = 0
        self.send_dropped = 0
        self._v6 = sock.family == socket.AF_INET6
        self.local_port: int = sock.getsockname()[1]
        self.gso = offload
        self.gro = False
        if offload:
            try:
                sock.setsockopt(socket.SOL_UDP, UDP_GRO, 1)
                self.gro = True
            except OSError:
                pass
        self._loop.add_reader(sock.fileno(), self._read_ready if not self.gro else self._read_ready_gro)

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
        if batch:
            self._hand_over(batch)

    def _read_ready_gro(self) -> None:
        """As :meth:`_read_ready`, with recvmsg: a coalesced run comes with its segment size."""
        batch: list[tuple[bytes, Hashable]] = []
        recvmsg = self._sock.recvmsg
        for _ in range(READ_BATCH):
            try:
                data, ancillary, _flags, addr = recvmsg(RECV_SIZE, _GRO_CMSG_SPACE)
            except (BlockingIOError, InterruptedError):
                break
            except OSError as exc:
                log.debug("udp bind: %s", exc)
                break
            size = 0
            for level, kind, value in ancillary:
                if level == socket.SOL_UDP and kind == UDP_GRO and len(value) >= 4:
                    size = int.from_bytes(value[:4], sys.byteorder)  # the kernel's int
            if 0 < size < len(data):
                batch += [(data[i:i + size], addr) for i in range(0, len(data), size)]
            else:
                batch.append((data, addr))
        if batch:
            self._hand_over(batch)

    def _hand_over(self, batch: list[tuple[bytes, Hashable]]) -> None:
        if self._v6:  # (host, port, flow, scope); IPv4 on a dual-stack socket is reported as IPv4
            batch = [(data, (_unmapped(addr[0]), addr[1])) for data, addr in batch]
        receiver = self._receiver
        if receiver is not None:
            try:
                receiver(batch)
            except Exception:  # the driver's bug must not stop reading the socket
                log.exception("udp bind: the receiver failed")
            return
        for item in batch:  # queued for receive(): handshake messages take only a share of the queue
            if not admit(self._queue, item):
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
        """:meth:`send` of each datagram, in order: runs of one size to one endpoint in one
        segmentation-offload send each where the kernel allows, else one ``sendto`` each."""
        if self._closed:
            return
        if self.gso and len(datagrams) > 1:
            self._send_runs(datagrams)
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

    def _send_runs(self, datagrams: list[tuple[bytes, Hashable]]) -> None:
        sock = self._sock
        i, n = 0, len(datagrams)
        while i < n:
            first, endpoint = datagrams[i]
            size = len(first)
            j, total = i + 1, size
            while j < n and j - i < GSO_MAX_SEGMENTS:
                data, to = datagrams[j]
                length = len(data)
                if to != endpoint or length > size or total + length > GSO_MAX_BYTES:
                    break
                total += length
                j += 1
                if length < size:  # a shorter datagram can only end a run
                    break
            if j - i == 1 or not self.gso:
                self.send(first, endpoint)
                i += 1
                continue
            try:
                sock.sendmsg([d for d, _ in datagrams[i:j]], [(socket.SOL_UDP, UDP_SEGMENT, _u16(size))], 0,
                             self._endpoint(endpoint))  # type: ignore[arg-type]
            except (BlockingIOError, InterruptedError):
                self.send_dropped += j - i
            except OSError as err:
                if err.errno in _GSO_FAILED:  # no segmentation offload on this path: plain sends from now on
                    log.debug("udp bind: segmentation offload refused (%s); sending datagram by datagram", err)
                    self.gso = False
                    for data, to in datagrams[i:j]:
                        self.send(data, to)
                else:
                    log.debug("udp bind: cannot send to %r: %s", endpoint, err)
            except (ValueError, TypeError) as err:
                log.debug("udp bind: cannot send to %r: %s", endpoint, err)
            i = j

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


def _u16(value: int) -> bytes:
    """A control message's u16 in the host's byte order."""
    return value.to_bytes(2, sys.byteorder)


def _unmapped(host: str) -> str:
    return host[7:] if host.startswith("::ffff:") and "." in host else host
