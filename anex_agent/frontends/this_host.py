"""Which proxy destinations are this machine: every spelling of loopback and "this host".

Why it matters: services on this machine's loopback trust local callers (the agent API
answers them without a token), so the HTTP proxy must not carry a client from beyond
loopback there (:func:`may_reach`). The OS accepts many spellings of the same address, and
the guard must know them all before anything is dialled:

* IPv4 in every form ``inet_aton(3)`` reads, which is what ``getaddrinfo`` (so the dialer's
  system resolver) accepts for a numeric host: ``127.0.0.1``, ``127.1``, ``127.0.1``,
  ``2130706433``, ``0x7f000001``, ``0177.0.0.1``; the whole of 127.0.0.0/8;
* the unspecified address, ``0.0.0.0``, ``0`` and ``::``: ``connect()`` to it reaches this
  host (Linux connects to loopback);
* IPv6 ``::1`` and IPv4-mapped forms (``::ffff:127.0.0.1``, ``::ffff:7f00:1``), with or
  without brackets and a zone (``%lo``);
* names: ``localhost`` and every name under it (RFC 6761 §6.3), the loopback aliases
  distributions put in /etc/hosts (``localhost.localdomain``, ``ip6-localhost``, ...), in
  any case and with or without the final dot.

A name that merely *resolves* to loopback (an /etc/hosts line, a DNS answer) cannot be told
from its spelling: the proxy also checks the address it actually connected to
(:func:`is_this_host` on the socket's peer) before sending anything.

Pure: no I/O. ``socket`` is imported only for ``inet_aton``, the very parser the system
resolver uses, so "what the guard reads" and "what the dialer would dial" cannot drift.
"""

from __future__ import annotations

import ipaddress
import socket

Address = ipaddress.IPv4Address | ipaddress.IPv6Address

# RFC 6761 §6.3 reserves "localhost." and every name under it; the others are the loopback
# aliases of Debian/Ubuntu and RHEL/Fedora /etc/hosts files.
LOOPBACK_NAMES = frozenset(
    {
        "localhost",
        "localhost.localdomain",
        "localhost4",
        "localhost4.localdomain4",
        "localhost6",
        "localhost6.localdomain6",
        "ip6-localhost",
        "ip6-loopback",
    }
)

# the characters of inet_aton's numbers-and-dots notation (decimal, 0-octal, 0x-hex parts)
_INET_ATON_CHARS = frozenset("0123456789abcdefABCDEFxX.")


def _strip(host: str) -> str:
    """``host`` without brackets, IPv6 zone and one final dot."""
    text = host.strip()
    if text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    text = text.split("%", 1)[0]
    if text.endswith(".") and not text.endswith(".."):
        text = text[:-1]
    return text


def ip_of(host: str) -> Address | None:
    """The address a numeric ``host`` names in any spelling the OS accepts; None for a name.

    IPv4 shorthand (``127.1``, ``2130706433``, ``0x7f000001``, ``0177.0.0.1``) is read with
    ``inet_aton`` as ``getaddrinfo`` does, not refused as :mod:`ipaddress` would.
    """
    text = _strip(host)
    if not text:
        return None
    if ":" in text:
        try:
            return ipaddress.IPv6Address(text)
        except ValueError:
            return None
    if not set(text) <= _INET_ATON_CHARS:
        return None  # also keeps glibc's "1.2.3.4 junk" leniency out
    try:
        return ipaddress.IPv4Address(socket.inet_aton(text))
    except OSError:
        return None


def is_this_host(address: Address) -> bool:
    """Loopback or unspecified (IPv4-mapped IPv6 addresses judged by their IPv4 address)."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_loopback or address.is_unspecified


def names_this_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, as a client wrote it) spells this machine."""
    address = ip_of(host)
    if address is not None:
        return is_this_host(address)
    name = _strip(host).lower()
    return name in LOOPBACK_NAMES or name.endswith(".localhost")


def fans_out(host: str) -> bool:
    """Whether a datagram to the numeric ``host`` reaches many hosts: multicast, or the limited
    broadcast 255.255.255.255 (IPv4-mapped addresses judged by their IPv4 address)."""
    address = ip_of(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address is not None and (address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"))


def is_local_client(client_ip: str) -> bool:
    """Whether a connection from ``client_ip`` (a socket's peer address) comes from this machine's loopback."""
    address = ip_of(client_ip)
    return address is not None and is_this_host(address)


def may_reach(client_ip: str, destination: str) -> bool:
    """Whether a client at ``client_ip`` may use the proxy to reach ``destination``.

    ``destination`` is the host as the client wrote it (checked before dialling) or the
    address actually connected to (checked after). Services of this machine are reachable
    only for clients that are themselves local: they could connect there directly anyway,
    while a client from beyond loopback (the proxy bound to another address) would borrow
    the proxy's local identity.
    """
    return is_local_client(client_ip) or not names_this_host(destination)
