"""IPv4 (RFC 791) for a single host on a point-to-point link: parse, validate, build.

Fragments are refused (a packet with MF set or a fragment offset is dropped): the
tunnel's MTU is known to both ends and our TCP's MSS fits it, so the peers we talk to
do not fragment; RFC 6864 lets us send atomic datagrams with DF set and ID 0.
Options in received headers are accepted and skipped; we never send any.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

from anex_agent.errors import RemoteProtocolError
from anex_agent.netstack.checksum import finish, partial

VERSION_IHL = 0x45  # version 4, header of 5 words
HEADER = struct.Struct("!BBHHHBBH4s4s")
HEADER_LEN = 20
DF = 0x4000
MF = 0x2000
OFFSET_MASK = 0x1FFF
DEFAULT_TTL = 64
PROTO_ICMP = 1
PROTO_TCP = 6
PROTO_UDP = 17


class PacketError(RemoteProtocolError, ValueError):
    """A packet we drop; the text says why (for counters, never sent anywhere)."""


class Packet(NamedTuple):
    """A parsed, validated IPv4 packet. ``payload`` is a memoryview into the original bytes.
    (A NamedTuple: one per received packet, and it costs a quarter of a frozen dataclass.)"""

    src: bytes
    dst: bytes
    protocol: int
    ttl: int
    payload: memoryview


def parse(data: bytes, *, verify: bool = True) -> Packet:
    """Validate version, header length, total length, header checksum (unless ``verify`` is
    False: a link that authenticates every packet) and fragments."""
    if len(data) < HEADER_LEN:
        raise PacketError("shorter than an IPv4 header")
    vihl, _tos, total, _ident, frag, ttl, proto, _csum, src, dst = HEADER.unpack_from(data)
    if vihl >> 4 != 4:
        raise PacketError("not IPv4")
    ihl = (vihl & 0xF) * 4
    if ihl < HEADER_LEN or total < ihl or total > len(data):
        raise PacketError("bad header or total length")
    if verify and partial(memoryview(data)[:ihl]) != 0:
        raise PacketError("bad header checksum")
    if frag & (MF | OFFSET_MASK):
        raise PacketError("fragment (fragments are not reassembled)")
    return Packet(src, dst, proto, ttl, memoryview(data)[ihl:total])


class HeaderTemplate:
    """IPv4 headers from ``src`` to ``dst`` for one protocol: only the length varies, so the
    checksum is the precomputed sum plus the length (one addition per packet)."""

    __slots__ = ("src", "dst", "protocol", "_base")

    def __init__(self, src: bytes, dst: bytes, protocol: int) -> None:
        self.src, self.dst, self.protocol = src, dst, protocol
        self._base = partial(HEADER.pack(VERSION_IHL, 0, 0, 0, DF, DEFAULT_TTL, protocol, 0, src, dst))

    def build(self, payload_len: int) -> bytes:
        total = HEADER_LEN + payload_len
        return HEADER.pack(VERSION_IHL, 0, total, 0, DF, DEFAULT_TTL, self.protocol,
                           finish(self._base + total), self.src, self.dst)


def build(src: bytes, dst: bytes, protocol: int, payload: bytes, ttl: int = DEFAULT_TTL) -> bytes:
    """A whole packet (for the rare paths: ICMP, UDP)."""
    total = HEADER_LEN + len(payload)
    header = HEADER.pack(VERSION_IHL, 0, total, 0, DF, ttl, protocol, 0, src, dst)
    csum = finish(partial(header))
    return header[:10] + csum.to_bytes(2, "big") + header[12:] + bytes(payload)
