"""The SOCKS5 UDP relay's rules (RFC 1928 §7), sans-I/O: the datagram header, who may send, whose replies pass.

No asyncio, socket or time here: :mod:`anex_agent.frontends.socks5_udp` reads the datagrams
and hands them to these functions and classes, so the rules are tested without a network.

* Every datagram between the client and the relay carries ``RSV(2) FRAG ATYP DST.ADDR DST.PORT
  DATA``: :func:`parse_datagram` reads the client's (the destination, and the payload),
  :func:`encode_datagram` builds the one the client receives (naming the source of a reply).
  ``FRAG`` other than 0 is a fragment: the relay drops those (RFC 1928 §7 lets a server that
  does not reassemble drop every fragment, and no common client fragments).
* :class:`ClientSource`: only the client that asked may use its association: datagrams from
  the control connection's IP address, and from the port its request named, or, when it named
  port 0 (it did not know yet), from the first port that sends; every other sender is a stranger.
* :class:`ReplyPeers`: the replies relayed to the client are those from an address and port the
  client sent to (as a port-restricted NAT filters, RFC 4787 §5); at most :data:`MAX_PEERS` are
  remembered per association, the least recently used forgotten first.
"""

from __future__ import annotations

import collections
import ipaddress
from dataclasses import dataclass

from anex_agent import parse
from anex_agent.frontends.socks5_core import AddressType, Socks5ProtocolError

HEADER_MIN = 4 + 4 + 2  # RSV FRAG ATYP, an IPv4 address, the port: the shortest header
MAX_PEERS = 256  # destinations remembered per association for the replies' filter


@dataclass(frozen=True)
class ClientDatagram:
    """A datagram from the client: ``payload`` for ``host:port`` (an IP address or a name as sent)."""

    frag: int
    host: str
    port: int
    address_type: AddressType
    payload: bytes


def parse_datagram(data: bytes) -> ClientDatagram:
    """The client's datagram (RFC 1928 §7); Socks5ProtocolError naming the field that is wrong."""
    if len(data) < HEADER_MIN:
        raise Socks5ProtocolError(f"UDP datagram of {len(data)} bytes is shorter than the SOCKS5 header")
    frag, atyp = data[2], data[3]  # data[0:2] is RSV: reserved, ignored
    if atyp == AddressType.IPV4:
        end = 4 + 4
        host = str(ipaddress.IPv4Address(data[4:end]))
    elif atyp == AddressType.IPV6:
        end = 4 + 16
        if len(data) < end + 2:
            raise Socks5ProtocolError("UDP datagram too short for its IPv6 destination")
        host = str(ipaddress.IPv6Address(data[4:end]))
    elif atyp == AddressType.DOMAIN:
        end = 5 + data[4]
        if data[4] == 0 or len(data) < end + 2:
            raise Socks5ProtocolError("UDP datagram's domain name is empty or longer than the datagram")
        raw = data[5:end]
        try:
            host = parse.host(raw.decode("ascii"))
        except (UnicodeDecodeError, ValueError):
            shown = raw[:64].decode("ascii", "backslashreplace")
            raise Socks5ProtocolError(f"UDP datagram's domain name {shown!r} is not a host name") from None
    else:
        raise Socks5ProtocolError(f"address type {atyp} in a UDP datagram (1: IPv4, 3: domain name, 4: IPv6)")
    port = int.from_bytes(data[end:end + 2], "big")
    if port == 0:
        raise Socks5ProtocolError(f"destination port 0 for {host!r} in a UDP datagram")
    return ClientDatagram(frag, host, port, AddressType(atyp), bytes(data[end + 2:]))


def encode_datagram(host: str, port: int, payload: bytes) -> bytes:
    """The datagram the client receives: the header naming ``host:port`` (the reply's source, an IP address), then ``payload``."""
    address = _address(host)
    atyp = AddressType.IPV4 if address.version == 4 else AddressType.IPV6
    return bytes((0, 0, 0, atyp)) + address.packed + port.to_bytes(2, "big") + payload


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """``host`` as an address, IPv4-mapped IPv6 read as the IPv4 address (a dual-stack socket's view)."""
    address = ipaddress.ip_address(host.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


class ClientSource:
    """Which sender is the association's client: the control connection's ``client_ip`` and
    ``port`` (the request's DST.PORT; 0: the first port ``client_ip`` sends from)."""

    def __init__(self, client_ip: str, port: int) -> None:
        self.ip = _address(client_ip)
        self.port = port
        #: datagrams refused: from another address, or from another port of the client's
        self.strangers = 0

    def accepts(self, ip: str, port: int) -> bool:
        """Whether a datagram from ``ip:port`` is the client's (the first one fixes port 0); counts the others."""
        try:
            same_ip = _address(ip) == self.ip
        except ValueError:
            same_ip = False
        if same_ip and self.port == 0:
            self.port = port
        if same_ip and port == self.port:
            return True
        self.strangers += 1
        return False


class ReplyPeers:
    """The destinations the client sent to, whose datagrams are relayed back (at most ``limit``, LRU)."""

    def __init__(self, limit: int = MAX_PEERS) -> None:
        self.limit = limit
        self._peers: collections.OrderedDict[tuple[str, int], None] = collections.OrderedDict()
        #: replies dropped because their source is not a destination the client sent to
        self.strangers = 0

    def sent(self, ip: str, port: int) -> None:
        """The client sent to ``ip:port``: its replies may pass (the oldest peer is forgotten past the limit)."""
        key = (str(_address(ip)), port)
        self._peers[key] = None
        self._peers.move_to_end(key)
        while len(self._peers) > self.limit:
            self._peers.popitem(last=False)

    def allows(self, ip: str, port: int) -> bool:
        """Whether a datagram from ``ip:port`` is a reply to the client; counts the others."""
        try:
            key = (str(_address(ip)), port)
        except ValueError:
            key = None
        if key is not None and key in self._peers:
            return True
        self.strangers += 1
        return False

    def __len__(self) -> int:
        return len(self._peers)
