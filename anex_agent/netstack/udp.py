"""UDP (RFC 768): parse with checksum check, build. Ports are bound by :class:`~anex_agent.netstack.stack.Stack`."""

from __future__ import annotations

import struct
from dataclasses import dataclass

from anex_agent.netstack import ipv4
from anex_agent.netstack.checksum import finish, partial, pseudo_header_sum

HEADER = struct.Struct("!HHHH")


@dataclass(frozen=True, slots=True)
class Datagram:
    src: bytes
    src_port: int
    dst: bytes
    dst_port: int
    data: bytes


def parse(packet: ipv4.Packet, *, verify: bool = True) -> Datagram:
    msg = packet.payload
    if len(msg) < 8:
        raise ipv4.PacketError("shorter than a UDP header")
    sport, dport, length, csum = HEADER.unpack_from(msg)
    if length < 8 or length > len(msg):
        raise ipv4.PacketError("bad UDP length")
    msg = msg[:length]
    if verify and csum and (pseudo_header_sum(packet.src, packet.dst, ipv4.PROTO_UDP) + length + partial(msg)) % 0xFFFF:
        raise ipv4.PacketError("bad UDP checksum")
    return Datagram(packet.src, sport, packet.dst, dport, bytes(msg[8:]))


def build(src: bytes, sport: int, dst: bytes, dport: int, data: bytes) -> bytes:
    """A whole IPv4 packet carrying ``data`` (always with a checksum)."""
    length = 8 + len(data)
    csum = finish(pseudo_header_sum(src, dst, ipv4.PROTO_UDP) + length + partial(HEADER.pack(sport, dport, length, 0))
                  + partial(data))
    return ipv4.build(src, dst, ipv4.PROTO_UDP, HEADER.pack(sport, dport, length, csum) + data)
