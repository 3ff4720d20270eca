"""The relay's listening socket: a source that already has its share waiting is refused at accept.

:func:`listen` binds the socket the relay serves on; its ``accept`` (what asyncio's server
calls for every connection) asks ``refuse(peer_address)`` first and resets a refused
connection at once (RST: SO_LINGER 0), before asyncio builds a transport, a task or a
WebSocket protocol for it. A refusal there costs the relay a fraction of a fully built
connection, so a flood from a few addresses spends little of its CPU. At most
:data:`REFUSED_PER_WAKEUP` connections are refused per call before the event loop runs
again. What passes is checked once more, authoritatively, when its connection is made
(:mod:`anex_agent.gateway.admission`).
"""

from __future__ import annotations

import errno
import socket
import struct
from collections.abc import Callable
from typing import Any

REFUSED_PER_WAKEUP = 64
_RESET = struct.pack("ii", 1, 0)  # SO_LINGER on, 0 s: close() sends RST and keeps no TIME_WAIT


class FilteringSocket(socket.socket):
    """A listening socket whose ``accept`` skips (resets) the connections ``refuse`` picks."""

    refuse: Callable[[Any], bool] = staticmethod(lambda address: False)

    def accept(self):  # type: ignore[override]
        for _ in range(REFUSED_PER_WAKEUP):
            conn, address = super().accept()  # BlockingIOError: nothing waits (asyncio stops here)
            if not self.refuse(address):
                return conn, address
            try:
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _RESET)
            except OSError:
                pass
            conn.close()
        raise BlockingIOError(errno.EAGAIN, "more refusals at the next wake-up")


def listen(host: str, port: int, backlog: int) -> FilteringSocket:
    """A non-blocking :class:`FilteringSocket` bound to ``host:port`` (the first address a name
    resolves to; an IPv6 address serves IPv6 only, as before) and listening. OSError when it cannot."""
    family, kind, proto, _, address = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM,
                                                         flags=socket.AI_PASSIVE)[0]
    sock = FilteringSocket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:  # as asyncio's servers: an IPv6 address serves IPv6 only
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(address)
        sock.listen(backlog)
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock
