"""TCP segments on the wire (RFC 9293 §3.1): parse with checksum check, build with precomputed headers.

Options we read on SYNs: MSS (RFC 9293 §3.7.1), window scale (RFC 7323 §2), SACK-permitted
(RFC 2018 §2); on every segment timestamps (RFC 7323 §3); on other segments SACK blocks
(RFC 2018 §3), and only when the header has options at all. We send MSS, window scale,
SACK-permitted and timestamps on SYNs, timestamps on every segment once both sides agreed,
SACK blocks on ACKs while out-of-order data is held, nothing else.
"""

from __future__ import annotations

import struct

from anex_agent.netstack import ipv4
from anex_agent.netstack.checksum import finish, partial, pseudo_header_sum

HEADER = struct.Struct("!HHIIBBHHH")
HEADER_LEN = 20
FIN, SYN, RST, PSH, ACK, URG = 0x01, 0x02, 0x04, 0x08, 0x10, 0x20
OPT_END, OPT_NOP, OPT_MSS, OPT_WS, OPT_SACK_OK, OPT_SACK, OPT_TS = 0, 1, 2, 3, 4, 5, 8
MAX_SACK_BLOCKS = 4  # 2 + 4*8 = 34 option bytes: fits the 40 (no timestamps)
MAX_SACK_BLOCKS_TS = 3  # with the 12 bytes of timestamps: 12 + 2 + 2 + 3*8 = 40
MAX_WSCALE = 14  # RFC 7323 §2.3
DEFAULT_MSS = 536  # RFC 9293 §3.7.1 when the peer sends no MSS option


class Segment:
    """A received segment. ``payload`` is a memoryview into the packet; options are parsed on SYNs only."""

    __slots__ = ("src", "sport", "dport", "seq", "ack", "flags", "wnd", "payload", "mss", "wscale", "sack_ok", "sack",
                 "ts_val", "ts_ecr")

    def __init__(self, src, sport, dport, seq, ack, flags, wnd, payload) -> None:
        self.src, self.sport, self.dport, self.seq, self.ack = src, sport, dport, seq, ack
        self.flags, self.wnd, self.payload = flags, wnd, payload
        self.mss = None
        self.wscale = None
        self.sack_ok = False
        self.sack: list[tuple[int, int]] | None = None  # SACK blocks, 32-bit edges as on the wire
        self.ts_val: int | None = None  # RFC 7323 timestamps, when the segment has them
        self.ts_ecr = 0

    def __repr__(self) -> str:
        names = "".join(n for bit, n in ((SYN, "S"), (ACK, "."), (FIN, "F"), (RST, "R"), (PSH, "P")) if self.flags & bit)
        return f"<Segment {self.sport}->{self.dport} [{names}] seq={self.seq} ack={self.ack} wnd={self.wnd} len={len(self.payload)}>"


def parse(packet: ipv4.Packet, *, verify: bool = True) -> Segment:
    """Parse the TCP segment in ``packet``; raise :class:`ipv4.PacketError` when it is malformed."""
    msg = packet.payload
    n = len(msg)
    if n < HEADER_LEN:
        raise ipv4.PacketError("shorter than a TCP header")
    sport, dport, seq, ack, off, flags, wnd, _csum, _urg = HEADER.unpack_from(msg)
    hlen = (off >> 4) * 4
    if hlen < HEADER_LEN or hlen > n:
        raise ipv4.PacketError("bad TCP data offset")
    if verify and (pseudo_header_sum(packet.src, packet.dst, ipv4.PROTO_TCP) + n + partial(msg)) % 0xFFFF:
        raise ipv4.PacketError("bad TCP checksum")
    seg = Segment(packet.src, sport, dport, seq, ack, flags & 0x3F, wnd, msg[hlen:])
    if hlen > HEADER_LEN:
        _options(seg, msg[HEADER_LEN:hlen], flags & SYN)
    return seg


def _options(seg: Segment, opts: memoryview, syn: int) -> None:
    i, n = 0, len(opts)
    while i < n:
        kind = opts[i]
        if kind == OPT_END:
            return
        if kind == OPT_NOP:
            i += 1
            continue
        if i + 1 >= n or opts[i + 1] < 2 or i + opts[i + 1] > n:
            return  # malformed: ignore the rest (RFC 9293 §3.1 asks for robustness)
        length = opts[i + 1]
        if kind == OPT_TS and length == 10:
            seg.ts_val, seg.ts_ecr = struct.unpack_from("!II", opts, i + 2)
        elif kind == OPT_SACK and not syn and length >= 10 and (length - 2) % 8 == 0:
            edges = struct.unpack_from(f"!{(length - 2) // 4}I", opts, i + 2)
            seg.sack = list(zip(edges[::2], edges[1::2], strict=True))
        elif not syn:
            pass
        elif kind == OPT_MSS and length == 4:
            seg.mss = int.from_bytes(opts[i + 2:i + 4], "big")
        elif kind == OPT_WS and length == 3:
            seg.wscale = min(opts[i + 2], MAX_WSCALE)
        elif kind == OPT_SACK_OK and length == 2:
            seg.sack_ok = True
        i += length


