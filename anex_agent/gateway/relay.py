"""The gateway's WebSocket relay: WireGuard datagrams of UDP-blocked nodes, to and from the hub.

``anex-agent gateway --ws-listen HOST:PORT`` serves it (plain, or TLS with ``--tls-cert`` and
``--tls-key``; behind a TLS-terminating reverse proxy or ingress it listens plain and the
advertised ``--ws-url`` is the ingress URL). Per connection (protocol:
:mod:`anex_agent.net.relay_protocol`):

0. who may wait for authentication is bounded apart from the nodes' slots
   (:mod:`anex_agent.gateway.admission`): per source address (reset at the TCP accept by the
   listening socket, :mod:`anex_agent.gateway.relay_listener`, before anything is built for
   it) and in all (the oldest waiting connection is dropped), each within
   :attr:`RelayLimits.auth_timeout` seconds of its accept;
1. the upgrade must offer the ``anex-wg.v2`` (batched) or ``anex-wg.v1`` subprotocol; when
   :attr:`RelayLimits.max_connections` authenticated nodes are connected the upgrade is
   answered 503;
2. the relay sends a fresh challenge; the node answers with a proof made with its WireGuard
   key; the key must be a peer of the hub (``is_peer``: the coordinator's peer set), else
   the connection is closed (4003) -- no UDP socket exists yet, nothing reaches the hub;
3. only then a UDP socket of its own is connected to the hub, so WireGuard sees a distinct
   endpoint per node; each datagram of a binary message goes to the hub, and what the hub
   sends comes back framed the same way (v1: one datagram per message; v2: the datagrams
   read from the hub's socket in one go, in one message). Handshake messages (WireGuard
   initiations and responses) go to the hub at most :attr:`RelayLimits.handshakes_per_second`
   a second per connection (bursts of :attr:`RelayLimits.handshake_burst`); past it they are
   dropped and counted (``dropped_handshake_to_hub``). Every relayed node reaches the hub from
   127.0.0.1, so the hub's own per-address limit under load (wireguard-go, the kernel: 20 a
   second) counts them all as one source: one node must not spend it for the others.

Ping/pong keepalive every :attr:`RelayLimits.ping_interval` s (a peer silent for
``ping_timeout`` more is closed). A datagram from the hub is framed and written at once
(no queue, no task switch); when more than :attr:`RelayLimits.write_limit` bytes already
wait for a slow node, it is dropped, as a full socket buffer would drop it (WireGuard's
timers and TCP inside the tunnel recover).

Refusals are counted (:meth:`Relay.report`, the gateway's metrics) and logged at most
:data:`REFUSALS_LOGGED` a minute; what a client sent appears in a log line only through
:func:`anex_agent.net.peer_log.peer_text`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

from websockets.asyncio.server import Server, ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from anex_agent.net import relay_protocol as rp
from anex_agent.gateway.admission import Admission, Network, forwarded_source, is_trusted, source_key
from anex_agent.gateway.relay_listener import listen
from anex_agent.wire.keys import public_key as derive_public
from anex_agent.net.peer_log import LogBudget, peer_text
from anex_agent.tunnels.binds.relay_io import DirectBinary, UdpReader, datagram_sink, send_batch, udp_socket
from anex_agent.wg.budget import TokenBucket

log = logging.getLogger(__name__)
_ws_log = log.getChild("websocket")  # the library's per-connection lines ("connection open") are not kept
_ws_log.setLevel(logging.WARNING)
REFUSALS_LOGGED = 10  # refusal lines a minute; the metrics count every refusal
_HANDSHAKES = (b"\x01", b"\x02")  # WireGuard message types: initiation, response
LISTEN_BACKLOG = 4096  # accepted-but-unserved connections the kernel holds (capped by net.core.somaxconn)
CLOSE_TRY_AGAIN_LATER = 1013  # RFC 6455 §7.4.1 / IANA registry: the relay holds max_connections nodes


class RelayServerConnection(DirectBinary, ServerConnection):
    """A relay connection: binary messages go to the hub straight from the protocol's event.

    Admission is decided when the TCP connection is made (:meth:`connection_made`, after the
    listening socket's fast path): a connection the relay does not admit is aborted there,
    before the library reads a byte or starts a task for it.
    """

    def __init__(self, relay: Relay, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.relay = relay
        self.refused = False
        self.source: str | None = None      # what admission counts it under (None: a trusted proxy's, until its request)
        self.deadline: asyncio.TimerHandle | None = None
        self.peer: Any = None               # the TCP peer's address

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if not self.relay._arrive(self, transport):
            self.refused = True
            transport.abort()
            return
        super().connection_made(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.relay._settled(self)
        if not self.refused:
            super().connection_lost(exc)


@dataclass(frozen=True)
class RelayLimits:
    max_connections: int = 1024          # authenticated nodes connected at once (the fleet's size)
    write_limit: int = 1 << 20           # bytes waiting to be written per connection before datagrams are dropped
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    auth_timeout: float = 5.0            # seconds from the TCP accept to the proven key (TLS and upgrade included)
    max_pending: int = 256               # connections waiting for authentication, in all
    max_pending_per_source: int = 8      # of which from one source address (IPv6: one /64)
    trusted_proxies: tuple[Network, ...] = ()  # peers whose X-Forwarded-For names the source
    handshakes_per_second: float = 2.0   # handshake messages per connection to the hub (WireGuard: one per 5 s)
    handshake_burst: int = 10            # ... in bursts of this many (a first contact asks a few quickly)


class Relay:
    """Serve the relay until :meth:`close`. ``is_peer(public_key_b64)`` says whether a key may use it."""

    def __init__(self, *, host: str, port: int, hub: tuple[str, int], private_key: bytes,
                 is_peer: Callable[[str], bool], ssl_context: ssl.SSLContext | None = None,
                 limits: RelayLimits = RelayLimits()) -> None:
        self.host, self.port = host, port
        self.hub = hub
        self._private = private_key
        self._public = derive_public(private_key)
        self.is_peer = is_peer
        self.ssl_context = ssl_context
        self.limits = limits
        self.counters: collections.Counter[str] = collections.Counter()
        self.connections: dict[str, int] = {}  # public key -> live connections
        self._live = 0  # authenticated connections
        self._admission = Admission(limits.max_pending, limits.max_pending_per_source)
        self._refusal_log = LogBudget(REFUSALS_LOGGED, 60.0)
        self._server: Server | None = None

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return next(iter(self._server.sockets)).getsockname()[1]

    async def start(self) -> None:
        sock = listen(self.host, self.port, LISTEN_BACKLOG)
        sock.refuse = self._refused_at_accept
        self._server = await serve(
            self._handle, sock=sock, ssl=self.ssl_context, subprotocols=list(rp.SUBPROTOCOLS),
            process_request=self._admit, ping_interval=self.limits.ping_interval,
            ping_timeout=self.limits.ping_timeout, max_size=rp.MAX_MESSAGE, max_queue=64,
            write_limit=self.limits.write_limit, compression=None, server_header=None,
            create_connection=lambda *args, **kwargs: RelayServerConnection(self, *args, **kwargs),
            open_timeout=self.limits.auth_timeout, logger=_ws_log,
        )
        log.info("WebSocket relay listening on %s:%d (%s), relaying to the hub at %s:%d", self.host, self.bound_port,
                 "TLS" if self.ssl_context else "plain; put TLS in front of it", *self.hub)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    # -- admission (before authentication) --

    def _refused_at_accept(self, peer: Any) -> bool:
        """The listening socket's fast path: a source that already has its share waiting is
        refused before anything is built for its connection (:mod:`.relay_listener`)."""
        address = str(peer[0]) if peer else ""
        if is_trusted(address, self.limits.trusted_proxies):
            return False
        if self._admission.from_source(source_key(address) or address) < self.limits.max_pending_per_source:
            return False
        self._refuse("source", None, "too many connections from this source wait for authentication", peer=peer)
        return True

    def _arrive(self, conn: RelayServerConnection, transport: asyncio.BaseTransport) -> bool:
        """A TCP connection was accepted: whether it may wait for authentication (see the module)."""
        conn.peer = peer = transport.get_extra_info("peername")
        address = str(peer[0]) if peer else ""
        conn.source = None if is_trusted(address, self.limits.trusted_proxies) else (source_key(address) or address)
        admitted, to_drop = self._admission.arrive(conn, conn.source)
        for oldest in to_drop:
            self._refuse("evicted", oldest, "dropped unauthenticated: too many connections wait for authentication")
            oldest.transport.abort()
        if not admitted:
            self._refuse("source", conn, "too many connections from this source wait for authentication")
            return False
        conn.deadline = asyncio.get_running_loop().call_later(self.limits.auth_timeout, self._expire, conn)
        return True

    def _expire(self, conn: RelayServerConnection) -> None:
        conn.deadline = None
        self._admission.leave(conn)
        self._refuse("timeout", conn, f"no proven key within {self.limits.auth_timeout:g} s")
        conn.transport.abort()

    def _settled(self, conn: RelayServerConnection) -> None:
        """``conn`` no longer waits for authentication (it passed, or it is gone)."""
        self._admission.leave(conn)
        if conn.deadline is not None:
            conn.deadline.cancel()
            conn.deadline = None

    def _refuse(self, reason: str, conn: ServerConnection | None, why: str, *, peer: Any = None) -> None:
        """Count a refusal (``refused_<reason>``) and log it within the budget."""
        self.counters[f"refused_{reason}"] += 1
        skipped = self._refusal_log.take()
        if skipped is None:
            return
        more = (f" ({skipped} more refusals not logged; anex_gateway_relay_refused_total counts them all)"
                if skipped else "")
        where = _peer_name(conn) if conn is not None or not peer else f"{peer[0]}:{peer[1]}"
        log.info("relay: refused a connection from %s: %s%s", where, why, more)

    def _admit(self, connection: ServerConnection, request: Any):
        assert isinstance(connection, RelayServerConnection)
        if self._live >= self.limits.max_connections:
            self._refuse("full", connection, f"{self.limits.max_connections} nodes are connected (the relay's limit)")
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many relay connections\n")
        if connection.source is None:  # from a trusted proxy: the client is the one it forwards for
            address = connection.peer[0] if connection.peer else ""
            source = (forwarded_source(request.headers.get_all("X-Forwarded-For"), self.limits.trusted_proxies)
                      or source_key(str(address)) or str(address))
            if not self._admission.forwarded(connection, source):
                connection.source = source
                self._refuse("source", connection, "too many connections from this source wait for authentication")
                return connection.respond(HTTPStatus.TOO_MANY_REQUESTS, "too many connections wait for authentication\n")
            connection.source = source
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        assert isinstance(ws, RelayServerConnection)
        if ws.subprotocol not in rp.SUBPROTOCOLS:
            self._refuse("protocol", ws, "no anex-wg subprotocol offered")
            await ws.close(rp.CLOSE_PROTOCOL, "subprotocol anex-wg.v2 or anex-wg.v1 required")
            return
        try:
            public_key = await self._authenticate(ws)
            if public_key is None:
                return
            self._live += 1
            try:
                await self._relay(ws, public_key)
            finally:
                self._live -= 1
        except ConnectionClosed:
            pass

    async def _authenticate(self, ws: RelayServerConnection) -> str | None:
        """The node's proven key, or ``None`` (the connection closed). The admission deadline
        bounds the wait: when it passes, the transport is aborted and ``recv`` raises."""
        challenge = rp.new_challenge()
        await ws.send(rp.challenge_message(challenge))
        try:
            message = await ws.recv()
            answer = rp.parse_answer(message)
            rp.verify_answer(answer, gateway_private=self._private, gateway_public=self._public, challenge=challenge)
            if not self.is_peer(answer.public_key):
                raise rp.RelayProtocolError("not a peer of this gateway")
        except rp.RelayProtocolError as err:
            self._settled(ws)
            self._refuse("auth", ws, str(err))
            await ws.close(rp.CLOSE_UNAUTHENTICATED, "not authenticated")
            return None
        self._settled(ws)
        if self._live >= self.limits.max_connections:
            self._refuse("full", ws, f"{self.limits.max_connections} nodes are connected (the relay's limit)")
            await ws.close(CLOSE_TRY_AGAIN_LATER, "the relay is full")
            return None
        await ws.send(rp.OK_MESSAGE)
        return answer.public_key

    async def _relay(self, ws: ServerConnection, public_key: str) -> None:
        counters, limit = self.counters, self.limits.write_limit

        def to_node(batch: list[tuple[bytes, Any]]) -> None:
            if send_batch(ws, [data for data, _ in batch], limit):
                counters["to_node"] += len(batch)
            else:
                counters["dropped_to_node"] += len(batch)

        hub = UdpReader(udp_socket(remote=self.hub), to_node)
        self.connections[public_key] = self.connections.get(public_key, 0) + 1
        self.counters["accepted"] += 1
        log.info("relay: node %s connected from %s (hub endpoint %s)", public_key[:8], _peer_name(ws),
                 hub.sock.getsockname())
        send = hub.send
        handshakes = TokenBucket(self.limits.handshakes_per_second, self.limits.handshake_burst)
        clock = asyncio.get_running_loop().time

        def one_to_hub(datagram: bytes) -> None:
            if datagram[:1] in _HANDSHAKES and not handshakes.take(clock()):
                counters["dropped_handshake_to_hub"] += 1
                return
            send(datagram)
            counters["to_hub"] += 1

        to_hub = datagram_sink(ws, one_to_hub, counters)

        try:
            if isinstance(ws, DirectBinary):
                ws.on_datagram = to_hub  # whole binary messages from now on skip recv()
            async for message in ws:  # fragmented binary messages, text, and the end of the connection
                if isinstance(message, bytes):
                    to_hub(message)
                else:  # control messages end with authentication
                    await ws.close(rp.CLOSE_PROTOCOL, "binary messages only")
                    break
        finally:
            hub.close()
            left = self.connections.get(public_key, 1) - 1
            if left:
                self.connections[public_key] = left
            else:
                self.connections.pop(public_key, None)
            log.info("relay: node %s disconnected", public_key[:8])

    def report(self) -> dict[str, Any]:
        """Counts: ``live`` authenticated connections, ``pending`` ones waiting for authentication,
        ``nodes``, and the counters (``accepted``, ``refused_<reason>``, datagrams)."""
        return {"live": self._live, "pending": self._admission.pending, "nodes": len(self.connections),
                **self.counters}


def _peer_name(ws: ServerConnection | None) -> str:
    """The peer for a log line: its address, and what it says it forwards for (bounded, escaped)."""
    if ws is None:
        return "?"
    request = ws.request
    forwarded = request.headers.get("X-Forwarded-For") if request is not None else None
    addr = getattr(ws, "peer", None) or (None if isinstance(ws, RelayServerConnection) else ws.remote_address)
    where = f"{addr[0]}:{addr[1]}" if addr else "?"
    return f"{where} (forwarded for {peer_text(forwarded)})" if forwarded else where


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from PEM files (raises OSError/ssl.SSLError for the caller to name the flag)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
