"""The Dialer seam: how the workload's traffic opens connections into the mesh.

Front-ends (the HTTP proxy, the ``GW_TUNNEL_<port>`` forwards) ask a :class:`Dialer`
for a :class:`Connection` to ``host:port`` and never learn which WireGuard engine is
underneath, as with httpcore's network backends and tailscale's ``tsdial``:

* kernel WireGuard and wireguard-go engines use :class:`OSDialer`: the kernel's
  routes send mesh destinations through the WireGuard interface, so a plain
  kernel socket is enough; names go through the :mod:`anex_agent.net.resolver`;
* an engine with a user-space TCP/IP stack provides a dialer whose connections live
  in that stack; such connections are stream-only (``socket`` is ``None``). Engines
  that serve the workload with front-ends of their own (wireproxy) give no dialer.

Every connection made *for the workload* goes through a Dialer. The agent's own
connections are system dials, made with the host's network stack and never through
the mesh: the coordinator client (:mod:`anex_agent.client.rest`, h11 and websockets), machine
selection's provider API clients (:mod:`anex_agent.providers.offers_http`), the
wireproxy supervisor's calls to its loopback health endpoint, and the UDP probe of
``anex-agent detect``. Resolving a gateway's endpoint name (:mod:`anex_agent.tunnels.engines.endpoints`)
uses the system resolver as well.

Contract of :class:`Connection` (what a dialer returns and what listeners wrap):

* ``await recv_into(buf)`` reads at most ``len(buf)`` bytes into ``buf`` and returns
  how many; ``0`` means the peer finished sending (EOF);
* ``await sendall(data)`` returns once all of ``data`` was handed to the transport;
* ``await shutdown_write()`` sends EOF (TCP FIN) and keeps the read side open
  (half-close); calling it twice is harmless;
* ``await aclose()`` releases everything; calling it twice is harmless;
* ``socket`` is the underlying kernel socket (non-blocking, owned by the connection)
  when there is one, so fast paths may use it directly (``os.splice``,
  ``loop.sock_recv_into``); ``None`` for stream-only connections.

Errors: :meth:`Dialer.open_connection` raises only subclasses of
:class:`anex_agent.errors.DialError` (``ResolveError``, ``DialRefused``,
``DialTimeout``, ``DialUnreachable``) whose ``reason`` is fit for a 502 body.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import ipaddress
import logging
import socket
from typing import Protocol, runtime_checkable

from anex_agent.errors import DialError, DialRefused, DialTimeout, DialUnreachable, ResolveError

log = logging.getLogger(__name__)

DEFAULT_CONNECT_TIMEOUT = 10.0  # seconds for one destination address; generous for 100 ms mesh links


class Connection(Protocol):
    """A bidirectional byte stream to one peer. See the module docstring for the contract."""

    socket: socket.socket | None

    async def recv_into(self, buf: memoryview | bytearray) -> int: ...

    async def sendall(self, data: bytes | bytearray | memoryview) -> None: ...

    async def shutdown_write(self) -> None: ...

    async def aclose(self) -> None: ...


@runtime_checkable
class Dialer(Protocol):
    """Opens outbound TCP connections. Implementations: :class:`OSDialer` (more to come)."""

    async def open_connection(self, host: str, port: int) -> Connection:
        """Connect to ``host:port`` (name or IP literal); raise a ``DialError`` subclass on failure."""
        ...


class NameResolver(Protocol):
    """What :class:`OSDialer` needs from a resolver (see :class:`anex_agent.net.resolver.Resolver`)."""

    async def resolve(self, host: str) -> list[str]:
        """Addresses (IP strings, preferred first) for ``host``; raise ``ResolveError``."""
        ...


class SocketConnection:
    """A :class:`Connection` over a connected, non-blocking kernel TCP socket.

    Takes ownership of ``sock``: :meth:`aclose` closes it.
    """

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.socket: socket.socket | None = sock
        self._sock = sock
        self._loop = asyncio.get_running_loop()
        self._write_shut = False
        self._closed = False

    def __repr__(self) -> str:
        try:
            peer = self._sock.getpeername()
        except OSError:
            peer = "?"
        return f"<SocketConnection fd={self._sock.fileno()} peer={peer}>"

    async def recv_into(self, buf: memoryview | bytearray) -> int:
        return await self._loop.sock_recv_into(self._sock, buf)

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        await self._loop.sock_sendall(self._sock, data)

    async def shutdown_write(self) -> None:
        if self._write_shut or self._closed:
            return
        self._write_shut = True
        with contextlib.suppress(OSError):  # peer already gone: nothing to tell it
            self._sock.shutdown(socket.SHUT_WR)

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._sock.close()


class StreamConnection:
    """A stream-only :class:`Connection` over an asyncio ``StreamReader``/``StreamWriter`` pair.

    For transports without a kernel socket (a userspace netstack, TLS) and for tests.
    """

    socket: socket.socket | None = None

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer
        self._write_shut = False
        self._closed = False

    async def recv_into(self, buf: memoryview | bytearray) -> int:
        data = await self._reader.read(len(buf))
        n = len(data)
        buf[:n] = data
        return n

    async def sendall(self, data: bytes | bytearray | memoryview) -> None:
        self._writer.write(bytes(data))
        await self._writer.drain()

    async def shutdown_write(self) -> None:
        if self._write_shut or self._closed:
            return
        self._write_shut = True
        if self._writer.can_write_eof():
            with contextlib.suppress(OSError, RuntimeError):
                self._writer.write_eof()

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


def _is_ip_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def reason_for_oserror(exc: OSError) -> str:
    """A short human sentence for a connect() failure (never the library's text)."""
    if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
        return "connection refused (nothing listens on that port)"
    if exc.errno == errno.ENETUNREACH:
        return "network unreachable (no route to that network; is the mesh up?)"
    if exc.errno == errno.EHOSTUNREACH:
        return "host unreachable"
    if exc.errno == errno.ETIMEDOUT:
        return "connection timed out"
    if exc.errno == errno.ECONNRESET:
        return "connection reset by the destination"
    name = errno.errorcode.get(exc.errno or 0, "unknown error")
    return f"connect failed ({name})"


def _dial_error(host: str, port: int, exc: OSError) -> DialError:
    reason = reason_for_oserror(exc)
    if isinstance(exc, ConnectionRefusedError) or exc.errno == errno.ECONNREFUSED:
        return DialRefused(host, port, reason)
    if exc.errno in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return DialUnreachable(host, port, reason)
    if exc.errno == errno.ETIMEDOUT:
        return DialTimeout(host, port, reason)
    return DialError(host, port, reason)


class OSDialer:
    """Dials with kernel sockets; for the kernel-WireGuard and wireguard-go engines.

    Names are resolved through ``resolver`` (cluster names over the mesh DNS, others
    as configured); IP literals are used as they are. Each resolved address is tried
    in order with ``connect_timeout`` seconds each; the last failure is raised.
    Connections get ``TCP_NODELAY`` (the proxy writes whole messages).
    """

    def __init__(self, resolver: NameResolver | None = None, *, connect_timeout: float = DEFAULT_CONNECT_TIMEOUT) -> None:
        if resolver is None:
            from anex_agent.net.resolver import Resolver

            resolver = Resolver()
        self.resolver = resolver
        self.connect_timeout = connect_timeout

    async def open_connection(self, host: str, port: int) -> SocketConnection:
        if not 1 <= port <= 65535:
            raise DialError(host, port, "port must be from 1 to 65535")
        if _is_ip_literal(host):
            addresses = [host]
        else:
            try:
                addresses = await self.resolver.resolve(host)
            except ResolveError as err:
                raise ResolveError(host, port, err.reason) from None
        last: DialError | None = None
        for i, address in enumerate(addresses):
            try:
                return await self._connect(address, port)
            except DialError as err:
                # re-raise under the name the caller asked for, keeping the kind of failure
                reason = err.reason if address == host else f"{err.reason} (tried {address})"
                last = type(err)(host, port, reason, tried=tuple(addresses[: i + 1]))
                log.debug("dial %s:%d via %s failed: %s", host, port, address, err.reason)
        assert last is not None, "resolver returned no address"
        raise last

    async def _connect(self, address: str, port: int) -> SocketConnection:
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            loop = asyncio.get_running_loop()
            try:
                async with asyncio.timeout(self.connect_timeout):
                    await loop.sock_connect(sock, (address, port))
            except TimeoutError:
                raise DialTimeout(address, port, f"no answer within {self.connect_timeout:g} s") from None
            except OSError as exc:
                raise _dial_error(address, port, exc) from None
        except BaseException:
            sock.close()
            raise
        return SocketConnection(sock)


class RouteChanges:
    """Says when the node's routes moved (a network now goes through another gateway), so that
    connection attempts in flight can start again (:class:`RedialDialer`)."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.moves = 0

    def moved(self) -> None:
        """The routes moved: every attempt waiting on :meth:`current` starts again."""
        self.moves += 1
        self._event.set()
        self._event = asyncio.Event()

    def current(self) -> asyncio.Event:
        """Set when the routes move next."""
        return self._event


class RedialDialer:
    """A :class:`Dialer` around another whose connection attempts start again when the routes move.

    A SYN that went to a gateway that died is lost; the TCP stack (the kernel's or the
    built-in one) sends it again only after its retransmission timeout: 1 s, then 3 s and 7 s
    after the first (RFC 6298 §2.1/§5.5: initial RTO 1 s, doubling). When the node moved its
    routes to another gateway meanwhile (:class:`RouteChanges`), the attempt is given up and a
    new one starts at once, through the gateway that answers, at most :attr:`restarts` times.
    Nothing was sent to the destination yet (the connection was not open), so nothing is
    repeated. Errors are those of the inner dialer."""

    def __init__(self, inner: Dialer, changes: RouteChanges, *, restarts: int = 3) -> None:
        self.inner = inner
        self.changes = changes
        self.restarts = restarts

    async def open_connection(self, host: str, port: int) -> Connection:
        for _ in range(self.restarts):
            moved = self.changes.current()
            async with asyncio.TaskGroup() as group:
                attempt = group.create_task(self._attempt(host, port), name=f"dial-{host}:{port}")
                waiter = group.create_task(moved.wait(), name=f"dial-{host}:{port}-routes")
                await asyncio.wait({attempt, waiter}, return_when=asyncio.FIRST_COMPLETED)
                if attempt.done():
                    waiter.cancel()
                else:
                    attempt.cancel()
            if attempt.cancelled():
                log.debug("dial %s:%d: the routes moved; starting again", host, port)
                continue
            result = attempt.result()
            if isinstance(result, DialError):
                raise result
            return result
        return await self.inner.open_connection(host, port)

    async def _attempt(self, host: str, port: int) -> Connection | DialError:
        """One attempt; its DialError is returned, not raised (the task group is there for
        cancellation only, and would wrap it in an ExceptionGroup)."""
        try:
            return await self.inner.open_connection(host, port)
        except DialError as err:
            return err
