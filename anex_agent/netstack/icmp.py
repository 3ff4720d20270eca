"""ICMP (RFC 792): we answer echo requests; everything else is ignored."""

from __future__ import annotations

from anex_agent.netstack import ipv4
from anex_agent.netstack.checksum import checksum, partial

ECHO_REPLY = 0
ECHO_REQUEST = 8


def echo_reply(packet: ipv4.Packet) -> bytes | None:
    """The reply to an echo request addressed to us, or None (not an echo request, bad checksum)."""
    msg = packet.payload
    if len(msg) < 8 or msg[0] != ECHO_REQUEST or partial(msg) != 0:
        return None
    body = bytearray(msg)
    body[0] = ECHO_REPLY
    body[2:4] = b"\0\0"
    body[2:4] = checksum(body).to_bytes(2, "big")
    return ipv4.build(packet.dst, packet.src, ipv4.PROTO_ICMP, bytes(body))
