"""The netstack dialer: :class:`anex_agent.net.dialer.Dialer` over the user-space stack.

Destinations the tunnel carries (an address inside some peer's allowed IPs, e.g. the
cluster's service and pod networks) are dialled through the netstack; every other
destination goes through the OS (:class:`anex_agent.net.dialer.OSDialer`), as the kernel's
routes would send it with the kernel and wireguard-go engines. Names are resolved with
the resolver the data plane gives (cluster names through the mesh DNS, whose UDP the
netstack carries: :class:`NetstackDnsTransport`).

:class:`NetstackDatagramDialer` is the same split for the workload's datagrams
(:class:`anex_agent.net.datagram.DatagramDialer`): the tunnel's destinations through a UDP
port of the stack, the others through a kernel UDP socket.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from collections.abc import Callable

from anex_agent.net.datagram import DatagramHandler, OSDatagramSocket
from anex_agent.net.dialer import DEFAULT_CONNECT_TIMEOUT, NameResolver, OSDialer
from anex_agent.errors import DialError, DialRefused, DialTimeout, DialUnreachable, ResolveError
from anex_agent.netstack.aio import NetstackRuntime, TcpStream, UdpSocket
from anex_agent.netstack.stack import StackError

log = logging.getLogger(__name__)

RuntimeGetter = Callable[[], "NetstackRuntime | None"]
Covers = Callable[[str], bool]


class NetstackDialer:
    """``runtime()`` is the engine's current runtime (None while the tunnel is down);
    ``covers(address)`` says whether the tunnel carries ``address``."""

    def __init__(self, runtime: RuntimeGetter, covers: Covers, resolver: NameResolver, *,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        self._runtime = runtime
        self._covers = covers
        self.resolver = resolver
        self.connect_timeout = connect_timeout
        self._os = OSDialer(resolver, connect_timeout=connect_timeout)

    async def open_connection(self, host: str, port: int):
        if not 1 <= port <= 65535:
            raise DialError(host, port, "port must be from 1 to 65535")
        try:
            literal = ipaddress.ip_address(host)
            addresses = [str(literal)]
        except ValueError:
            try:
                addresses = await self.resolver.resolve(host)
            except ResolveError as err:
                raise ResolveError(host, port, err.reason) from None
        last: DialError | None = None
        for i, address in enumerate(addresses):
            try:
                if self._covers(address):
                    return await self._connect(address, port)
                return await self._os.open_connection(address, port)
            except DialError as err:
                reason = err.reason if address == host else f"{err.reason} (tried {address})"
                last = type(err)(host, port, reason, tried=tuple(addresses[: i + 1]))
        assert last is not None, "resolver returned no address"
        raise last

    async def _connect(self, address: str, port: int) -> TcpStream:
        runtime = self._runtime()
        if runtime is None or runtime.closed:
            raise DialUnreachable(address, port, "the mesh is not up yet (no WireGuard session)")
        if ":" in address:
            raise DialUnreachable(address, port, "IPv6 destinations are not carried by the built-in stack")
        stream = runtime.open(address, port)
        try:
            async with asyncio.timeout(self.connect_timeout):
                await stream.connected()
        except TimeoutError:
            stream.abort()
            raise DialTimeout(address, port, f"no answer within {self.connect_timeout:g} s") from None
        except ConnectionRefusedError:
            raise DialRefused(address, port, "connection refused (nothing listens on that port)") from None
        except OSError:
            raise DialError(address, port, "connection reset during the handshake") from None
        except BaseException:
            stream.abort()
            raise
        return stream


class NetstackDnsTransport:
    """DNS over the netstack's UDP, for :class:`anex_agent.net.resolver.Resolver` (``dns_transport``)."""

    def __init__(self, runtime: RuntimeGetter) -> None:
        self._runtime = runtime

    async def exchange(self, wire: bytes, address: str, port: int, timeout: float) -> bytes:
        """Send one query, return the first answer from ``address:port``; raise TimeoutError/OSError."""
        runtime = self._runtime()
        if runtime is None or runtime.closed:
            raise OSError("the mesh is not up yet")
        sock = runtime.udp_open()
        try:
            sock.sendto(wire, address, port)
            async with asyncio.timeout(timeout):
                while True:
                    data, source = await sock.recvfrom()
                    if source == (address, port) and data[:2] == wire[:2]:
                        return data
        finally:
            sock.close()


class NetstackDatagramSocket:
    """A :class:`anex_agent.net.datagram.DatagramSocket`: a UDP port of the stack for the tunnel's
    destinations (opened at the first datagram, again when the engine replaced its runtime), a
    kernel UDP socket for the others. Received datagrams of both go to ``on_datagram``."""

    def __init__(self, runtime: RuntimeGetter, covers: Covers, on_datagram: DatagramHandler) -> None:
        self._runtime = runtime
        self._covers = covers
        self._on_datagram = on_datagram
        self._os = OSDatagramSocket(on_datagram)
        self._stack_socket: UdpSocket | None = None
        self.closed = False

    @property
    def dropped(self) -> int:
        """Datagrams the kernel socket could not take (the stack queues what it sends)."""
        return self._os.dropped

    def sendto(self, data: bytes, address: str, port: int) -> None:
        if self.closed:
            raise OSError("the UDP socket is closed")
        if not self._covers(address):
            self._os.sendto(data, address, port)
            return
        if ":" in address:
            raise OSError("IPv6 destinations are not carried by the built-in stack")
        try:
            self._stack_udp().sendto(data, address, port)
        except StackError as err:  # no free stack port, or the send itself
            raise OSError(str(err)) from None

    def _stack_udp(self) -> UdpSocket:
        runtime = self._runtime()
        if runtime is None or runtime.closed:
            raise OSError("the mesh is not up yet (no WireGuard session)")
        sock = self._stack_socket
        if sock is None or sock.closed or sock.runtime is not runtime:
            if sock is not None:
                sock.close()
            sock = self._stack_socket = runtime.udp_open()
            sock.on_datagram = self._on_datagram
        return sock

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._os.close()
        if self._stack_socket is not None:
            self._stack_socket.close()
            self._stack_socket = None


class NetstackDatagramDialer:
    """:class:`anex_agent.net.datagram.DatagramDialer` over the stack; ``runtime`` and ``covers`` as
    for :class:`NetstackDialer`, ``resolver`` the one it uses."""

    def __init__(self, runtime: RuntimeGetter, covers: Covers, resolver: NameResolver) -> None:
        self._runtime = runtime
        self._covers = covers
        self.resolver = resolver

    def open_datagram(self, on_datagram: DatagramHandler) -> NetstackDatagramSocket:
        return NetstackDatagramSocket(self._runtime, self._covers, on_datagram)