def syn_options(mss: int, wscale: int | None, sack_ok: bool = False, timestamps: bytes = b"") -> bytes:
    """MSS, window scale when ``wscale`` is not None, SACK-permitted, then ``timestamps`` (a
    whole option, :meth:`timestamps.Timestamps.option`), padded to a multiple of 4."""
    out = bytes((OPT_MSS, 4)) + mss.to_bytes(2, "big")
    if wscale is not None:
        out += bytes((OPT_NOP, OPT_WS, 3, wscale))
    if sack_ok:
        out += bytes((OPT_NOP, OPT_NOP, OPT_SACK_OK, 2))
    return out + timestamps


def sack_option(blocks, max_blocks: int = MAX_SACK_BLOCKS) -> bytes:
    """A SACK option (RFC 2018 §3) for absolute ``(start, end)`` blocks, first block first, padded."""
    blocks = blocks[:max_blocks]
    out = bytes((OPT_NOP, OPT_NOP, OPT_SACK, 2 + 8 * len(blocks)))
    return out + struct.pack(f"!{2 * len(blocks)}I", *(e & 0xFFFFFFFF for b in blocks for e in b))


#: The IPv4 and TCP headers of a segment we send, packed at once (no IP options, ID 0, DF).
IP_TCP_HEADER = struct.Struct("!BBHHHBBH4s4sHHIIBBHHH")


class Builder:
    """Builds whole IPv4+TCP packets for one connection (addresses and ports fixed).

    Per segment: one ``struct.pack`` for both headers, the checksum of the header words by
    arithmetic (the constant part precomputed), one big-integer checksum over the payload
    (:mod:`~anex_agent.netstack.checksum`), one concatenation."""

    __slots__ = ("sport", "dport", "_src", "_dst", "_ip_base", "_tcp_base")

    def __init__(self, src: bytes, sport: int, dst: bytes, dport: int) -> None:
        self.sport, self.dport = sport, dport
        self._src, self._dst = src, dst
        # IPv4 header with total length 0 and checksum 0: only the length varies per packet
        self._ip_base = partial(ipv4.HEADER.pack(ipv4.VERSION_IHL, 0, 0, 0, ipv4.DF, ipv4.DEFAULT_TTL,
                                                 ipv4.PROTO_TCP, 0, src, dst))
        # pseudo-header without its length, plus the ports
        self._tcp_base = pseudo_header_sum(src, dst, ipv4.PROTO_TCP) + sport + dport

    def build(self, seq: int, ack: int, flags: int, wnd: int, payload=b"", options: bytes = b"") -> bytes:
        seq &= 0xFFFFFFFF
        ack &= 0xFFFFFFFF
        hlen = HEADER_LEN + len(options)
        tcp_len = hlen + len(payload)
        offset = hlen << 2
        total = (self._tcp_base + tcp_len + (seq >> 16) + (seq & 0xFFFF) + (ack >> 16) + (ack & 0xFFFF)
                 + (offset << 8 | flags) + wnd)
        if options:
            total += partial(options)
        if payload:
            total += partial(payload)
        ip_len = ipv4.HEADER_LEN + tcp_len
        header = IP_TCP_HEADER.pack(ipv4.VERSION_IHL, 0, ip_len, 0, ipv4.DF, ipv4.DEFAULT_TTL, ipv4.PROTO_TCP,
                                    finish(self._ip_base + ip_len), self._src, self._dst,
                                    self.sport, self.dport, seq, ack, offset, flags, wnd, finish(total), 0)
        if options:
            header += options
        return header + payload if payload else header


def build_reference(src: bytes, sport: int, dst: bytes, dport: int, seq: int, ack: int, flags: int, wnd: int,
                    payload=b"", options: bytes = b"") -> bytes:
    """The same packet as :meth:`Builder.build`, the plain way (two packs, checksums over the
    packed headers): what tests compare the builder with."""
    hlen = HEADER_LEN + len(options)
    header = HEADER.pack(sport, dport, seq & 0xFFFFFFFF, ack & 0xFFFFFFFF, hlen << 2, flags, wnd, 0, 0) + options
    csum = finish(pseudo_header_sum(src, dst, ipv4.PROTO_TCP) + hlen + len(payload) + partial(header)
                  + partial(bytes(payload)))
    return ipv4.build(src, dst, ipv4.PROTO_TCP, header[:16] + csum.to_bytes(2, "big") + header[18:] + bytes(payload))
