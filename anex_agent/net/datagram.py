"""The datagram seam beside the :class:`~anex_agent.net.dialer.Dialer`: UDP for the workload, into the mesh.

A front-end that relays the workload's datagrams (the SOCKS5 proxy's UDP ASSOCIATE) asks a
:class:`DatagramDialer` for a :class:`DatagramSocket` and never learns which engine carries them:

* kernel WireGuard and wireguard-go engines use :class:`OSDatagramDialer`: the kernel's routes
  send mesh destinations through the WireGuard interface, so a kernel UDP socket is enough;
* the built-in user-space engine gives :class:`anex_agent.netstack.dialer.NetstackDatagramDialer`,
  whose datagrams to the tunnel's addresses travel in its TCP/IP stack (others through the OS);
* engines with front-ends of their own (wireproxy) give none.

Contract of :class:`DatagramSocket` (one unconnected UDP endpoint, any number of destinations):

* ``sendto(data, address, port)`` sends one datagram to ``address`` (an IP address, never a
  name: resolve first with the dialer's ``resolver``, the one its Dialer uses) without
  waiting; when the transport cannot take it now it is dropped and counted in ``dropped``
  (UDP promises nothing more); a destination it cannot reach at all raises ``OSError`` whose
  text is fit for a log line;
* every datagram received is handed to the ``on_datagram(data, (ip, port))`` callback given
  to :meth:`DatagramDialer.open_datagram`, in the event loop, as it arrives: nothing is queued
  by the socket beyond the transport's own bounded buffers (the kernel's, the stack's);
* ``close()`` releases everything; calling it twice is harmless; no callback follows it.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Protocol

from anex_agent.net.dialer import NameResolver

log = logging.getLogger(__name__)

DatagramHandler = Callable[[bytes, tuple[str, int]], None]

MAX_DATAGRAM = 65535  # bytes read at once: the largest UDP payload
READ_BATCH = 64  # datagrams read per readiness callback, so one busy socket cannot starve the loop


class DatagramSocket(Protocol):
    """An unconnected UDP endpoint into the mesh. See the module docstring for the contract."""

    dropped: int

    def sendto(self, data: bytes, address: str, port: int) -> None: ...

    def close(self) -> None: ...


class DatagramDialer(Protocol):
    """Opens :class:`DatagramSocket` objects; ``resolver`` resolves names for ``sendto``."""

    resolver: NameResolver

    def open_datagram(self, on_datagram: DatagramHandler) -> DatagramSocket:
        """A new socket whose received datagrams go to ``on_datagram``; call in the event loop."""
        ...


class OSDatagramSocket:
    """Kernel UDP sockets, one per address family, opened at the first datagram to that family."""

    def __init__(self, on_datagram: DatagramHandler) -> None:
        self._on_datagram = on_datagram
        self._loop = asyncio.get_running_loop()
        self._socks: dict[int, socket.socket] = {}
        self.closed = False
        #: datagrams not sent because the kernel's send buffer was full
        self.dropped = 0

    def sendto(self, data: bytes, address: str, port: int) -> None:
        if self.closed:
            raise OSError("the UDP socket is closed")
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        try:
            self._socket(family).sendto(data, (address, port))
        except (BlockingIOError, InterruptedError):
            self.dropped += 1

    def _socket(self, family: int) -> socket.socket:
        sock = self._socks.get(family)
        if sock is None:
            sock = socket.socket(family, socket.SOCK_DGRAM)
            sock.setblocking(False)
            self._socks[family] = sock
            self._loop.add_reader(sock.fileno(), self._readable, sock)
        return sock

    def _readable(self, sock: socket.socket) -> None:
        for _ in range(READ_BATCH):
            if self.closed:
                return
            try:
                data, source = sock.recvfrom(MAX_DATAGRAM)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # an ICMP error queued on the socket: nothing to deliver
                log.debug("UDP socket: %s", exc)
                continue
            self._on_datagram(data, (source[0], source[1]))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        for sock in self._socks.values():
            self._loop.remove_reader(sock.fileno())
            sock.close()
        self._socks.clear()


class OSDatagramDialer:
    """Kernel UDP sockets; for the kernel-WireGuard and wireguard-go engines (the routes do the work)."""

    def __init__(self, resolver: NameResolver | None = None) -> None:
        if resolver is None:
            from anex_agent.net.resolver import Resolver

            resolver = Resolver()
        self.resolver = resolver

    def open_datagram(self, on_datagram: DatagramHandler) -> OSDatagramSocket:
        return OSDatagramSocket(on_datagram)
