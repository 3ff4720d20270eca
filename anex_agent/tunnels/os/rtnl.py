"""Just enough rtnetlink for our own interfaces: links, addresses and routes (blocking).

One ``AF_NETLINK``/``NETLINK_ROUTE`` socket, one request at a time, each acknowledged
(``NLM_F_ACK``) or read to ``NLMSG_DONE``; formats from ``linux/netlink.h``,
``linux/rtnetlink.h``, ``linux/if_link.h`` and ``linux/if_addr.h`` (RFC 3549 describes
the protocol). A failed request raises :class:`NetlinkError`, an ``OSError`` whose
``errno`` is the kernel's answer.

Why not pyroute2: the native engines need a handful of requests; pyroute2 costs about
9 MB of resident memory in every agent for them. The kernel engine still uses pyroute2
for WireGuard's generic netlink family, imported only there.

Encoding and decoding (:func:`encode`, :func:`decode`) are pure, so they are tested
without privileges; :class:`Rtnl` does the socket I/O and is meant to run in a thread.
"""

from __future__ import annotations

import errno as errno_mod
import ipaddress
import os
import socket
import struct
from dataclasses import dataclass

from anex_agent.errors import AnexError

# linux/netlink.h
NLMSG_ERROR = 2
NLMSG_DONE = 3
NLM_F_REQUEST = 0x1
NLM_F_ACK = 0x4
NLM_F_DUMP = 0x300
NLM_F_REPLACE = 0x100
NLM_F_EXCL = 0x200
NLM_F_CREATE = 0x400
NLA_TYPE_MASK = 0x3FFF  # without NLA_F_NESTED / NLA_F_NET_BYTEORDER

# linux/rtnetlink.h
RTM_NEWLINK, RTM_DELLINK, RTM_GETLINK = 16, 17, 18
RTM_NEWADDR, RTM_DELADDR, RTM_GETADDR = 20, 21, 22
RTM_NEWROUTE, RTM_DELROUTE, RTM_GETROUTE = 24, 25, 26
RT_TABLE_MAIN = 254
RT_SCOPE_UNIVERSE = 0
RT_SCOPE_NOWHERE = 255
RTN_UNICAST = 1
RTA_DST, RTA_OIF, RTA_TABLE = 1, 4, 15

# linux/if_link.h, linux/if.h
IFLA_IFNAME, IFLA_MTU, IFLA_LINKINFO = 3, 4, 18
IFLA_INFO_KIND = 1
IFF_UP = 0x1

# linux/if_addr.h
IFA_ADDRESS, IFA_LOCAL = 1, 2

_HEADER = struct.Struct("=IHHII")  # nlmsghdr: len, type, flags, seq, pid
_IFINFO = struct.Struct("=BxHiII")  # ifinfomsg: family, type, index, flags, change
_IFADDR = struct.Struct("=BBBBI")  # ifaddrmsg: family, prefixlen, flags, scope, index
_RTMSG = struct.Struct("=BBBBBBBBI")  # rtmsg: family, dst_len, src_len, tos, table, protocol, scope, type, flags
_ATTR = struct.Struct("=HH")  # rtattr: len, type
_U32 = struct.Struct("=I")
_ERR = struct.Struct("=i")

#: Receive buffer per datagram; a bigger datagram is read whole after a peek at its size.
RECV_SIZE = 1 << 15


class NetlinkError(AnexError, OSError):
    """The kernel refused a request; ``errno`` says why."""


@dataclass(frozen=True)
class Link:
    index: int
    name: str
    mtu: int | None
    flags: int
    kind: str | None  # IFLA_INFO_KIND (``wireguard``, ``tun``), None when the kernel names none


@dataclass(frozen=True)
class Route:
    family: int
    dst: str  # network address, e.g. ``10.96.0.0`` (``0.0.0.0`` / ``::`` for a default route)
    dst_len: int
    table: int
    proto: int
    oif: int | None


# ---------------------------------------------------------------- pure encoding / decoding


def _align(n: int) -> int:
    return (n + 3) & ~3


