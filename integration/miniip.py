"""A minimal IPv4 layer for testing the user-space WireGuard core: ICMP echo and UDP.

Pure functions (no I/O): :func:`handle` takes a packet delivered by the tunnel and
returns the reply packet (ICMP echo reply) or records a UDP datagram; :func:`udp_packet`
builds an IPv4/UDP packet with correct header and UDP checksums (RFC 791 §3.1,
RFC 768, RFC 1071 for the one's-complement sum). Test and benchmark helper for driving the
WireGuard core at the packet level (the engine's own stack is :mod:`anex_agent.netstack`).
"""

from __future__ import annotations

import ipaddress
import struct
from dataclasses import dataclass

PROTO_ICMP = 1
PROTO_UDP = 17


def checksum(data: bytes) -> int:
    """RFC 1071 Internet checksum."""
    if len(data) % 2:
        data += b"\x00"
    total = sum(struct.unpack(f"!{len(data) // 2}H", data))
    while total >> 16:
        total = (total & 0xFFFF) + (total >> 16)
    return ~total & 0xFFFF


def ipv4_header(src: bytes, dst: bytes, proto: int, payload_len: int, ident: int = 0, ttl: int = 64) -> bytes:
    header = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + payload_len, ident, 0x4000, ttl, proto, 0, src, dst)
    return header[:10] + struct.pack("!H", checksum(header)) + header[12:]


def udp_packet(src: str, dst: str, sport: int, dport: int, payload: bytes) -> bytes:
    s, d = ipaddress.IPv4Address(src).packed, ipaddress.IPv4Address(dst).packed
    length = 8 + len(payload)
    pseudo = s + d + struct.pack("!BBH", 0, PROTO_UDP, length)
    udp = struct.pack("!HHHH", sport, dport, length, 0) + payload
    csum = checksum(pseudo + udp) or 0xFFFF
    udp = udp[:6] + struct.pack("!H", csum) + udp[8:]
    return ipv4_header(s, d, PROTO_UDP, length) + udp


@dataclass(frozen=True)
class UdpDatagram:
    src: str
    dst: str
    sport: int
    dport: int
    payload: bytes


def handle(packet: bytes, local: str) -> tuple[bytes | None, UdpDatagram | None]:
    """(reply packet or None, received UDP datagram or None) for one packet addressed to ``local``."""
    if len(packet) < 20 or packet[0] >> 4 != 4 or checksum(packet[: (packet[0] & 0xF) * 4]) != 0:
        return None, None
    ihl = (packet[0] & 0xF) * 4
    total = struct.unpack("!H", packet[2:4])[0]
    src, dst, proto = packet[12:16], packet[16:20], packet[9]
    if dst != ipaddress.IPv4Address(local).packed:
        return None, None
    body = packet[ihl:total]
    if proto == PROTO_ICMP and len(body) >= 8 and body[0] == 8 and checksum(body) == 0:
        reply = b"\x00\x00\x00\x00" + body[4:]
        reply = reply[:2] + struct.pack("!H", checksum(reply)) + reply[4:]
        return ipv4_header(dst, src, PROTO_ICMP, len(reply)) + reply, None
    if proto == PROTO_UDP and len(body) >= 8:
        sport, dport, length, _ = struct.unpack("!HHHH", body[:8])
        return None, UdpDatagram(str(ipaddress.IPv4Address(src)), str(ipaddress.IPv4Address(dst)),
                                 sport, dport, body[8:length])
    return None, None
