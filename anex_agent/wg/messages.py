"""WireGuard message formats (whitepaper §5.4.2, §5.4.3, §5.4.6, §5.4.7).

Every message starts with a one-byte type and three reserved zero bytes; integers are
little endian. :func:`parse` checks the type, the reserved bytes and the length (exact for
types 1-3; for type 4 at least header + tag, since the padded payload may be any length)
and returns one of the frozen dataclasses below. Anything else raises
:class:`RemoteProtocolError` -- never ``struct.error``, ``IndexError`` or ``ValueError``.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from anex_agent.errors import LocalProtocolError, RemoteProtocolError
from anex_agent.wg.constants import (
    COOKIE_REPLY_SIZE,
    INITIATION_SIZE,
    MAC_SIZE,
    MESSAGE_COOKIE_REPLY,
    MESSAGE_INITIATION,
    MESSAGE_RESPONSE,
    MESSAGE_TRANSPORT,
    RESPONSE_SIZE,
    TRANSPORT_HEADER_SIZE,
    TRANSPORT_MIN_SIZE,
)

_HEADER = struct.Struct("<I")  # type byte + 3 reserved bytes, read as one LE word
_INITIATION = struct.Struct("<II32s48s28s16s16s")
_RESPONSE = struct.Struct("<III32s16s16s16s")
_COOKIE_REPLY = struct.Struct("<II24s32s")
_TRANSPORT_HEADER = struct.Struct("<IIQ")
TRANSPORT_HEADER = _TRANSPORT_HEADER  # type word (type + reserved bytes), receiver index, counter


@dataclass(frozen=True, slots=True)
class Initiation:
    """Type 1: handshake initiation (148 bytes)."""

    sender: int
    ephemeral: bytes  # 32
    encrypted_static: bytes  # 32 + 16
    encrypted_timestamp: bytes  # 12 + 16
    mac1: bytes = bytes(MAC_SIZE)
    mac2: bytes = bytes(MAC_SIZE)

    def to_bytes(self) -> bytes:
        return _INITIATION.pack(
            MESSAGE_INITIATION, self.sender, self.ephemeral, self.encrypted_static,
            self.encrypted_timestamp, self.mac1, self.mac2,
        )


@dataclass(frozen=True, slots=True)
class Response:
    """Type 2: handshake response (92 bytes)."""

    sender: int
    receiver: int
    ephemeral: bytes  # 32
    encrypted_nothing: bytes  # 0 + 16
    mac1: bytes = bytes(MAC_SIZE)
    mac2: bytes = bytes(MAC_SIZE)

    def to_bytes(self) -> bytes:
        return _RESPONSE.pack(
            MESSAGE_RESPONSE, self.sender, self.receiver, self.ephemeral,
            self.encrypted_nothing, self.mac1, self.mac2,
        )


@dataclass(frozen=True, slots=True)
class CookieReply:
    """Type 3: cookie reply (64 bytes), sent instead of a response when under load."""

    receiver: int
    nonce: bytes  # 24
    encrypted_cookie: bytes  # 16 + 16

    def to_bytes(self) -> bytes:
        return _COOKIE_REPLY.pack(MESSAGE_COOKIE_REPLY, self.receiver, self.nonce, self.encrypted_cookie)


@dataclass(frozen=True, slots=True)
class Transport:
    """Type 4: transport data (16-byte header + encrypted, padded packet + 16-byte tag)."""

    receiver: int
    counter: int
    encrypted_packet: bytes

    def to_bytes(self) -> bytes:
        return _TRANSPORT_HEADER.pack(MESSAGE_TRANSPORT, self.receiver, self.counter) + self.encrypted_packet


Message = Initiation | Response | CookieReply | Transport


def transport_bytes(receiver: int, counter: int, encrypted_packet: bytes) -> bytes:
    """Serialise a transport message without building the dataclass (hot path)."""
    return _TRANSPORT_HEADER.pack(MESSAGE_TRANSPORT, receiver, counter) + encrypted_packet


def parse(data: bytes) -> Message:
    """Parse one datagram into a message, or raise RemoteProtocolError saying why not."""
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise LocalProtocolError("parse() takes bytes")
    if type(data) is not bytes:
        data = bytes(data)
    if len(data) < 4:
        raise RemoteProtocolError(f"datagram of {len(data)} bytes is shorter than a message header")
    (word,) = _HEADER.unpack_from(data)
    kind = word & 0xFF
    if word >> 8:
        raise RemoteProtocolError("reserved header bytes are not zero")
    if kind == MESSAGE_TRANSPORT:
        if len(data) < TRANSPORT_MIN_SIZE:
            raise RemoteProtocolError(f"transport message of {len(data)} bytes; minimum is {TRANSPORT_MIN_SIZE}")
        _, receiver, counter = _TRANSPORT_HEADER.unpack_from(data)
        return Transport(receiver, counter, data[TRANSPORT_HEADER_SIZE:])
    if kind == MESSAGE_INITIATION:
        _expect(data, INITIATION_SIZE, "initiation")
        _, sender, eph, static, ts, m1, m2 = _INITIATION.unpack(data)
        return Initiation(sender, eph, static, ts, m1, m2)
    if kind == MESSAGE_RESPONSE:
        _expect(data, RESPONSE_SIZE, "response")
        _, sender, receiver, eph, empty, m1, m2 = _RESPONSE.unpack(data)
        return Response(sender, receiver, eph, empty, m1, m2)
    if kind == MESSAGE_COOKIE_REPLY:
        _expect(data, COOKIE_REPLY_SIZE, "cookie reply")
        _, receiver, nonce, cookie = _COOKIE_REPLY.unpack(data)
        return CookieReply(receiver, nonce, cookie)
    raise RemoteProtocolError(f"unknown message type {kind}")


def _expect(data: bytes, size: int, what: str) -> None:
    if len(data) != size:
        raise RemoteProtocolError(f"{what} message of {len(data)} bytes; it must be exactly {size}")
