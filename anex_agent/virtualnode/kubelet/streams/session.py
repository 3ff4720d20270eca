"""An asyncio driver for the SPDY core (:mod:`.spdy`): streams as objects to read and write.

Contract:

* :class:`SpdySession` owns one :class:`~.spdy.Connection` (server side) over a byte pipe: an
  :class:`asyncio.StreamReader` and a writer with ``write``, ``drain`` and ``close`` (an
  :class:`asyncio.StreamWriter` or :class:`~.upgrade.UpgradedPipe`). :meth:`SpdySession.run`
  reads until the peer goes away, fails the protocol, or :meth:`SpdySession.close` is called;
  run it as a named task of the handler's TaskGroup.
* At most :data:`MAX_STREAMS` streams are open at once; more are refused (RST_STREAM).
* Streams the peer opens are replied to at once (``moby/spdystream`` waits for the reply before
  it returns a stream) and come out of :meth:`SpdySession.accept` (None once the connection
  ended). A stream's headers are its SYN_STREAM's (lower-case names).
* :meth:`SpdyStream.read` returns the next bytes, b"" once the peer ended or reset the stream;
  reading reports the bytes consumed (WINDOW_UPDATE). :meth:`SpdyStream.write` waits for the
  transport to drain and, for a peer that does flow control, for its window.
* Back-pressure: when a stream holds more than ``max_buffer`` unread bytes the session stops
  reading the connection until that stream is read (all streams share the one TCP connection,
  as with the kubelet's spdystream).
* :attr:`SpdySession.last_activity` is the loop time of the last frame either way (idle timeout).
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Protocol

from anex_agent.errors import LocalProtocolError
import anex_agent.virtualnode.kubelet.streams.spdy as spdy

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
MAX_BUFFER = 1 << 20  # unread bytes one stream may hold before the connection is no longer read
MAX_STREAMS = 512  # streams open at once on one connection; more are refused (RST_STREAM REFUSED_STREAM)


class Writer(Protocol):
    def write(self, data: bytes) -> None: ...

    async def drain(self) -> None: ...

    def close(self) -> None: ...


class SpdyStream:
    """One stream the peer opened (see the module docstring)."""

    def __init__(self, session: SpdySession, stream_id: int, headers: dict[str, str]) -> None:
        self.session = session
        self.id = stream_id
        self.headers = headers
        self._chunks: collections.deque[bytes] = collections.deque()
        self._buffered = 0
        self._readable = asyncio.Event()
        self._writable = asyncio.Event()
        self.remote_ended = False
        self.reset = False
        self.local_ended = False

    def header(self, name: str, default: str = "") -> str:
        return self.headers.get(name.lower(), default)

    # called by the session
    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._buffered += len(data)
        self._readable.set()

    def _end(self, reset: bool = False) -> None:
        self.remote_ended = True
        self.reset = self.reset or reset
        if reset:
            self.local_ended = True
        self._readable.set()
        self._writable.set()

    async def read(self) -> bytes:
        """The next bytes the peer sent; b"" once it ended (FIN) or reset the stream."""
        while not self._chunks:
            if self.remote_ended:
                return b""
            self._readable.clear()
            await self._readable.wait()
        data = self._chunks.popleft()
        self._buffered -= len(data)
        if self._buffered < self.session.max_buffer:
            self.session._space.set()
        if not self.reset:
            self.session.conn.acknowledge_received(self.id, len(data))
            await self.session.flush()
        return data

    async def write(self, data: bytes) -> None:
        """Send ``data``; ConnectionResetError when the stream or the connection is gone."""
        offset = 0
        while True:
            if self.reset or self.local_ended or self.session.closed.is_set():
                raise ConnectionResetError(f"stream {self.id} is closed")
            self._writable.clear()
            try:
                offset += self.session.conn.send_data(self.id, data[offset:])
            except LocalProtocolError:
                raise ConnectionResetError(f"stream {self.id} is closed") from None
            await self.session.flush()
            if offset >= len(data):
                return
            await self._writable.wait()

    async def close(self) -> None:
        """FIN: we send nothing more on this stream (reading may go on)."""
        if self.local_ended or self.reset or self.session.closed.is_set():
            return
        self.local_ended = True
        self.session.conn.end_stream(self.id)
        self.session._forget_if_done(self)
        await self.session.flush()

    async def abort(self) -> None:
        """RST_STREAM (CANCEL)."""
        if not self.reset:
            self.reset = self.local_ended = True
            self.session.conn.reset_stream(self.id, spdy.CANCEL)
            self._end(reset=True)
            self.session._forget_if_done(self)
            if not self.session.closed.is_set():
                await self.session.flush()


class SpdySession:
    def __init__(self, reader: asyncio.StreamReader, writer: Writer, *, max_buffer: int = MAX_BUFFER,
                 name: str = "spdy") -> None:
        self.conn = spdy.Connection(client=False)
        self.reader = reader
        self.writer = writer
        self.max_buffer = max_buffer
        self.name = name
        self.streams: dict[int, SpdyStream] = {}
        self._incoming: asyncio.Queue[SpdyStream | None] = asyncio.Queue()
        self._space = asyncio.Event()
        self._space.set()
        self._write_lock = asyncio.Lock()
        self.closed = asyncio.Event()
        self.last_activity = asyncio.get_running_loop().time()
        self.failure: str | None = None

    def _touch(self) -> None:
        self.last_activity = asyncio.get_running_loop().time()

    async def flush(self) -> None:
        """Write what the core queued and wait for the transport to drain."""
        async with self._write_lock:
            data = self.conn.data_to_send()
            if not data or self.closed.is_set():
                return
            self._touch()
            try:
                self.writer.write(data)
                await self.writer.drain()
            except (ConnectionError, OSError, RuntimeError):
                self._finish()

    async def run(self) -> None:
        """Read and dispatch frames until the connection ends."""
        try:
            while not self.closed.is_set():
                await self._space.wait()
                try:
                    data = await self.reader.read(READ_SIZE)
                except (ConnectionError, OSError):
                    data = b""
                if not data:
                    break
                self._touch()
                events = self.conn.receive_data(data)
                for event in events:
                    self._dispatch(event)
                await self.flush()
                if self.failure is not None:
                    log.info("%s: the peer broke the SPDY protocol: %s", self.name, self.failure)
                    break
        finally:
            self._finish()

    def _dispatch(self, event: spdy.Event) -> None:
        if isinstance(event, spdy.StreamOpened):
            if len(self.streams) >= MAX_STREAMS:
                self.conn.reset_stream(event.stream_id, spdy.REFUSED_STREAM)
                return
            stream = SpdyStream(self, event.stream_id, event.headers)
            self.streams[event.stream_id] = stream
            self.conn.reply(event.stream_id)
            if event.fin:
                stream._end()
            self._incoming.put_nowait(stream)
        elif isinstance(event, spdy.DataReceived):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._feed(event.data)
                if stream._buffered >= self.max_buffer:
                    self._space.clear()
        elif isinstance(event, spdy.StreamEnded):
            stream = self.streams.get(event.stream_id)
            if stream is not None:
                stream._end()
                self._forget_if_done(stream)
        elif isinstance(event, spdy.StreamReset):
            stream = self.streams.pop(event.stream_id, None)
            if stream is not None:
                stream._end(reset=True)
        elif isinstance(event, spdy.WindowUpdated):
            targets = self.streams.values() if event.stream_id == 0 else filter(None, [self.streams.get(event.stream_id)])
            for stream in targets:
                stream._writable.set()
        elif isinstance(event, spdy.GoAwayReceived):
            self._incoming.put_nowait(None)
        elif isinstance(event, spdy.ConnectionFailed):
            self.failure = event.reason

    def _forget_if_done(self, stream: SpdyStream) -> None:
        """A stream closed both ways leaves the table (its reader keeps the unread bytes)."""
        if stream.local_ended and stream.remote_ended:
            self.streams.pop(stream.id, None)

    async def accept(self) -> SpdyStream | None:
        """The next stream the peer opens; None once the connection ended or the peer said GOAWAY."""
        if self.closed.is_set() and self._incoming.empty():
            return None
        stream = await self._incoming.get()
        if stream is None:
            self._incoming.put_nowait(None)  # every later accept() sees the end too
        return stream

    def _finish(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        self._space.set()
        for stream in self.streams.values():
            stream._end(reset=True)
        self._incoming.put_nowait(None)
        try:
            self.writer.close()
        except (ConnectionError, OSError, RuntimeError):
            pass

    async def close(self) -> None:
        """GOAWAY, then close the connection (open streams end)."""
        if self.closed.is_set():
            return
        self.conn.goaway()
        await self.flush()
        self._finish()

