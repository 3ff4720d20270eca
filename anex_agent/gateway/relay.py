"""The gateway's WebSocket relay: WireGuard datagrams of UDP-blocked nodes, to and from the hub.

``anex-agent gateway --ws-listen HOST:PORT`` serves it (plain, or TLS with ``--tls-cert`` and
``--tls-key``; behind a TLS-terminating reverse proxy or ingress it listens plain and the
advertised ``--ws-url`` is the ingress URL). Per connection (protocol:
:mod:`anex_agent.relay_protocol`):

1. the upgrade must offer the ``anex-wg.v2`` (batched) or ``anex-wg.v1`` subprotocol; beyond :attr:`RelayLimits.max_connections`
   live connections the upgrade is answered 503;
2. the relay sends a fresh challenge; the node answers with a proof made with its WireGuard
   key; the key must be a peer of the hub (``is_peer``: the coordinator's peer set), else
   the connection is closed (4003) -- no UDP socket exists yet, nothing reaches the hub;
3. only then a UDP socket of its own is connected to the hub, so WireGuard sees a distinct
   endpoint per node; each datagram of a binary message goes to the hub, and what the hub
   sends comes back framed the same way (v1: one datagram per message; v2: the datagrams
   read from the hub's socket in one go, in one message).

Ping/pong keepalive every :attr:`RelayLimits.ping_interval` s (a peer silent for
``ping_timeout`` more is closed). A datagram from the hub is framed and written at once
(no queue, no task switch); when more than :attr:`RelayLimits.write_limit` bytes already
wait for a slow node, it is dropped, as a full socket buffer would drop it (WireGuard's
timers and TCP inside the tunnel recover).
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

from anex_agent import relay_protocol as rp
from anex_agent.keys import public_key as derive_public
from anex_agent.tunnels.ws_bind import DirectBinary, UdpReader, datagram_sink, send_batch, udp_socket


class RelayServerConnection(DirectBinary, ServerConnection):
    """A relay connection: binary messages go to the hub straight from the protocol's event."""

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RelayLimits:
    max_connections: int = 1024
    write_limit: int = 1 << 20           # bytes waiting to be written per connection before datagrams are dropped
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    auth_timeout: float = 10.0


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
        self._live = 0
        self._server: Server | None = None

    @property
    def bound_port(self) -> int:
        assert self._server is not None
        return next(iter(self._server.sockets)).getsockname()[1]

    async def start(self) -> None:
        self._server = await serve(
            self._handle, self.host, self.port, ssl=self.ssl_context, subprotocols=list(rp.SUBPROTOCOLS),
            process_request=self._admit, ping_interval=self.limits.ping_interval,
            ping_timeout=self.limits.ping_timeout, max_size=rp.MAX_MESSAGE, max_queue=64,
            write_limit=self.limits.write_limit, compression=None, server_header=None,
            create_connection=RelayServerConnection,
        )
        log.info("WebSocket relay listening on %s:%d (%s), relaying to the hub at %s:%d", self.host, self.bound_port,
                 "TLS" if self.ssl_context else "plain; put TLS in front of it", *self.hub)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    def _admit(self, connection: ServerConnection, request: Any):
        if self._live >= self.limits.max_connections:
            self.counters["refused_full"] += 1
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many relay connections\n")
        return None

    async def _handle(self, ws: ServerConnection) -> None:
        if ws.subprotocol not in rp.SUBPROTOCOLS:
            self.counters["refused_protocol"] += 1
            await ws.close(rp.CLOSE_PROTOCOL, "subprotocol anex-wg.v2 or anex-wg.v1 required")
            return
        self._live += 1
        try:
            public_key = await self._authenticate(ws)
            if public_key is None:
                return
            await self._relay(ws, public_key)
        except ConnectionClosed:
            pass
        finally:
            self._live -= 1

    async def _authenticate(self, ws: ServerConnection) -> str | None:
        challenge = rp.new_challenge()
        await ws.send(rp.challenge_message(challenge))
        try:
            message = await asyncio.wait_for(ws.recv(), self.limits.auth_timeout)
            answer = rp.parse_answer(message)
            rp.verify_answer(answer, gateway_private=self._private, gateway_public=self._public, challenge=challenge)
            if not self.is_peer(answer.public_key):
                raise rp.RelayProtocolError("not a peer of this gateway")
        except (rp.RelayProtocolError, asyncio.TimeoutError) as err:
            self.counters["refused_auth"] += 1
            log.info("relay: refused a connection from %s: %s", _peer_name(ws), err or "no answer in time")
            await ws.close(rp.CLOSE_UNAUTHENTICATED, "not authenticated")
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

        def one_to_hub(datagram: bytes) -> None:
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
        return {"live": self._live, "nodes": len(self.connections), **self.counters}


def _peer_name(ws: ServerConnection) -> str:
    forwarded = ws.request.headers.get("X-Forwarded-For") if ws.request is not None else None
    addr = ws.remote_address
    where = f"{addr[0]}:{addr[1]}" if addr else "?"
    return f"{where} (forwarded for {forwarded})" if forwarded else where


def tls_context(cert: str, key: str) -> ssl.SSLContext:
    """A server TLS context from PEM files (raises OSError/ssl.SSLError for the caller to name the flag)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    return context
