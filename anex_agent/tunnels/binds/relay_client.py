"""WireGuard over a WebSocket relay: the client side of :mod:`anex_agent.net.relay_protocol`.

* :class:`RelayClient` -- one connection to one gateway's relay. :meth:`RelayClient.run`
  connects, authenticates (proof made with the node's WireGuard key) and pumps datagrams;
  after any failure (refused, reset, ping timeout, relay restarted) it reconnects with
  backoff and jitter, forever, until :meth:`close`. There is no idle timeout: ping/pong keeps
  a quiet connection open through NATs and proxies. Datagrams sent while it is not connected
  are dropped, as UDP would; WireGuard's timers recover. The engine and the workload never
  notice a reconnect.
* :class:`WebSocketBind` -- a :class:`~anex_agent.tunnels.binds.base.Bind` over relay clients, one per
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
import socket
import ssl
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from functools import cache

from anex_agent.net import relay_protocol as rp
from anex_agent.backoff import Backoff
from anex_agent.tunnels.binds.base import BindClosed, admit, next_datagram

# websockets is imported where a relay connection is made or served: an agent on the UDP
# path (and the proxy_for users) never imports it.
if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection
    from websockets.asyncio.connection import Connection

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


#: Datagrams read from a UDP socket per wake-up of the event loop (then framed and written in one go).
READ_BATCH = 64


def send_batch(ws: Connection, datagrams: list[bytes], limit: int = WRITE_LIMIT) -> bool:
    """Frame ``datagrams`` and write them with one call, at once: one binary message each
    (``anex-wg.v1``), or as few as :func:`anex_agent.net.relay_protocol.pack` makes (``anex-wg.v2``).

    False (all dropped, as UDP would) when the connection is not open or more than ``limit``
    bytes already wait to be written."""
    from websockets.protocol import State

    transport = ws.transport
    protocol = ws.protocol
    if protocol.state is not State.OPEN or transport.get_write_buffer_size() > limit:
        return False
    for message in (rp.pack(datagrams) if ws.subprotocol == rp.SUBPROTOCOL_BATCH else datagrams):
        protocol.send_binary(message)
    chunks = protocol.data_to_send()
    if all(chunks):
        transport.writelines(chunks)
    else:  # an end-of-stream marker among them (the protocol is closing): the library's own path
        for chunk in chunks:
            if chunk:
                transport.write(chunk)
    return True


class UdpReader:
    """A non-blocking UDP socket read in batches: each wake-up reads up to :data:`READ_BATCH`
    datagrams and gives them to ``on_batch(list of (data, address))``. asyncio's datagram
    transport reads one datagram per turn of the event loop; this costs one turn per batch.
    Sending (:meth:`send`, :meth:`sendto`) never blocks: a full socket buffer drops, as UDP does."""

    def __init__(self, sock: socket.socket, on_batch: Callable[[list[tuple[bytes, Any]]], None]) -> None:
        self.sock = sock
        self.on_batch = on_batch
        self.dropped = 0
        sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._ready)

    def _ready(self) -> None:
        batch = []
        recvfrom = self.sock.recvfrom
        for _ in range(READ_BATCH):
            try:
                batch.append(recvfrom(65535))
            except (BlockingIOError, InterruptedError):
                break
            except OSError as err:  # ICMP errors on a connected socket (port unreachable): UDP semantics
                log.debug("udp reader: %s", err)
                break
        if batch:
            self.on_batch(batch)

    def send(self, data: bytes) -> None:
        try:
            self.sock.send(data)
        except OSError:
            self.dropped += 1

    def sendto(self, data: bytes, address: Any) -> None:
        try:
            self.sock.sendto(data, address)
        except OSError:
            self.dropped += 1

    def close(self) -> None:
        if self.sock.fileno() >= 0:
            self._loop.remove_reader(self.sock.fileno())
            self.sock.close()


def udp_socket(local: tuple[str, int] | None = None, remote: tuple[str, int] | None = None) -> socket.socket:
    """A UDP socket with large buffers, bound to ``local`` and/or connected to ``remote``."""
    host = (remote or local or ("127.0.0.1", 0))[0]
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
    for opt in (socket.SO_RCVBUF, socket.SO_SNDBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, opt, 4 << 20)
        except OSError:
            pass
    if local is not None:
        sock.bind(local)
    if remote is not None:
        sock.connect(remote)
    return sock


def datagram_sink(ws: Connection, deliver: Callable[[bytes], None], dropped: collections.Counter[str]) -> Callable[[bytes], None]:
    """What to call with each binary message of ``ws``: ``deliver`` itself (``anex-wg.v1``), or
    a function that gives ``deliver`` each datagram of a batched message (``anex-wg.v2``; a
    malformed message is dropped and counted as ``dropped["malformed"]``)."""
    if ws.subprotocol != rp.SUBPROTOCOL_BATCH:
        return deliver
    unpack = rp.unpack

    def each(message: bytes) -> None:
        try:
            datagrams = unpack(message)
        except rp.RelayProtocolError:
            dropped["malformed"] += 1
            return
        for datagram in datagrams:
            deliver(datagram)
    return each


class DirectBinary:
    """Connection mixin: once ``on_datagram`` is set, each complete binary message goes to it
    straight from the protocol's event, without the message queue and the ``recv()`` wake-up
    per datagram. Everything else (text, fragmented messages, close) still reaches ``recv()``."""

    on_datagram: Callable[[bytes], None] | None = None

    def process_event(self, event: Any) -> None:
        from websockets.frames import Opcode

        deliver = self.on_datagram
        if deliver is not None and event.opcode is Opcode.BINARY and event.fin:
            deliver(bytes(event.data))
            return
        super().process_event(event)  # type: ignore[misc]


@cache
def relay_client_connection() -> type:
    """The client connection class of the relay: binary messages delivered directly (:class:`DirectBinary`)."""
    from websockets.asyncio.client import ClientConnection

    class RelayClientConnection(DirectBinary, ClientConnection):
        pass

    return RelayClientConnection


def proxy_for(url: str, environ: Mapping[str, str]) -> str | None:
    """The HTTP proxy for ``url`` per ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` (either case), or None.

    ``wss://`` and ``https://`` use ``HTTPS_PROXY``, ``ws://`` and ``http://`` ``HTTP_PROXY``,
    with no fallback from one to the other (a proxy for one scheme is not assumed to serve the
    other). The agent uses it for the relay and for the coordinator.
    ``NO_PROXY``: comma-separated host names, domain suffixes (``.corp`` or ``corp``), IP
    literals, or ``*``.
    """
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()

    def get(name: str) -> str:
        return environ.get(name.lower()) or environ.get(name.upper()) or ""

    proxy = get("https_proxy" if parts.scheme in ("wss", "https") else "http_proxy").strip()
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
        self.subprotocol: str | None = None  # what the relay chose at the last connect
        self._backlog: collections.deque[bytes] = collections.deque(maxlen=BACKLOG_DISCONNECTED)
        self._ws: ClientConnection | None = None
        self._closed = asyncio.Event()

    @property
    def connected(self) -> bool:
        return self._ws is not None

    def send_many(self, datagrams: list[bytes]) -> None:
        """Send several datagrams to the relay now, framed and written in one go (see :meth:`send`)."""
        ws = self._ws
        if ws is None:
            if not self._closed.is_set():
                self._backlog.extend(datagrams)
            return
        if send_batch(ws, datagrams):
            self.counters["sent"] += len(datagrams)
        else:
            self.counters["dropped_full"] += len(datagrams)

    def send(self, datagram: bytes) -> None:
        """Send one datagram to the relay now; dropped when the write buffer is full. While
        (re)connecting the last :data:`BACKLOG_DISCONNECTED` wait (the handshake initiation
        that opened the path) and go out once connected."""
        ws = self._ws
        if ws is None:
            if not self._closed.is_set():
                self._backlog.append(datagram)
            return
        if send_batch(ws, [datagram]):
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
        from websockets.exceptions import WebSocketException

        while not self._closed.is_set():
            try:
                await self._session()
                reason = "closed by the relay"
            except (OSError, WebSocketException, rp.RelayProtocolError, asyncio.TimeoutError, ssl.SSLError) as err:
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
        from websockets.asyncio.client import connect

        target = self.target
        kwargs: dict[str, Any] = {}
        if target.url.startswith("wss://"):
            kwargs["ssl"] = target.ssl_context or ssl.create_default_context()
        async with asyncio.timeout(self.connect_timeout):
            ws = await connect(target.url, subprotocols=list(rp.SUBPROTOCOLS), proxy=target.proxy,
                               open_timeout=self.connect_timeout, ping_interval=self.ping_interval,
                               ping_timeout=self.ping_timeout, max_size=rp.MAX_MESSAGE, max_queue=64,
                               compression=None, user_agent_header="anex-agent", close_timeout=2,
                               create_connection=relay_client_connection(), **kwargs)
        try:
            async with asyncio.timeout(self.connect_timeout):
                challenge = rp.parse_challenge(await ws.recv())
                await ws.send(rp.answer_message(private_key=self._private, public_key=self.public_key,
                                                gateway_public=target.gateway_public_key, challenge=challenge))
                rp.parse_ok(await ws.recv())
            self._ws = ws
            self.subprotocol = ws.subprotocol
            self.connected_since = time.time()
            self.counters["connects"] += 1
            self.backoff.reset()
            log.info("WebSocket relay %s: connected (%s)%s", target.url, ws.subprotocol,
                     f" through proxy {target.proxy}" if target.proxy else "")
            while self._backlog:
                self.send(self._backlog.popleft())
            await self._reader(ws)
        finally:
            self._ws = None
            ws.transport.abort()

    async def _reader(self, ws: ClientConnection) -> None:
        deliver = datagram_sink(ws, self.on_datagram, self.counters)
        if isinstance(ws, DirectBinary):
            ws.on_datagram = deliver  # whole binary messages from now on skip recv()
        async for message in ws:  # fragmented binary messages, text, and the end of the connection
            if isinstance(message, bytes):
                deliver(message)
            else:
                raise rp.RelayProtocolError("a text message after authentication")

    def report(self) -> dict[str, Any]:
        return {"url": self.target.url, "connected": self.connected, "proxy": self.target.proxy,
                "subprotocol": self.subprotocol,
                "last_error": self.last_error, **self.counters}


def _describe(err: BaseException) -> str:
    from websockets.exceptions import ConnectionClosed

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
        return await next_datagram(self._queue, self._closed)

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


class LocalRelay:
    """A UDP socket on 127.0.0.1 in front of a :class:`RelayClient`, for engines that own their UDP socket.

    Point the WireGuard peer's endpoint at :attr:`endpoint`; the engine's datagrams go to
    the relay, and the relay's come back from this socket to the engine's port (learned from
    what the engine sent). Create with ``await LocalRelay.open(target, ...)``, run
    :meth:`run` in a task, :meth:`close` when done.
    """

    def __init__(self, target: RelayTarget, *, private_key: bytes, public_key: str) -> None:
        self.client = RelayClient(target, private_key=private_key, public_key=public_key, on_datagram=self._to_engine)
        self._reader: UdpReader | None = None
        self._engine_addr: Any = None
        self.port = 0

    @classmethod
    async def open(cls, target: RelayTarget, *, private_key: bytes, public_key: str) -> LocalRelay:
        relay = cls(target, private_key=private_key, public_key=public_key)
        sock = udp_socket(local=("127.0.0.1", 0))
        relay._reader = UdpReader(sock, relay._from_engine)
        relay.port = sock.getsockname()[1]
        return relay

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _from_engine(self, batch: list[tuple[bytes, Any]]) -> None:
        self._engine_addr = batch[-1][1]
        self.client.send_many([data for data, _ in batch])

    def _to_engine(self, data: bytes) -> None:
        if self._engine_addr is not None and self._reader is not None:
            self._reader.sendto(data, self._engine_addr)

    async def run(self) -> None:
        await self.client.run()

    def close(self) -> None:
        self.client.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None


class SwitchBind:
    """UDP and the WebSocket relays side by side: the datagram transport of an engine that takes a
    Bind (the userspace engine), with no local UDP hop on either path.

    Every endpoint goes over UDP until :meth:`use_websocket` moves it to a relay (and
    :meth:`use_udp` back); what arrives from a relay is reported as coming from that endpoint,
    so the WireGuard core sees the same peer endpoint on both paths. Create with
    ``await SwitchBind.open(port, host, tasks, ...)``; its tasks end with :meth:`close`.
    With a receiver set (:meth:`set_receiver`) the UDP side's batches go straight to it and each
    relay datagram as a batch of one: no queue between the socket and the driver.
    """

    def __init__(self, udp: Any, tasks: Tasks, *, private_key: bytes, public_key: str) -> None:
        self.udp = udp
        self.tasks = tasks
        self._private, self._public = private_key, public_key
        self.clients: dict[Hashable, RelayClient] = {}
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self._receiver: Callable[[list[tuple[bytes, Hashable]]], None] | None = None
        self._closed = False
        self.dropped = 0

    @classmethod
    async def open(cls, port: int | None, host: str, tasks: Tasks, *, private_key: bytes, public_key: str) -> SwitchBind:
        from anex_agent.tunnels.binds.udp import UdpBind

        bind = cls(await UdpBind.open(port or 0, host), tasks, private_key=private_key, public_key=public_key)
        tasks.spawn("switch-bind-udp", bind._pump_udp)
        return bind

    @property
    def local_port(self) -> int:
        return self.udp.local_port

    async def _pump_udp(self) -> None:
        try:
            while True:
                self._put(await self.udp.receive())
        except BindClosed:
            return

    def _put(self, item: tuple[bytes, Hashable]) -> None:
        receiver = self._receiver
        if receiver is not None:
            try:
                receiver([item])
            except Exception:  # the driver's bug must not end the relay connection
                log.exception("switch bind: the receiver failed")
            return
        if not admit(self._queue, item):
            self.dropped += 1

    def set_receiver(self, receiver: Callable[[list[tuple[bytes, Hashable]]], None] | None) -> None:
        """Every datagram, from either path, to ``receiver(batch)`` from now on (None: queue them again)."""
        self._receiver = receiver
        set_udp = getattr(self.udp, "set_receiver", None)
        if set_udp is not None:
            set_udp(receiver)

    def use_websocket(self, endpoint: Hashable, target: RelayTarget) -> None:
        """Send to (and hear) ``endpoint`` through the relay ``target`` from now on."""
        current = self.clients.get(endpoint)
        if current is not None and current.target == target:
            return
        if current is not None:
            current.close()
        client = RelayClient(target, private_key=self._private, public_key=self._public,
                             on_datagram=lambda data, ep=endpoint: self._put((data, ep)))
        self.clients[endpoint] = client
        self.tasks.spawn(f"switch-bind-ws-{len(self.clients)}", client.run)

    def use_udp(self, endpoint: Hashable) -> None:
        client = self.clients.pop(endpoint, None)
        if client is not None:
            client.close()

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        if self._closed:
            return
        client = self.clients.get(endpoint)
        if client is not None:
            client.send(datagram)
        else:
            self.udp.send(datagram, endpoint)

    def send_batch(self, datagrams: list[tuple[bytes, Hashable]]) -> None:
        """:meth:`send` of each, in order; the UDP ones in one ``send_batch`` when no relay is in use."""
        if self._closed:
            return
        if not self.clients and hasattr(self.udp, "send_batch"):
            self.udp.send_batch(datagrams)
            return
        for datagram, endpoint in datagrams:
            self.send(datagram, endpoint)

    async def receive(self) -> tuple[bytes, Hashable]:
        return await next_datagram(self._queue, self._closed)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        self.udp.close()
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            pass

    def report(self) -> dict[str, Any]:
        return {f"{ep[0]}:{ep[1]}" if isinstance(ep, tuple) else str(ep): c.report() for ep, c in self.clients.items()}
