"""WireGuard over a WebSocket relay: the client side of :mod:`anex_agent.relay_protocol`.

* :class:`RelayClient` -- one connection to one gateway's relay. :meth:`RelayClient.run`
  connects, authenticates (proof made with the node's WireGuard key) and pumps datagrams;
  after any failure (refused, reset, ping timeout, relay restarted) it reconnects with
  backoff and jitter, forever, until :meth:`close`. There is no idle timeout: ping/pong keeps
  a quiet connection open through NATs and proxies. Datagrams sent while it is not connected
  are dropped, as UDP would; WireGuard's timers recover. The engine and the workload never
  notice a reconnect.
* :class:`WebSocketBind` -- a :class:`~anex_agent.tunnels.bind.Bind` over relay clients, one per
  gateway endpoint: the datagram transport of the built-in userspace engine, with no local
  UDP hop (``UserspaceEngine(bind_factory=...)``).
* :class:`LocalRelay` -- for the native engines (kernel, wireguard-go), which own their UDP
  socket: a UDP socket on 127.0.0.1 that the WireGuard peer's endpoint points at; what the
  engine sends there goes to the relay, what the relay sends comes back from there.

Egress proxies: :func:`proxy_for` picks ``HTTPS_PROXY``/``HTTP_PROXY`` for the relay URL unless
``NO_PROXY`` excludes it, from an environment mapping read at the edge; the connection then
goes through the proxy with HTTP CONNECT.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.asyncio.connection import Connection
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidURI
from websockets.protocol import State

from anex_agent import relay_protocol as rp
from anex_agent.agent.backoff import Backoff
from anex_agent.tunnels.bind import BindClosed

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

#: Bytes waiting to be written on a relay connection before datagrams are dropped (a full socket buffer).
WRITE_LIMIT = 1 << 20
RECEIVE_QUEUE = 4096
#: Datagrams kept while the connection is (re)opening, sent once it is up.
BACKLOG_DISCONNECTED = 16
CONNECT_TIMEOUT = 10.0
PING_INTERVAL = 15.0
PING_TIMEOUT = 15.0


def send_now(ws: Connection, datagram: bytes, limit: int = WRITE_LIMIT) -> bool:
    """Write one datagram as one binary message at once, from a callback: no task switch, no wait.

    False (the datagram is dropped, as UDP would) when the connection is not open or more
    than ``limit`` bytes already wait to be written. The relay's hot path on both ends:
    going through ``await ws.send()`` costs a queue and a task switch per datagram."""
    transport = ws.transport
    if ws.protocol.state is not State.OPEN or transport.get_write_buffer_size() > limit:
        return False
    ws.protocol.send_binary(datagram)
    ws.send_data()
    return True


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The HTTP proxy for ``url`` per ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` (either case), or None.

    ``wss://`` uses ``HTTPS_PROXY``, ``ws://`` ``HTTP_PROXY`` (each falling back to the other
    as curl does not; we do not: a proxy for one scheme is not assumed for the other).
    ``NO_PROXY``: comma-separated host names, domain suffixes (``.corp`` or ``corp``), IP
    literals, or ``*``.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()

    def get(name: str) -> str:
        return environ.get(name.lower()) or environ.get(name.upper()) or ""

    proxy = get("https_proxy" if parts.scheme == "wss" else "http_proxy").strip()
    if not proxy:
        return None
    for entry in (e.strip().lower() for e in get("no_proxy").split(",")):
        if not entry:
            continue
        if entry == "*":
            return None
        entry = entry.split(":")[0] if entry.count(":") == 1 else entry
        bare = entry.lstrip(".")
        if host == bare or host.endswith("." + bare):
            return None
    return proxy if "://" in proxy else f"http://{proxy}"


@dataclass(frozen=True)
class RelayTarget:
    """Where one gateway's relay is and how to reach it."""

    url: str                              # ws:// or wss://
    gateway_public_key: bytes             # the proof is made against it
    proxy: str | None = None              # http://HOST:PORT for CONNECT, or None
    ssl_context: ssl.SSLContext | None = field(default=None, compare=False)  # wss://: None = system CAs


