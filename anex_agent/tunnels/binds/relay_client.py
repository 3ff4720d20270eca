"""One connection to one gateway's WebSocket relay: the client side of :mod:`anex_agent.net.relay_protocol`.

* :class:`RelayTarget` -- where a gateway's relay is (``ws://`` or ``wss://``), its public key
  (the proof is made against it), the egress proxy to go through (``http://HOST:PORT`` for
  HTTP CONNECT, see :mod:`.egress_proxy`) and the TLS context.
* :class:`RelayClient` -- one connection to one gateway's relay. :meth:`RelayClient.run`
  connects, authenticates (proof made with the node's WireGuard key) and pumps datagrams;
  after any failure (refused, reset, ping timeout, relay restarted) it reconnects with
  backoff and jitter, forever, until :meth:`close`. There is no idle timeout: ping/pong keeps
  a quiet connection open through NATs and proxies. Datagrams sent while it is not connected
  are dropped, as UDP would, but for the last :data:`BACKLOG_DISCONNECTED` (the handshake
  initiation that opened the path), sent once it is up; WireGuard's timers recover. The
  engine and the workload never notice a reconnect.
* :func:`check_relay` -- connect once, authenticate, close: whether the relay accepts this node
  (``anex-agent detect``).

The binds over relay clients are in :mod:`.ws` and :mod:`.switch`; the framing both ends share
in :mod:`.relay_io`. websockets is imported where a connection is made.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from functools import cache

from anex_agent.net import relay_protocol as rp
from anex_agent.backoff import Backoff
from anex_agent.tunnels.binds.relay_io import DirectBinary, datagram_sink, send_batch

if TYPE_CHECKING:
    from websockets.asyncio.client import ClientConnection

log = logging.getLogger(__name__)

#: Datagrams kept while the connection is (re)opening, sent once it is up.
BACKLOG_DISCONNECTED = 16
CONNECT_TIMEOUT = 10.0
PING_INTERVAL = 15.0
PING_TIMEOUT = 15.0


@cache
def relay_client_connection() -> type:
    """The client connection class of the relay: binary messages delivered directly (:class:`DirectBinary`)."""
    from websockets.asyncio.client import ClientConnection

    class RelayClientConnection(DirectBinary, ClientConnection):
        pass

    return RelayClientConnection


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
                async with asyncio.timeout(delay):
                    await self._closed.wait()
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
