"""Dialling for a proxy client: the Dialer, with the loopback guard of :mod:`.this_host` applied.

Shared by the HTTP proxy and the SOCKS5 proxy, so that both refuse the same destinations.
The caller refuses every *spelling* of this machine before it dials (``this_host.may_reach``
on the host as the client wrote it); :func:`dial_for_client` catches a name that only
*resolved* to it, on the addresses the dialer actually tried.
"""

from __future__ import annotations

from anex_agent.net.dialer import Connection, Dialer
from anex_agent.errors import AnexError, DialError
from anex_agent.frontends import this_host


class Forbidden(AnexError):
    """The client may not reach that destination (it is this machine, and the client is not local)."""


async def dial_for_client(dialer: Dialer, client_ip: str, host: str, port: int) -> Connection:
    """Open a connection to ``host:port`` for a client at ``client_ip``; raises DialError or Forbidden.

    A connection that reached this machine for a client from beyond loopback is closed before
    a byte is sent, and a failed dial there is Forbidden too: refused or silent, the answer
    must not tell such a client which local ports are open. Connections without a kernel
    socket (a user-space stack's) are judged by the addresses tried only: their loopback is
    not this machine's.
    """
    try:
        conn = await dialer.open_connection(host, port)
    except DialError as err:
        if not all(this_host.may_reach(client_ip, address) for address in err.tried):
            raise Forbidden() from None
        raise
    if conn.socket is not None:
        try:
            peer = conn.socket.getpeername()[0]
        except OSError:
            peer = ""
        if peer and not this_host.may_reach(client_ip, peer):
            await conn.aclose()
            raise Forbidden()
    return conn
