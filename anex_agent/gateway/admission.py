"""Who may wait for authentication at the relay, and for how long (pure: no I/O, no clock).

A stranger can open the relay's port; what it may spend there before it proves a node key
is bounded here, apart from the slots of authenticated nodes (:attr:`RelayLimits.max_connections`):

* at most ``max_pending`` connections wait for authentication in all;
  when one more arrives, the oldest waiting one is dropped to make room (a real node
  answers the challenge within a round trip, so it is never the oldest for long);
* at most ``max_pending_per_source`` of them come from one source (an
  IPv4 address, or an IPv6 /64: one host's share), further ones from it are refused at once;
* each must authenticate within :attr:`RelayLimits.auth_timeout` seconds of its TCP
  accept (the relay enforces it with a timer; this module keeps no clock).

The source is the TCP peer's address, unless that peer is one of the configured trusted
proxies (``--ws-trusted-proxy``): then it is the rightmost ``X-Forwarded-For`` address that
is not itself a trusted proxy (:func:`forwarded_source`), known only once the upgrade request
has been read (:meth:`Admission.forwarded`). ``X-Forwarded-For`` from anyone else is ignored.

Contract: :meth:`Admission.arrive` for each accepted connection, then exactly one of
:meth:`Admission.leave` (authenticated or closed; idempotent). ``arrive`` returns whether the
connection may stay and which older connections the caller must drop now.
"""

from __future__ import annotations

import ipaddress
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Sequence

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
IPV6_SOURCE_PREFIX = 64  # RFC 4291 §2.5.4: one subnet (one host's share, as providers hand them out)




def source_key(address: str) -> str | None:
    """The source an address counts under: the IPv4 address, or the IPv6 /64 (IPv4-mapped: the IPv4);
    ``None`` for text that is not an IP address."""
    try:
        ip = ipaddress.ip_address(address.strip().split("%", 1)[0])
    except ValueError:
        return None
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return str(ip.ipv4_mapped)
        return str(ipaddress.IPv6Network((ip, IPV6_SOURCE_PREFIX), strict=False))
    return str(ip)


def is_trusted(address: str, proxies: Sequence[Network]) -> bool:
    """Whether ``address`` is one of the trusted proxies (never, when there are none)."""
    if not proxies:
        return False
    try:
        ip = ipaddress.ip_address(address.strip().split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == net.version and ip in net for net in proxies)


def forwarded_source(values: Iterable[str], proxies: Sequence[Network]) -> str | None:
    """The client named by ``X-Forwarded-For`` header ``values`` (in order) behind trusted ``proxies``:
    the rightmost entry that is not a trusted proxy, as a source key; ``None`` when there is
    none, or when that entry is not an IP address (a proxy that appends the real peer never
    writes one)."""
    entries = [entry.strip() for value in values for entry in value.split(",") if entry.strip()]
    for entry in reversed(entries):
        if not is_trusted(entry, proxies):
            return source_key(entry)
    return None


class Admission:
    """The connections that wait for authentication, oldest first, counted per source."""

    def __init__(self, max_pending: int, max_pending_per_source: int) -> None:
        self.max_pending, self.max_pending_per_source = max_pending, max_pending_per_source
        self._pending: OrderedDict[Hashable, str | None] = OrderedDict()  # connection -> source (None: not yet known)
        self._per_source: dict[str, int] = {}

    @property
    def pending(self) -> int:
        return len(self._pending)

    def from_source(self, source: str) -> int:
        return self._per_source.get(source, 0)

    def arrive(self, conn: Hashable, source: str | None) -> tuple[bool, list[Hashable]]:
        """A connection was accepted from ``source`` (``None``: a trusted proxy's, the source comes
        with the request). Returns ``(admitted, to_drop)``: when not admitted, the caller drops
        ``conn``; in every case it drops each of ``to_drop`` (already forgotten here)."""
        if source is not None and self._per_source.get(source, 0) >= self.max_pending_per_source:
            return False, []
        to_drop: list[Hashable] = []
        while self._pending and len(self._pending) >= self.max_pending:
            oldest = next(iter(self._pending))
            self.leave(oldest)
            to_drop.append(oldest)
        if self.max_pending <= 0:
            return False, to_drop
        self._pending[conn] = source
        if source is not None:
            self._per_source[source] = self._per_source.get(source, 0) + 1
        return True, to_drop

    def forwarded(self, conn: Hashable, source: str) -> bool:
        """The source of a waiting connection from a trusted proxy is now known; ``False`` (and the
        connection forgotten) when that source already has its share waiting."""
        if conn not in self._pending:
            return False
        self._drop_source(self._pending[conn])
        if self._per_source.get(source, 0) >= self.max_pending_per_source:
            del self._pending[conn]
            return False
        self._pending[conn] = source
        self._per_source[source] = self._per_source.get(source, 0) + 1
        return True

    def leave(self, conn: Hashable) -> None:
        """``conn`` no longer waits: it authenticated, was refused or closed. Idempotent."""
        if conn in self._pending:
            self._drop_source(self._pending.pop(conn))

    def _drop_source(self, source: str | None) -> None:
        if source is None:
            return
        left = self._per_source.get(source, 0) - 1
        if left > 0:
            self._per_source[source] = left
        else:
            self._per_source.pop(source, None)