class RelayClient:
    """One relay connection, kept up by :meth:`run` until :meth:`close`. ``on_datagram(bytes)`` gets what arrives."""

    def __init__(self, target: RelayTarget, *, private_key: bytes, public_key: str,
                 on_datagram: Callable[[bytes], None], backoff: Backoff | None = None,
                 connect_timeout: float = CONNECT_TIMEOUT, ping_interval: float = PING_INTERVAL,
                 ping_timeout: float = PING_TIMEOUT) -> None:
        self.target = target
        self._private = private_key
        self.public_key = public_key
        self.on_datagram = on_datagram
        self.backoff = backoff or Backoff(base=0.25, cap=10.0)
        self.connect_timeout = connect_timeout
        self.ping_interval, self.ping_timeout = ping_interval, ping_timeout
        self.counters: collections.Counter[str] = collections.Counter()
        self.last_error: str | None = None
        self.connected_since: float | None = None
        self._backlog: collections.deque[bytes] = collections.deque(maxlen=BACKLOG_DISCONNECTED)
        self._ws: ClientConnection | None = None
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def send(self, datagram: bytes) -> None:
        """Send one datagram to the relay now; dropped when the write buffer is full. While
        (re)connecting the last :data:`BACKLOG_DISCONNECTED` wait (the handshake initiation
        that opened the path) and go out once connected."""
        ws = self._ws
        if ws is None:
            if not self._closed.is_set():
                self._backlog.append(datagram)
            return
        if send_now(ws, datagram):
            self.counters["sent"] += 1
        else:
            self.counters["dropped_full"] += 1

    def close(self) -> None:
        self._closed.set()
        ws = self._ws
        if ws is not None:
            ws.transport.abort()

    async def run(self) -> None:
        """Connect and relay; reconnect after any failure with backoff and jitter; return after close()."""
        while not self._closed.is_set():
            try:
                await self._session()
                reason = "closed by the relay"
            except (OSError, ConnectionClosed, InvalidHandshake, InvalidURI, rp.RelayProtocolError,
                    asyncio.TimeoutError, ssl.SSLError) as err:
                reason = _describe(err)
            self._ws = None
            self.connected_since = None
            if self._closed.is_set():
                return
            self.last_error = reason
            delay = self.backoff.next_delay()
            log.warning("WebSocket relay %s: %s; reconnecting in %.1f s", self.target.url, reason, delay)
            try:
                await asyncio.wait_for(self._closed.wait(), delay)
            except asyncio.TimeoutError:
                pass

    async def _session(self) -> None:
        target = self.target
        kwargs: dict[str, Any] = {}
        if target.url.startswith("wss://"):
            kwargs["ssl"] = target.ssl_context or ssl.create_default_context()
        async with asyncio.timeout(self.connect_timeout):
            ws = await connect(target.url, subprotocols=[rp.SUBPROTOCOL], proxy=target.proxy,
                               open_timeout=self.connect_timeout, ping_interval=self.ping_interval,
                               ping_timeout=self.ping_timeout, max_size=rp.MAX_DATAGRAM, max_queue=64,
                               compression=None, user_agent_header="anex-agent", close_timeout=2, **kwargs)
        try:
            async with asyncio.timeout(self.connect_timeout):
                challenge = rp.parse_challenge(await ws.recv())
                await ws.send(rp.answer_message(private_key=self._private, public_key=self.public_key,
                                                gateway_public=target.gateway_public_key, challenge=challenge))
                rp.parse_ok(await ws.recv())
            self._ws = ws
            self.connected_since = time.time()
            self.counters["connects"] += 1
            self.backoff.reset()
            log.info("WebSocket relay %s: connected%s", target.url, f" through proxy {target.proxy}" if target.proxy else "")
            while self._backlog:
                self.send(self._backlog.popleft())
            await self._reader(ws)
        finally:
            self._ws = None
            ws.transport.abort()

    async def _reader(self, ws: ClientConnection) -> None:
        deliver = self.on_datagram
        async for message in ws:
            if isinstance(message, bytes):
                self.counters["received"] += 1
                deliver(message)
            else:
                raise rp.RelayProtocolError("a text message after authentication")

    def report(self) -> dict[str, Any]:
        return {"url": self.target.url, "connected": self.connected, "proxy": self.target.proxy,
                "last_error": self.last_error, **self.counters}


def _describe(err: BaseException) -> str:
    if isinstance(err, ConnectionClosed):
        rcvd = err.rcvd
        if rcvd is not None and rcvd.code == rp.CLOSE_UNAUTHENTICATED:
            return "the relay refused this node (not a peer of the gateway, or a wrong key)"
        return f"connection closed ({rcvd.code if rcvd else 'no close frame'})"
    if isinstance(err, asyncio.TimeoutError):
        return "timed out"
    return f"{type(err).__name__}: {err}"


