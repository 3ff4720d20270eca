"""SPDY/3.1 framing as a sans-I/O core: bytes in, events out, bytes to send
(draft-mbelshe-httpbis-spdy-00 and the SPDY/3.1 changes; the "SPDY/3.1" upgrade of the
Kubernetes streaming API: exec, attach, port-forward).

Contract (as python-websockets' ``protocol.py`` and h2):

* :meth:`Connection.receive_data` takes whatever bytes came from the peer and returns the
  :class:`Event`\\ s they complete; a partial frame waits for the next call. A malformed frame is a
  connection error: GOAWAY (PROTOCOL_ERROR) is queued, :class:`ConnectionFailed` returned, and
  later input ignored. A bad frame on one stream only resets that stream (RST_STREAM, §2.4.2).
* Every method that acts (:meth:`open_stream`, :meth:`reply`, :meth:`send_data`, ...) only queues
  frames: after calling it, send :meth:`data_to_send`. Pings from the peer are answered, and a
  SYN_STREAM the peer sends on a closed or reused id is reset, without the caller's help.
* Header blocks are compressed with zlib primed with the SPDY/3 dictionary, one compression
  context per direction for the whole connection (§2.6.10.1); names are lower-case (§2.6.10).
* Flow control (SPDY/3.1 §2.6.8): both windows start at 64 KiB per stream, and 64 KiB for the
  connection (stream 0). The receive side reports consumed bytes with
  :meth:`acknowledge_received`, which queues WINDOW_UPDATE frames once half a window is used.
  The send side: ``moby/spdystream`` (what the API server and kubectl speak) never sends
  WINDOW_UPDATE and ignores ours, so a peer is held to windows only once it has shown it does
  flow control (a WINDOW_UPDATE or SETTINGS_INITIAL_WINDOW_SIZE); until then
  :meth:`send_data` sends everything and the transport's back-pressure is the bound. Data beyond
  our receive window is an error only with ``strict_flow_control`` (tests, peers of our own).
* Imports no asyncio, socket or time (a test checks that).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.virtualnode.kubelet.streams.spdy_dictionary import DICTIONARY

VERSION = 3
# Control frame types (§2.6)
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
FLAG_UNIDIRECTIONAL = 0x02
# RST_STREAM status codes (§2.6.3)
PROTOCOL_ERROR, INVALID_STREAM, REFUSED_STREAM, UNSUPPORTED_VERSION, CANCEL = 1, 2, 3, 4, 5
INTERNAL_ERROR, FLOW_CONTROL_ERROR, STREAM_IN_USE, STREAM_ALREADY_CLOSED = 6, 7, 8, 9
# GOAWAY status codes (§2.6.6)
GOAWAY_OK, GOAWAY_PROTOCOL_ERROR, GOAWAY_INTERNAL_ERROR = 0, 1, 2
SETTINGS_INITIAL_WINDOW_SIZE = 7  # §2.6.4
DEFAULT_WINDOW = 64 * 1024  # SPDY/3.1 §2.6.8: initial stream and session windows
MAX_WINDOW = 0x7FFFFFFF
MAX_FRAME_DATA = 0xFFFFFF  # 24-bit length
SEND_CHUNK = 256 * 1024  # DATA frames we write carry at most this much (fewer frames per forwarded MiB)
MAX_CONTROL_FRAME = 1 << 20  # a larger control frame (headers) from the peer is refused
MAX_HEADER_BLOCK = 256 * 1024  # decompressed header block limit (a zlib bomb stops here)
MAX_STREAM_ID = 0x7FFFFFFF
HEADER = struct.Struct(">IBBH")  # first word, flags, 24-bit length as 1 + 2 bytes


@dataclass(frozen=True)
class Event:
    """Something the peer did."""


@dataclass(frozen=True)
class StreamOpened(Event):
    """The peer opened ``stream_id`` (SYN_STREAM). Answer with :meth:`Connection.reply`."""

    stream_id: int
    headers: dict[str, str]
    fin: bool = False  # the peer sends nothing on it
    unidirectional: bool = False  # we may not send on it
    associated_id: int = 0


@dataclass(frozen=True)
class StreamReplied(Event):
    """The peer accepted a stream we opened (SYN_REPLY)."""

    stream_id: int
    headers: dict[str, str]
    fin: bool = False


@dataclass(frozen=True)
class HeadersReceived(Event):
    stream_id: int
    headers: dict[str, str]
    fin: bool = False


@dataclass(frozen=True)
class DataReceived(Event):
    """Bytes on a stream; report them with :meth:`Connection.acknowledge_received` once consumed."""

    stream_id: int
    data: bytes


@dataclass(frozen=True)
class StreamEnded(Event):
    """The peer will send nothing more on ``stream_id`` (FIN)."""

    stream_id: int


@dataclass(frozen=True)
class StreamReset(Event):
    """The stream is gone (RST_STREAM from the peer, or one we queued for a bad frame: ``local``)."""

    stream_id: int
    status: int
    local: bool = False


@dataclass(frozen=True)
class WindowUpdated(Event):
    """More may be sent on ``stream_id`` (0: the connection)."""

    stream_id: int
    delta: int


@dataclass(frozen=True)
class SettingsReceived(Event):
    settings: dict[int, int]


@dataclass(frozen=True)
class PingAcknowledged(Event):
    """The peer answered our :meth:`Connection.ping`."""

    ping_id: int


@dataclass(frozen=True)
class GoAwayReceived(Event):
    """The peer opens no more streams; those above ``last_stream_id`` it did not process."""

    last_stream_id: int
    status: int


@dataclass(frozen=True)
class ConnectionFailed(Event):
    """The peer broke the protocol; GOAWAY is queued, send it and close."""

    reason: str


@dataclass
class _Stream:
    local_closed: bool = False
    remote_closed: bool = False
    replied: bool = False
    send_window: int = DEFAULT_WINDOW
    recv_window: int = DEFAULT_WINDOW
    unacknowledged: int = 0  # received and consumed, not yet given back in a WINDOW_UPDATE


def encode_headers(headers: dict[str, str]) -> bytes:
    """The uncompressed name/value block (§2.6.10): 32-bit counts and lengths, lower-case names."""
    out = [struct.pack(">I", len(headers))]
    for name, value in headers.items():
        raw_name, raw_value = name.lower().encode(), value.encode()
        out.append(struct.pack(">I", len(raw_name)) + raw_name + struct.pack(">I", len(raw_value)) + raw_value)
    return b"".join(out)


def decode_headers(block: bytes) -> dict[str, str]:
    """The name/value pairs of an uncompressed block; RemoteProtocolError if it is malformed."""
    try:
        (count,), offset = struct.unpack_from(">I", block), 4
        headers: dict[str, str] = {}
        for _ in range(count):
            (size,) = struct.unpack_from(">I", block, offset)
            name = block[offset + 4: offset + 4 + size]
            offset += 4 + size
            (vsize,) = struct.unpack_from(">I", block, offset)
            value = block[offset + 4: offset + 4 + vsize]
            offset += 4 + vsize
            if not name or len(name) != size or len(value) != vsize or name.lower() != name:
                raise RemoteProtocolError("malformed SPDY header block")
            text = name.decode()
            if text in headers:  # §2.6.10: duplicate names are a protocol error
                raise RemoteProtocolError("duplicate SPDY header name")
            headers[text] = value.decode()
    except (struct.error, UnicodeDecodeError):
        raise RemoteProtocolError("malformed SPDY header block") from None
    if offset != len(block):
        raise RemoteProtocolError("trailing bytes after a SPDY header block")
    return headers


class HeaderCompressor:
    """One direction's zlib context; every block ends with a sync flush so it stands alone."""

    def __init__(self) -> None:
        self._zlib = zlib.compressobj(level=9, zdict=DICTIONARY)

    def compress(self, headers: dict[str, str]) -> bytes:
        return self._zlib.compress(encode_headers(headers)) + self._zlib.flush(zlib.Z_SYNC_FLUSH)


