"""Cryptokey routing: the allowed-IPs table (whitepaper §2 "Cryptokey Routing").

Each peer owns a set of IP prefixes. Sending, the destination address of a packet picks
the peer owning the longest matching prefix; receiving, a decrypted packet is delivered
only when its source address lies in the sending peer's prefixes. A prefix belongs to at
most one peer: inserting it for another peer moves it (as ``wg set ... allowed-ips`` does).

The table keeps, per address family, one dict per prefix length; a lookup tries the
lengths present from longest to shortest (at most 33 or 129 dict probes). Answers are
remembered per address (:data:`LOOKUP_CACHE` of them, forgotten on any change of the table),
so the packets of a flow cost one dict probe each.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Hashable, Iterable

from anex_agent import parse
from anex_agent.errors import LocalProtocolError

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

#: Addresses whose lookup answer is remembered; the cache starts over when it is full.
LOOKUP_CACHE = 4096


def parse_prefix(text: str | Network) -> Network:
    """Parse ``"10.0.0.0/24"`` / ``"fd00::1/128"`` / a bare address (host prefix); host bits are cleared."""
    try:
        return parse.cidr(text) if isinstance(text, str) else ipaddress.ip_network(text, strict=False)
    except ValueError as exc:
        raise LocalProtocolError(f"allowed IP {text!r} is not an IP prefix: {exc}") from None


class AllowedIPs:
    def __init__(self) -> None:
        # family bits (32/128) -> prefix length -> network int -> peer key
        self._tables: dict[int, dict[int, dict[int, Hashable]]] = {32: {}, 128: {}}
        self._lengths: dict[int, list[int]] = {32: [], 128: []}
        self._cache: dict[bytes, Hashable | None] = {}

    def insert(self, prefix: str | Network, peer: Hashable) -> None:
        net = parse_prefix(prefix)
        bits = net.max_prefixlen
        by_len = self._tables[bits]
        if net.prefixlen not in by_len:
            by_len[net.prefixlen] = {}
            self._lengths[bits] = sorted(by_len, reverse=True)
        by_len[net.prefixlen][int(net.network_address)] = peer
        self._cache.clear()

    def remove_peer(self, peer: Hashable) -> None:
        for bits, by_len in self._tables.items():
            for length in list(by_len):
                table = by_len[length]
                for key in [k for k, v in table.items() if v == peer]:
                    del table[key]
                if not table:
                    del by_len[length]
            self._lengths[bits] = sorted(by_len, reverse=True)
        self._cache.clear()

    def replace_peer(self, peer: Hashable, prefixes: Iterable[str | Network]) -> None:
        self.remove_peer(peer)
        for prefix in prefixes:
            self.insert(prefix, peer)

    def prefixes_of(self, peer: Hashable) -> list[Network]:
        out: list[Network] = []
        for bits, by_len in self._tables.items():
            cls = ipaddress.IPv4Network if bits == 32 else ipaddress.IPv6Network
            for length, table in by_len.items():
                out += [cls((k, length)) for k, v in table.items() if v == peer]
        return sorted(out, key=lambda n: (n.version, n.network_address, n.prefixlen))

    def lookup(self, address: bytes) -> Hashable | None:
        """Peer owning the longest prefix containing ``address`` (4 or 16 packed bytes), or None."""
        try:
            return self._cache[address]
        except KeyError:
            pass
        except TypeError:  # a memoryview or bytearray: not hashable, look it up as bytes
            address = bytes(address)
        peer = self._lookup(address)
        cache = self._cache
        if len(cache) >= LOOKUP_CACHE:
            cache.clear()
        cache[address] = peer
        return peer

    def _lookup(self, address: bytes) -> Hashable | None:
        bits = len(address) * 8
        by_len = self._tables.get(bits)
        if not by_len:
            return None
        value = int.from_bytes(address, "big")
        for length in self._lengths[bits]:
            peer = by_len[length].get(value >> (bits - length) << (bits - length))
            if peer is not None:
                return peer
        return None


def packet_addresses(packet: bytes) -> tuple[bytes, bytes, int] | None:
    """(source, destination, total length) of an IPv4/IPv6 packet, or None when it is not one.

    Total length is taken from the header (IPv4 total length, IPv6 payload length + 40) so
    the receiver can strip the transport padding (§5.4.6).
    """
    if not packet:
        return None
    version = packet[0] >> 4
    if version == 4 and len(packet) >= 20:
        return packet[12:16], packet[16:20], int.from_bytes(packet[2:4], "big")
    if version == 6 and len(packet) >= 40:
        return packet[8:24], packet[24:40], 40 + int.from_bytes(packet[4:6], "big")
    return None
