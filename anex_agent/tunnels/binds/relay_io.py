"""The relay's datagram I/O that both ends share: the client (:mod:`.relay_client`, :mod:`.ws`) and the
gateway's relay (:mod:`anex_agent.gateway.relay`).

* :func:`send_batch` frames datagrams onto an open connection and writes them in one call
  (``anex-wg.v1``: a binary message each; ``anex-wg.v2``: batched by
  :func:`anex_agent.net.relay_protocol.pack`), dropping them, as UDP would, when more than
  :data:`WRITE_LIMIT` bytes already wait; :func:`datagram_sink` undoes the framing on receipt.
* :class:`DirectBinary` -- a connection mixin that hands each whole binary message to a callback
  straight from the protocol's event, without the message queue and ``recv()``.
* :class:`UdpReader` and :func:`udp_socket` -- a UDP socket read in batches of :data:`READ_BATCH`
  per wake-up; sending never blocks (a full buffer drops).

Nothing here connects, authenticates or retries; websockets is imported only where a
connection's state or frames are read.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from anex_agent.net import relay_protocol as rp

if TYPE_CHECKING:
    from websockets.asyncio.connection import Connection

log = logging.getLogger(__name__)

#: Bytes waiting to be written on a relay connection before datagrams are dropped (a full socket buffer).
WRITE_LIMIT = 1 << 20

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