class HeaderDecompressor:
    def __init__(self) -> None:
        self._zlib = zlib.decompressobj(zdict=DICTIONARY)

    def decompress(self, data: bytes) -> dict[str, str]:
        try:
            block = self._zlib.decompress(data, MAX_HEADER_BLOCK + 1)
        except zlib.error:
            raise RemoteProtocolError("SPDY header block does not decompress") from None
        if len(block) > MAX_HEADER_BLOCK or self._zlib.unconsumed_tail:
            raise RemoteProtocolError("SPDY header block too large")
        return decode_headers(block)


class Connection:
    """One SPDY/3.1 session; ``client`` opens odd stream ids, a server even ones (§2.3.2)."""

    def __init__(self, *, client: bool, strict_flow_control: bool = False,
                 initial_window: int = DEFAULT_WINDOW) -> None:
        self.client = client
        self.strict_flow_control = strict_flow_control
        self._buffer = bytearray()
        self._out: list[bytes | memoryview] = []  # frames, DATA payloads as views of the caller's bytes
        self._compressor = HeaderCompressor()
        self._decompressor = HeaderDecompressor()
        self._streams: dict[int, _Stream] = {}
        self._next_id = 1 if client else 2
        self._next_ping = 1 if client else 2
        self._last_remote_id = 0
        self._failed = False
        self.goaway_sent = False
        self.goaway_received = False
        self.peer_flow_control = False  # the peer showed it honours windows (see module docstring)
        self._peer_initial_window = DEFAULT_WINDOW
        self._initial_recv_window = initial_window
        self.connection_send_window = DEFAULT_WINDOW
        self._connection_recv_window = DEFAULT_WINDOW
        self._connection_unacknowledged = 0
        self._replied_by_peer: set[int] = set()

    # -- output ---------------------------------------------------------------------------
    def data_to_send(self) -> bytes:
        """Everything queued since the last call (b"" when nothing is): the one copy of DATA payloads."""
        out, self._out = b"".join(self._out), []
        return out

    def _control(self, kind: int, flags: int, payload: bytes) -> None:
        self._out.append(struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload)

    def _data(self, stream_id: int, flags: int, payload: bytes | memoryview) -> None:
        self._out.append(struct.pack(">II", stream_id, (flags << 24) | len(payload)))
        if payload:
            self._out.append(payload)

    # -- acting -----------------------------------------------------------------------------
    def open_stream(self, headers: dict[str, str], *, fin: bool = False, priority: int = 0,
                    associated_id: int = 0) -> int:
        """Queue a SYN_STREAM and return the new stream's id."""
        if self.goaway_sent or self.goaway_received:
            raise LocalProtocolError("no new SPDY streams after GOAWAY")
        stream_id = self._next_id
        if stream_id > MAX_STREAM_ID:
            raise LocalProtocolError("SPDY stream ids exhausted")
        self._next_id += 2
        self._streams[stream_id] = _Stream(local_closed=fin, replied=True,
                                           send_window=self._peer_initial_window,
                                           recv_window=self._initial_recv_window)
        body = struct.pack(">IIBB", stream_id, associated_id, (priority & 7) << 5, 0)
        self._control(SYN_STREAM, FLAG_FIN if fin else 0, body + self._compressor.compress(headers))
        return stream_id

    def reply(self, stream_id: int, headers: dict[str, str] | None = None, *, fin: bool = False) -> None:
        """Queue the SYN_REPLY that accepts the peer's stream ``stream_id``."""
        stream = self._stream(stream_id)
        if stream.replied:
            raise LocalProtocolError(f"SPDY stream {stream_id} already replied")
        stream.replied = True
        self._control(SYN_REPLY, FLAG_FIN if fin else 0,
                      struct.pack(">I", stream_id) + self._compressor.compress(headers or {}))
        if fin:
            self._close_local(stream_id, stream)

    def send_headers(self, stream_id: int, headers: dict[str, str], *, fin: bool = False) -> None:
        stream = self._stream(stream_id)
        if stream.local_closed:
            raise LocalProtocolError(f"SPDY stream {stream_id} is closed for sending")
        self._control(HEADERS, FLAG_FIN if fin else 0,
                      struct.pack(">I", stream_id) + self._compressor.compress(headers))
        if fin:
            self._close_local(stream_id, stream)

    def send_window(self, stream_id: int) -> int | None:
        """How much :meth:`send_data` takes now on ``stream_id``; None: no limit (the peer does no
        flow control)."""
        if not self.peer_flow_control:
            return None
        stream = self._streams.get(stream_id)
        if stream is None:
            return 0
        return max(0, min(stream.send_window, self.connection_send_window))

    def send_data(self, stream_id: int, data: bytes, *, fin: bool = False) -> int:
        """Queue DATA frames for as much of ``data`` as the windows allow; return how much.

        ``fin`` ends the stream only once all of ``data`` is taken. The rest waits for a
        :class:`WindowUpdated` event."""
        stream = self._stream(stream_id)
        if stream.local_closed:
            raise LocalProtocolError(f"SPDY stream {stream_id} is closed for sending")
        if not stream.replied:
            raise LocalProtocolError(f"SPDY stream {stream_id} is not replied yet")
        window = self.send_window(stream_id)
        take = len(data) if window is None else min(len(data), window)
        # views, not copies: data_to_send joins them once (bytes cannot change under us; other
        # buffers are copied here, since the caller may reuse them before the frames are sent)
        view = memoryview(data if isinstance(data, bytes) else bytes(data))[:take]
        for start in range(0, take, SEND_CHUNK):
            chunk = view[start: start + SEND_CHUNK]
            last = start + SEND_CHUNK >= take
            self._data(stream_id, FLAG_FIN if (fin and last and take == len(data)) else 0, chunk)
        if self.peer_flow_control:
            stream.send_window -= take
            self.connection_send_window -= take
        if fin and take == len(data):
            if take == 0:
                self._data(stream_id, FLAG_FIN, b"")
            self._close_local(stream_id, stream)
        return take

    def end_stream(self, stream_id: int) -> None:
        """Queue an empty DATA frame with FIN: we send nothing more on ``stream_id``."""
        stream = self._streams.get(stream_id)
        if stream is None or stream.local_closed:
            return
        self.send_data(stream_id, b"", fin=True)

    def reset_stream(self, stream_id: int, status: int = CANCEL) -> None:
        """Queue RST_STREAM; the stream is forgotten (frames for it are then dropped)."""
        if self._streams.pop(stream_id, None) is not None:
            self._control(RST_STREAM, 0, struct.pack(">II", stream_id, status))

    def acknowledge_received(self, stream_id: int, size: int) -> None:
        """``size`` bytes of ``stream_id`` were consumed: open the windows again (WINDOW_UPDATE)."""
        if size <= 0:
            return
        self._connection_unacknowledged += size
        if self._connection_unacknowledged >= DEFAULT_WINDOW // 2:
            self._connection_recv_window += self._connection_unacknowledged
            self._control(WINDOW_UPDATE, 0, struct.pack(">II", 0, self._connection_unacknowledged))
            self._connection_unacknowledged = 0
        stream = self._streams.get(stream_id)
        if stream is None or stream.remote_closed:
            return
        stream.unacknowledged += size
        if stream.unacknowledged >= self._initial_recv_window // 2:
            stream.recv_window += stream.unacknowledged
            self._control(WINDOW_UPDATE, 0, struct.pack(">II", stream_id, stream.unacknowledged))
            stream.unacknowledged = 0

    def ping(self) -> int:
        """Queue a PING of ours; :class:`PingAcknowledged` reports its answer."""
        ping_id = self._next_ping
        self._next_ping = (self._next_ping + 2) & 0xFFFFFFFF
        self._control(PING, 0, struct.pack(">I", ping_id))
        return ping_id

    def send_settings(self, settings: dict[int, int]) -> None:
        body = struct.pack(">I", len(settings)) + b"".join(
            struct.pack(">II", key & 0xFFFFFF, value) for key, value in settings.items())
        self._control(SETTINGS, 0, body)
        if SETTINGS_INITIAL_WINDOW_SIZE in settings:
            self._initial_recv_window = settings[SETTINGS_INITIAL_WINDOW_SIZE]

    def goaway(self, status: int = GOAWAY_OK) -> None:
        """Queue GOAWAY (once): no new streams either way; open ones may finish."""
        if not self.goaway_sent:
            self.goaway_sent = True
            self._control(GOAWAY, 0, struct.pack(">II", self._last_remote_id, status))

    def open_streams(self) -> list[int]:
        return sorted(self._streams)

    def _stream(self, stream_id: int) -> _Stream:
        stream = self._streams.get(stream_id)
        if stream is None:
            raise LocalProtocolError(f"no open SPDY stream {stream_id}")
        return stream

    def _close_local(self, stream_id: int, stream: _Stream) -> None:
        stream.local_closed = True
        if stream.remote_closed:
            self._streams.pop(stream_id, None)

    # -- input ------------------------------------------------------------------------------
    def receive_data(self, data: bytes) -> list[Event]:
        """Parse ``data`` (appended to what came before); return the events of complete frames."""
        if self._failed:
            return []
        self._buffer += data
        events: list[Event] = []
        while len(self._buffer) >= 8:
            first, flags_length = struct.unpack_from(">II", self._buffer)
            flags, length = flags_length >> 24, flags_length & 0xFFFFFF
            control = bool(first & 0x80000000)
            if control and length > MAX_CONTROL_FRAME:
                return events + [self._fail("SPDY control frame too large")]
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8: 8 + length])
            del self._buffer[: 8 + length]
            try:
                if control:
                    version, kind = first >> 16 & 0x7FFF, first & 0xFFFF
                    if version != VERSION:
                        return events + [self._fail(f"SPDY version {version} is not 3")]
                    events.extend(self._on_control(kind, flags, payload))
                else:
                    events.extend(self._on_data(first & 0x7FFFFFFF, flags, payload))
            except RemoteProtocolError as err:
                return events + [self._fail(str(err))]
        return events

    def _fail(self, reason: str) -> ConnectionFailed:
        self._failed = True
        self._buffer.clear()
        self.goaway(GOAWAY_PROTOCOL_ERROR)
        return ConnectionFailed(reason)

    def _reset_by_us(self, stream_id: int, status: int) -> list[Event]:
        known = stream_id in self._streams
        self._streams.pop(stream_id, None)
        self._control(RST_STREAM, 0, struct.pack(">II", stream_id, status))
        return [StreamReset(stream_id, status, local=True)] if known else []

    def _on_data(self, stream_id: int, flags: int, payload: bytes) -> list[Event]:
        stream = self._streams.get(stream_id)
        if stream is None:
            # §2.4.2: data on a stream we do not know; a reset one may still have frames in flight
            return [] if stream_id <= max(self._last_remote_id, self._next_id) else \
                self._reset_by_us(stream_id, INVALID_STREAM)
        if stream.remote_closed:
            return self._reset_by_us(stream_id, STREAM_ALREADY_CLOSED)
        stream.recv_window -= len(payload)
        self._connection_recv_window -= len(payload)
        if self.strict_flow_control and (stream.recv_window < 0 or self._connection_recv_window < 0):
            return self._reset_by_us(stream_id, FLOW_CONTROL_ERROR)
        events: list[Event] = [DataReceived(stream_id, payload)] if payload else []
        if flags & FLAG_FIN:
            events.append(self._close_remote(stream_id, stream))
        return events

    def _close_remote(self, stream_id: int, stream: _Stream) -> StreamEnded:
        stream.remote_closed = True
        if stream.local_closed:
            self._streams.pop(stream_id, None)
        return StreamEnded(stream_id)

    def _on_control(self, kind: int, flags: int, payload: bytes) -> list[Event]:
        if kind == SYN_STREAM:
            return self._on_syn_stream(flags, payload)
        if kind in (SYN_REPLY, HEADERS):
            if len(payload) < 4:
                raise RemoteProtocolError("short SPDY frame")
            stream_id = struct.unpack_from(">I", payload)[0] & 0x7FFFFFFF
            headers = self._decompressor.decompress(payload[4:])  # always: keeps the zlib context in step
            stream = self._streams.get(stream_id)
            if stream is None:
                return []
            if kind == SYN_REPLY:
                if stream_id % 2 != self._next_id % 2 or stream_id in self._replied_by_peer:
                    return self._reset_by_us(stream_id, STREAM_IN_USE)
                self._replied_by_peer.add(stream_id)
                events: list[Event] = [StreamReplied(stream_id, headers, bool(flags & FLAG_FIN))]
            else:
                events = [HeadersReceived(stream_id, headers, bool(flags & FLAG_FIN))]
            if flags & FLAG_FIN:
                events.append(self._close_remote(stream_id, stream))
            return events
        if kind == RST_STREAM:
            stream_id, status = self._two_words(payload)
            return [StreamReset(stream_id, status)] if self._streams.pop(stream_id, None) is not None else []
        if kind == SETTINGS:
            return [self._on_settings(payload)]
        if kind == PING:
            if len(payload) != 4:
                raise RemoteProtocolError("SPDY PING is not 4 bytes")
            (ping_id,) = struct.unpack(">I", payload)
            if ping_id % 2 == self._next_ping % 2:
                return [PingAcknowledged(ping_id)]
            self._control(PING, 0, payload)  # §2.6.5: echo the peer's ping
            return []
        if kind == GOAWAY:
            last, status = self._two_words(payload) if len(payload) == 8 else (self._one_word(payload), 0)
            self.goaway_received = True
            return [GoAwayReceived(last, status)]
        if kind == WINDOW_UPDATE:
            stream_id, delta = self._two_words(payload)
            delta &= 0x7FFFFFFF
            if delta == 0:
                raise RemoteProtocolError("SPDY WINDOW_UPDATE of 0")
            self.peer_flow_control = True
            if stream_id == 0:
                self.connection_send_window = min(MAX_WINDOW, self.connection_send_window + delta)
                return [WindowUpdated(0, delta)]
            stream = self._streams.get(stream_id)
            if stream is None:
                return []
            if stream.send_window + delta > MAX_WINDOW:
                return self._reset_by_us(stream_id, FLOW_CONTROL_ERROR)
            stream.send_window += delta
            return [WindowUpdated(stream_id, delta)]
        return []  # §2.6: unknown control frames are ignored (CREDENTIAL included)

    @staticmethod
    def _two_words(payload: bytes) -> tuple[int, int]:
        if len(payload) != 8:
            raise RemoteProtocolError("SPDY control frame of the wrong size")
        first, second = struct.unpack(">II", payload)
        return first & 0x7FFFFFFF, second

    @staticmethod
    def _one_word(payload: bytes) -> int:
        if len(payload) != 4:
            raise RemoteProtocolError("SPDY control frame of the wrong size")
        return struct.unpack(">I", payload)[0] & 0x7FFFFFFF

    def _on_settings(self, payload: bytes) -> SettingsReceived:
        if len(payload) < 4:
            raise RemoteProtocolError("short SPDY SETTINGS")
        (count,) = struct.unpack_from(">I", payload)
        if len(payload) != 4 + 8 * count:
            raise RemoteProtocolError("SPDY SETTINGS of the wrong size")
        settings = {}
        for index in range(count):
            key, value = struct.unpack_from(">II", payload, 4 + 8 * index)
            settings[key & 0xFFFFFF] = value
        window = settings.get(SETTINGS_INITIAL_WINDOW_SIZE)
        if window is not None:
            if window > MAX_WINDOW:
                raise RemoteProtocolError("SPDY initial window too large")
            self.peer_flow_control = True
            delta = window - self._peer_initial_window
            self._peer_initial_window = window
            for stream in self._streams.values():  # §2.6.8: open streams' windows move too
                stream.send_window += delta
        return SettingsReceived(settings)

    def _on_syn_stream(self, flags: int, payload: bytes) -> list[Event]:
        if len(payload) < 10:
            raise RemoteProtocolError("short SPDY SYN_STREAM")
        stream_id, associated = struct.unpack_from(">II", payload)
        stream_id &= 0x7FFFFFFF
        associated &= 0x7FFFFFFF
        headers = self._decompressor.decompress(payload[10:])
        if stream_id == 0 or stream_id % 2 == self._next_id % 2:
            raise RemoteProtocolError(f"SPDY SYN_STREAM with our stream id {stream_id}")
        if stream_id <= self._last_remote_id:  # §2.3.2: ids only grow; a reused one is in use
            raise RemoteProtocolError(f"SPDY SYN_STREAM id {stream_id} not above {self._last_remote_id}")
        self._last_remote_id = stream_id
        if self.goaway_sent:
            self._control(RST_STREAM, 0, struct.pack(">II", stream_id, REFUSED_STREAM))
            return []
        fin, unidirectional = bool(flags & FLAG_FIN), bool(flags & FLAG_UNIDIRECTIONAL)
        self._streams[stream_id] = _Stream(remote_closed=fin, local_closed=unidirectional,
                                           send_window=self._peer_initial_window,
                                           recv_window=self._initial_recv_window)
        return [StreamOpened(stream_id, headers, fin, unidirectional, associated)]