async def check_relay(target: RelayTarget, *, private_key: bytes, public_key: str, timeout: float = CONNECT_TIMEOUT) -> tuple[bool, str]:
    """Connect once, authenticate, close: ``(True, how)`` when the relay accepted this node, else ``(False, why)``."""
    client = RelayClient(target, private_key=private_key, public_key=public_key, on_datagram=lambda _: None,
                         connect_timeout=timeout)
    started = time.monotonic()
    task = asyncio.get_running_loop().create_task(client.run(), name="relay-check")
    try:
        while time.monotonic() - started < timeout and not client.connected and client.last_error is None:
            await asyncio.sleep(0.02)
    finally:
        connected, error = client.connected, client.last_error
        client.close()
        await asyncio.gather(task, return_exceptions=True)
    if connected:
        via = f" through proxy {target.proxy}" if target.proxy else ""
        return True, f"the relay accepted this node{via} in {(time.monotonic() - started) * 1000:.0f} ms"
    return False, error or f"no answer within {timeout:g} s"


class WebSocketBind:
    """A Bind over relay clients, one per gateway endpoint: the userspace engine's transport, no UDP hop.

    ``targets`` maps each gateway's endpoint (as the engine's peer config names it:
    ``(ip, port)``) to its relay; datagrams to an endpoint without a relay are dropped.
    Received datagrams are reported as coming from that endpoint. Create with :meth:`open`.
    """

    local_port = 0

    def __init__(self, targets: Mapping[Hashable, RelayTarget], *, private_key: bytes, public_key: str) -> None:
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self.clients: dict[Hashable, RelayClient] = {}
        self.dropped = 0
        self._closed = False
        for endpoint, target in targets.items():
            self.clients[endpoint] = RelayClient(target, private_key=private_key, public_key=public_key,
                                                 on_datagram=self._deliverer(endpoint))

    @classmethod
    def open(cls, targets: Mapping[Hashable, RelayTarget], tasks: Tasks, *, private_key: bytes,
             public_key: str) -> WebSocketBind:
        bind = cls(targets, private_key=private_key, public_key=public_key)
        for index, client in enumerate(bind.clients.values()):
            tasks.spawn(f"ws-bind-{index}", client.run)
        return bind

    def _deliverer(self, endpoint: Hashable) -> Callable[[bytes], None]:
        def deliver(data: bytes) -> None:
            try:
                self._queue.put_nowait((data, endpoint))
            except asyncio.QueueFull:
                self.dropped += 1
        return deliver

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        client = self.clients.get(endpoint)
        if client is not None and not self._closed:
            client.send(datagram)

    async def receive(self) -> tuple[bytes, Hashable]:
        if self._closed and self._queue.empty():
            raise BindClosed()
        item = await self._queue.get()
        if item is None:
            raise BindClosed()
        return item

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self.clients.values():
            client.close()
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            pass


class _LocalSocket(asyncio.DatagramProtocol):
    def __init__(self, relay: LocalRelay) -> None:
        self.relay = relay

    def datagram_received(self, data: bytes, addr: Any) -> None:
        self.relay._from_engine(data, addr)

    def error_received(self, exc: Exception) -> None:
        log.debug("local relay socket: %s", exc)


class LocalRelay:
    """A UDP socket on 127.0.0.1 in front of a :class:`RelayClient`, for engines that own their UDP socket.

    Point the WireGuard peer's endpoint at :attr:`endpoint`; the engine's datagrams go to
    the relay, and the relay's come back from this socket to the engine's port (learned from
    what the engine sent). Create with ``await LocalRelay.open(target, ...)``, run
    :meth:`run` in a task, :meth:`close` when done.
    """

    def __init__(self, target: RelayTarget, *, private_key: bytes, public_key: str) -> None:
        self.client = RelayClient(target, private_key=private_key, public_key=public_key, on_datagram=self._to_engine)
        self._transport: asyncio.DatagramTransport | None = None
        self._engine_addr: Any = None
        self.port = 0

    @classmethod
    async def open(cls, target: RelayTarget, *, private_key: bytes, public_key: str) -> LocalRelay:
        relay = cls(target, private_key=private_key, public_key=public_key)
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(lambda: _LocalSocket(relay), local_addr=("127.0.0.1", 0))
        relay._transport = transport
        relay.port = transport.get_extra_info("sockname")[1]
        return relay

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _from_engine(self, data: bytes, addr: Any) -> None:
        self._engine_addr = addr
        self.client.send(data)

    def _to_engine(self, data: bytes) -> None:
        if self._engine_addr is not None and self._transport is not None:
            self._transport.sendto(data, self._engine_addr)

    async def run(self) -> None:
        await self.client.run()

    def close(self) -> None:
        self.client.close()
        if self._transport is not None:
            self._transport.close()
            self._transport = None
