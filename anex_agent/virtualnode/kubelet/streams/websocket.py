"""exec and attach over a WebSocket (``v5.channel.k8s.io`` / ``v4.channel.k8s.io``), for clients that
reach the kubelet port with one (the API server itself speaks SPDY to kubelets).

Contract: :func:`handshake` checks the request with python-websockets' sans-I/O server (RFC 6455
§4.2; no extensions) and the subprotocol the client offers first among ours; it returns the
101's headers, or a refusal to answer with. After the handler answered 101 with them,
:class:`WsSession` drives an open :class:`websockets.server.ServerProtocol` over the raw
connection with the same face as :class:`~.session.SpdySession` (``run``, ``close``, ``closed``,
``last_activity``, ``name``), so :func:`~.bridge.run_bridged` and the exec/attach bodies serve
both. Its streams (:class:`WsStream`, one per channel the options call for) read and write
binary messages whose first byte is the channel (:mod:`.channels`); with v5 a client's
``255 <channel>`` message ends that channel (stdin's EOF), with v4 only the connection's end
does. Fragmented messages are joined; a message over :data:`MAX_MESSAGE` closes the connection
(1009). :meth:`WsSession.close` sends a normal close (1000) and closes the connection.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Any

from aiohttp import web
from websockets.datastructures import Headers
from websockets.exceptions import InvalidState
from websockets.frames import Opcode
from websockets.http11 import Request
from websockets.protocol import State
from websockets.server import ServerProtocol

from anex_agent.errors import RemoteProtocolError
import anex_agent.virtualnode.kubelet.streams.channels as channels
from anex_agent.virtualnode.kubelet.streams.session import Writer

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
MAX_MESSAGE = 1 << 20


def wants_websocket(request: web.Request) -> bool:
    return request.headers.get("Upgrade", "").strip().lower() == "websocket"


def handshake(request: web.Request, supported: tuple[str, ...]) -> tuple[str, dict[str, str]] | web.Response:
    """(protocol, 101 headers), or the answer refusing the handshake."""
    offered = channels.offered(request.headers.getall("Sec-WebSocket-Protocol", []))
    protocol = channels.negotiate(offered, supported)
    if protocol is None:
        return web.Response(status=403, content_type="text/plain",
                            text=f"unable to upgrade: unable to negotiate protocol: client supports {offered}, "
                                 f"server supports {list(supported)}")
    server = ServerProtocol(subprotocols=[protocol])  # type: ignore[list-item]
    headers = Headers()
    for name, value in request.headers.items():
        headers[name] = value
    response = server.accept(Request(request.path_qs, headers))
    if response.status_code != 101:
        return web.Response(status=response.status_code, body=response.body, content_type="text/plain")
    return protocol, {name: value for name, value in response.headers.raw_items()}


class WsStream:
    """One channel, with :class:`~.session.SpdyStream`'s reading and writing face."""

    def __init__(self, session: WsSession, kind: str) -> None:
        self.session = session
        self.kind = kind
        self.channel = channels.CHANNELS[kind]
        self._chunks: collections.deque[bytes] = collections.deque()
        self._readable = asyncio.Event()
        self.remote_ended = False
        self.local_ended = False

    def _feed(self, data: bytes) -> None:
        if data:
            self._chunks.append(data)
            self._readable.set()

    def _end(self) -> None:
        self.remote_ended = True
        self._readable.set()

    async def read(self) -> bytes:
        while not self._chunks:
            if self.remote_ended:
                return b""
            self._readable.clear()
            await self._readable.wait()
        return self._chunks.popleft()

    async def write(self, data: bytes) -> None:
        if self.local_ended or self.session.closed.is_set():
            raise ConnectionResetError(f"channel {self.channel} is closed")
        await self.session.send(channels.ws_frame(self.channel, data))

    async def close(self) -> None:
        self.local_ended = True

    async def abort(self) -> None:
        self.local_ended = True
        self._end()


class WsSession:
    def __init__(self, reader: asyncio.StreamReader, writer: Writer, protocol: str, kinds: set[str], *,
                 name: str) -> None:
        self.reader, self.writer = reader, writer
        self.protocol = ServerProtocol(state=State.OPEN, max_size=MAX_MESSAGE)
        self.v5 = protocol == channels.V5
        self.name = name
        self.streams = {kind: WsStream(self, kind) for kind in kinds}
        self._by_channel = {stream.channel: stream for stream in self.streams.values()}
        self._lock = asyncio.Lock()
        self._message: list[bytes] = []
        self.closed = asyncio.Event()
        self.last_activity = asyncio.get_running_loop().time()

    async def flush(self) -> None:
        async with self._lock:
            data = b"".join(self.protocol.data_to_send())
            if not data or self.closed.is_set():
                return
            self.last_activity = asyncio.get_running_loop().time()
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self._finish()

    async def send(self, message: bytes) -> None:
        try:
            self.protocol.send_binary(message)
        except InvalidState:
            raise ConnectionResetError("the WebSocket is closing") from None
        await self.flush()

    async def run(self) -> None:
        try:
            while not self.closed.is_set():
                try:
                    data = await self.reader.read(READ_SIZE)
                except (ConnectionError, OSError):
                    data = b""
                if data:
                    self.last_activity = asyncio.get_running_loop().time()
                    self.protocol.receive_data(data)
                else:
                    self.protocol.receive_eof()
                for frame in self.protocol.events_received():
                    self._on_frame(frame)
                await self.flush()
                if not data or self.protocol.state is State.CLOSED or self.protocol.close_expected():
                    break
        except RemoteProtocolError as err:
            log.info("%s: %s", self.name, err)
        finally:
            self._finish()

    def _on_frame(self, frame: Any) -> None:
        if frame.opcode in (Opcode.TEXT, Opcode.BINARY, Opcode.CONT):
            self._message.append(frame.data)
            if not frame.fin:
                return
            message, self._message = b"".join(self._message), []
            channel, payload = channels.ws_parse(message)
            if channel == channels.CLOSE_CHANNEL and self.v5:
                for number in payload[:1]:
                    stream = self._by_channel.get(number)
                    if stream is not None:
                        stream._end()
                return
            stream = self._by_channel.get(channel)
            if stream is not None and channel in (channels.CHANNELS[channels.STDIN], channels.CHANNELS[channels.RESIZE]):
                stream._feed(payload)

    def _finish(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for stream in self.streams.values():
            stream._end()
            stream.local_ended = True
        try:
            self.writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def close(self) -> None:
        if self.closed.is_set():
            return
        try:
            self.protocol.send_close(1000)
        except InvalidState:
            pass
        await self.flush()
        self._finish()