def attr(kind: int, payload: bytes) -> bytes:
    """One rtattr, padded to 4 bytes. Pure."""
    raw = _ATTR.pack(_ATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (_align(len(raw)) - len(raw))


def attrs(data: bytes, offset: int = 0) -> dict[int, bytes]:
    """The rtattrs of ``data`` from ``offset`` on, by type (the last wins). Pure."""
    out: dict[int, bytes] = {}
    while offset + _ATTR.size <= len(data):
        length, kind = _ATTR.unpack_from(data, offset)
        if length < _ATTR.size or offset + length > len(data):
            break
        out[kind & NLA_TYPE_MASK] = data[offset + _ATTR.size:offset + length]
        offset += _align(length)
    return out


def encode(msg_type: int, flags: int, seq: int, body: bytes) -> bytes:
    """A netlink request (``NLM_F_REQUEST`` added). Pure."""
    return _HEADER.pack(_HEADER.size + len(body), msg_type, flags | NLM_F_REQUEST, seq, 0) + body


def decode(data: bytes) -> list[tuple[int, int, int, bytes]]:
    """The messages of one datagram as ``(type, flags, seq, payload)``. Pure."""
    out = []
    offset = 0
    while offset + _HEADER.size <= len(data):
        length, msg_type, flags, seq, _pid = _HEADER.unpack_from(data, offset)
        if length < _HEADER.size or offset + length > len(data):
            break
        out.append((msg_type, flags, seq, data[offset + _HEADER.size:offset + length]))
        offset += _align(length)
    return out


def _cstr(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def parse_link(payload: bytes) -> Link:
    """An RTM_NEWLINK payload. Pure."""
    _family, _type, index, flags, _change = _IFINFO.unpack_from(payload)
    found = attrs(payload, _IFINFO.size)
    kind = None
    if IFLA_LINKINFO in found:
        info = attrs(found[IFLA_LINKINFO])
        kind = _cstr(info[IFLA_INFO_KIND]) if IFLA_INFO_KIND in info else None
    mtu = _U32.unpack(found[IFLA_MTU])[0] if IFLA_MTU in found else None
    return Link(index=index, name=_cstr(found.get(IFLA_IFNAME, b"")), mtu=mtu, flags=flags, kind=kind)


def parse_addr(payload: bytes) -> tuple[int, str, int]:
    """An RTM_NEWADDR payload as ``(index, address, prefixlen)``. Pure."""
    family, prefixlen, _flags, _scope, index = _IFADDR.unpack_from(payload)
    found = attrs(payload, _IFADDR.size)
    raw = found.get(IFA_ADDRESS) or found.get(IFA_LOCAL) or b""
    return index, str(ipaddress.ip_address(raw)) if raw else "", prefixlen


def parse_route(payload: bytes) -> Route:
    """An RTM_NEWROUTE payload. Pure."""
    family, dst_len, _src, _tos, table, proto, _scope, _type, _flags = _RTMSG.unpack_from(payload)
    found = attrs(payload, _RTMSG.size)
    if RTA_TABLE in found:
        table = _U32.unpack(found[RTA_TABLE])[0]
    if RTA_DST in found:
        dst = str(ipaddress.ip_address(found[RTA_DST]))
    else:
        dst = "0.0.0.0" if family == socket.AF_INET else "::"
    oif = _U32.unpack(found[RTA_OIF])[0] if RTA_OIF in found else None
    return Route(family=family, dst=dst, dst_len=dst_len, table=table, proto=proto, oif=oif)


def link_request(*, index: int = 0, name: str | None = None, kind: str | None = None, mtu: int | None = None,
                 up: bool = False) -> bytes:
    """An ifinfomsg body (RTM_NEWLINK/RTM_DELLINK). Pure."""
    body = _IFINFO.pack(socket.AF_UNSPEC, 0, index, IFF_UP if up else 0, IFF_UP if up else 0)
    if name is not None:
        body += attr(IFLA_IFNAME, name.encode() + b"\0")
    if mtu is not None:
        body += attr(IFLA_MTU, _U32.pack(mtu))
    if kind is not None:
        body += attr(IFLA_LINKINFO, attr(IFLA_INFO_KIND, kind.encode()))
    return body


def addr_request(index: int, interface: str) -> bytes:
    """An ifaddrmsg body for ``interface`` (``10.0.0.1/24``) on ``index``; IPv4 carries IFA_LOCAL too. Pure."""
    iface = ipaddress.ip_interface(interface)
    family = socket.AF_INET if iface.version == 4 else socket.AF_INET6
    body = _IFADDR.pack(family, iface.network.prefixlen, 0, RT_SCOPE_UNIVERSE, index)
    if family == socket.AF_INET:
        body += attr(IFA_LOCAL, iface.ip.packed)
    return body + attr(IFA_ADDRESS, iface.ip.packed)


def route_request(cidr: str, oif: int, proto: int, *, delete: bool = False) -> bytes:
    """An rtmsg body: ``cidr`` through ``oif`` in the main table, marked ``proto``. Pure.

    Added routes are unicast, scope universe (as pyroute2 and ``ip route`` without ``scope``
    make them); a deletion matches any scope (RT_SCOPE_NOWHERE, as ``ip route del``)."""
    net = ipaddress.ip_network(cidr, strict=False)
    family = socket.AF_INET if net.version == 4 else socket.AF_INET6
    scope = RT_SCOPE_NOWHERE if delete else RT_SCOPE_UNIVERSE
    body = _RTMSG.pack(family, net.prefixlen, 0, 0, RT_TABLE_MAIN, proto, scope, RTN_UNICAST, 0)
    if net.prefixlen:
        body += attr(RTA_DST, net.network_address.packed)
    return body + attr(RTA_OIF, _U32.pack(oif))


# ---------------------------------------------------------------- blocking socket I/O


class Rtnl:
    """A NETLINK_ROUTE socket; use as a context manager. Blocking: call it from a thread."""

    def __init__(self) -> None:
        self._sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW | socket.SOCK_CLOEXEC, socket.NETLINK_ROUTE)
        try:
            self._sock.bind((0, 0))
        except OSError:
            self._sock.close()
            raise
        self._seq = 0

    def close(self) -> None:
        self._sock.close()

    def __enter__(self) -> Rtnl:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(self, msg_type: int, flags: int, body: bytes) -> list[bytes]:
        """Send one request; the payloads of its answer (a dump's items; nothing for an ack).

        NetlinkError when the kernel answers with an error."""
        self._seq += 1
        seq = self._seq
        dump = (flags & NLM_F_DUMP) == NLM_F_DUMP
        self._sock.send(encode(msg_type, flags if dump else flags | NLM_F_ACK, seq, body))
        items: list[bytes] = []
        while True:
            for kind, _flags, got_seq, payload in decode(self._receive()):
                if got_seq != seq:
                    continue  # an answer to an earlier request we gave up on
                if kind in (NLMSG_ERROR, NLMSG_DONE):
                    code = _ERR.unpack_from(payload)[0] if len(payload) >= _ERR.size else 0
                    if code < 0:
                        raise NetlinkError(-code, os.strerror(-code))
                    return items
                items.append(payload)

    def _receive(self) -> bytes:
        """One whole datagram: MSG_PEEK|MSG_TRUNC tells its real size first (as iproute2 does),
        so a big one (a link with many attributes) is never cut short."""
        size = self._sock.recv_into(bytearray(16), 16, socket.MSG_PEEK | socket.MSG_TRUNC)
        return self._sock.recv(max(size, RECV_SIZE))

    # links

    def links(self) -> list[Link]:
        return [parse_link(p) for p in self.request(RTM_GETLINK, NLM_F_DUMP, link_request())]

    def link_index(self, name: str) -> int | None:
        for link in self.links():
            if link.name == name:
                return link.index
        return None

    def link(self, index: int) -> Link:
        for link in self.links():
            if link.index == index:
                return link
        raise NetlinkError(errno_mod.ENODEV, os.strerror(errno_mod.ENODEV))

    def link_add(self, name: str, kind: str) -> None:
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, link_request(name=name, kind=kind))

    def link_del(self, index: int) -> None:
        self.request(RTM_DELLINK, 0, link_request(index=index))

    def link_set(self, index: int, *, mtu: int | None = None, up: bool = False) -> None:
        self.request(RTM_NEWLINK, 0, link_request(index=index, mtu=mtu, up=up))

    # addresses

    def addrs(self, index: int) -> list[tuple[str, int]]:
        """``(address, prefixlen)`` of every address on ``index``."""
        body = _IFADDR.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        found = (parse_addr(p) for p in self.request(RTM_GETADDR, NLM_F_DUMP, body))
        return [(address, prefixlen) for got, address, prefixlen in found if got == index and address]

    def addr_add(self, index: int, interface: str) -> None:
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, addr_request(index, interface))

    def addr_del(self, index: int, interface: str) -> None:
        self.request(RTM_DELADDR, 0, addr_request(index, interface))

    # routes

    def routes(self, family: int) -> list[Route]:
        body = _RTMSG.pack(family, 0, 0, 0, 0, 0, 0, 0, 0)
        return [parse_route(p) for p in self.request(RTM_GETROUTE, NLM_F_DUMP, body)]

    def route_replace(self, cidr: str, oif: int, proto: int) -> None:
        self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, route_request(cidr, oif, proto))

    def route_del(self, cidr: str, oif: int, proto: int) -> None:
        self.request(RTM_DELROUTE, 0, route_request(cidr, oif, proto, delete=True))
