"""The SOCKS5 proxy the workload reaches at ``ANEX_SOCKS_LISTEN`` (off unless set; e.g. 127.0.0.1:1080).

The thin asyncio driver of :mod:`.socks5_core` (RFC 1928 / RFC 1929, sans-I/O): it reads the
client's greeting, credentials and request, dials the destination through the
:class:`~anex_agent.net.dialer.Dialer` (a domain name goes to the Dialer as it is, so cluster
names are resolved by the cluster's DNS over the mesh, as for the HTTP proxy), answers, and
relays bytes both ways with :func:`anex_agent.frontends.relay.relay` (half-close;
``os.splice`` between kernel sockets, the relay's pooled buffers otherwise).

* ``CONNECT`` to an IPv4 address, an IPv6 address or a domain name;
* ``UDP ASSOCIATE`` when the engine carries datagrams (``datagrams``, its
  :class:`~anex_agent.net.datagram.DatagramDialer`): a UDP relay bound on the address the
  client reached the proxy at, answered as BND; the association (:mod:`.socks5_udp`: who may
  send, what is dropped) lives until the control connection closes or ``udp_idle_timeout``
  passes without a datagram. Without ``datagrams`` it is "command not supported" (``07``),
  as ``BIND`` always is;
* replies: ``00`` succeeded (with the proxy's end of the outbound connection as BND, or
  0.0.0.0:0 on a user-space stack), ``02`` not allowed (a client from beyond loopback asking
  for this machine, :mod:`.this_host`: the HTTP proxy's 403), ``03`` network unreachable,
  ``04`` host unreachable (the name does not resolve, or no answer), ``05`` connection
  refused (the HTTP proxy's 502 cases), ``08`` address type not supported;
* credentials (RFC 1929) when ``auth`` is given; the client must offer method ``02``;
* the negotiation (greeting to request) must complete within ``handshake_timeout`` (the HTTP
  proxy's 120 s for a request head); a malformed one is logged at debug level, naming the
  field, and the connection is closed after the answer the RFC allows.

Who may connect: anyone who can reach the listen address. The default is loopback;
credentials are required to bind anywhere else (:func:`.socks5_core.check_listener`). A UDP
relay takes datagrams from its association's client only (:mod:`.socks5_udp`).

Start it in-process::

    async with Socks5Server(OSDialer(resolver), host="127.0.0.1", port=1080,
                            datagrams=OSDatagramDialer(resolver)) as socks:
        print(socks.address)
        await socks.wait_closed()      # or do other work; leaving the block stops it
"""

from __future__ import annotations

import asyncio
import logging

from anex_agent.net.datagram import DatagramDialer
from anex_agent.net.dialer import Connection, Dialer
from anex_agent.errors import DialError
from anex_agent.frontends import socks5_core as core
from anex_agent.frontends import this_host
from anex_agent.frontends.dial_guard import Forbidden, dial_for_client
from anex_agent.frontends.relay import relay
from anex_agent.frontends.socks5_udp import IDLE_TIMEOUT, UdpAssociation
from anex_agent.frontends.tcp_server import DEFAULT_MAX_CONNECTIONS, TcpServer
from anex_agent.net.peer_log import LogBudget, peer_text

log = logging.getLogger(__name__)

#: "cannot open a UDP relay" lines (out of file descriptors, say): at most 10 a minute
_RELAY_FAILURES_LOGGED = LogBudget(burst=10, interval=60.0)
HANDSHAKE_TIMEOUT = 120.0  # seconds from accept to a complete request (as the HTTP proxy's head timeout)
HANDSHAKE_BUFFER = 1024  # bytes read at a time until the request is complete (a request is at most 262)


class Socks5Server(TcpServer):
    """Listens for SOCKS5 clients and serves each connection in a named task.

    Async context manager: entering binds (``PortInUseError`` naming ANEX_SOCKS_LISTEN when
    the port is taken) and starts accepting; leaving stops and closes everything. Bound beyond
    loopback without ``auth``, it refuses to be built (ConfigError naming ANEX_SOCKS_LISTEN).
    """

    listen_source = core.LISTEN_SOURCE
    task_prefix = "socks5"
    what = "SOCKS5 proxy"

    def __init__(
        self,
        dialer: Dialer,
        *,
        host: str = core.DEFAULT_LISTEN[0],
        port: int = core.DEFAULT_LISTEN[1],
        auth: core.SocksAuth | None = None,
        handshake_timeout: float = HANDSHAKE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        datagrams: DatagramDialer | None = None,
        udp_idle_timeout: float = IDLE_TIMEOUT,
    ) -> None:
        core.check_listener(host, auth)
        super().__init__(host, port, max_connections)
        self.dialer = dialer
        self.datagrams = datagrams
        self.udp_idle_timeout = udp_idle_timeout
        #: the UDP associations open now (each holds one of the ``max_connections`` control connections)
        self.associations: set[UdpAssociation] = set()
        self.auth = auth
        self.handshake_timeout = handshake_timeout

    def started(self) -> None:
        log.info("SOCKS5 proxy on %s:%d (%s%s)", *self.address, "username/password required" if self.auth else "no auth",
                 "" if self.datagrams is not None else "; no UDP ASSOCIATE with this engine")

    async def serve_client(self, client: Connection, client_ip: str) -> None:
        """Negotiate, dial, answer, relay: one client connection (closed by the caller)."""
        socks = core.Socks5Connection(self.auth)
        try:
            async with asyncio.timeout(self.handshake_timeout):
                event = await _negotiate(socks, client)
        except core.Socks5ProtocolError as err:
            log.debug("SOCKS5 proxy: malformed negotiation from %s: %s", client_ip, peer_text(err.reason, 240))
            await _send_quietly(client, socks.data_to_send())
            return
        except (TimeoutError, OSError):
            return
        if event is None:  # EOF before a request
            return
        if isinstance(event, core.Refused):  # its answer is sent
            log.debug("SOCKS5 proxy: refused %s: %s", client_ip, event.reason)
            return
        if isinstance(event, core.AssociateRequest):
            await self._associate(socks, event, client, client_ip)
            return
        upstream = await self._dial(socks, event, client_ip)
        if upstream is None:
            await _send_quietly(client, socks.data_to_send())
            return
        try:
            bound = None
            if upstream.socket is not None:
                try:
                    bound = upstream.socket.getsockname()[:2]
                except OSError:
                    pass
            socks.reply(core.Reply.SUCCEEDED, bound)
            await client.sendall(socks.data_to_send())
            await relay(client, upstream, a_to_b_prefix=socks.trailing_data)
        except OSError:
            pass
        finally:
            await upstream.aclose()

    async def _associate(self, socks: core.Socks5Connection, request: core.AssociateRequest, client: Connection,
                         client_ip: str) -> None:
        """Open the UDP relay, answer with its address, relay until the control connection or the idle timeout ends it."""
        if self.datagrams is None:
            socks.reply(core.Reply.COMMAND_NOT_SUPPORTED)
            await _send_quietly(client, socks.data_to_send())
            return
        if request.port == 0 and not this_host.is_local_client(client_ip):
            # the first datagram from the client's address would own the association: beyond this
            # machine that address can be forged by anyone on the path, credentials or not
            log.debug("SOCKS5 proxy: UDP ASSOCIATE from %s refused: it names no source port", client_ip)
            socks.reply(core.Reply.NOT_ALLOWED)
            await _send_quietly(client, socks.data_to_send())
            return
        try:
            assert client.socket is not None  # accepted by TcpServer: a kernel socket
            local_ip = client.socket.getsockname()[0]
            association = UdpAssociation(self.datagrams, client_ip, request, local_ip,
                                         idle_timeout=self.udp_idle_timeout)
            association.open()
        except OSError as err:
            if (skipped := _RELAY_FAILURES_LOGGED.take()) is not None:
                log.warning("SOCKS5 proxy: cannot open a UDP relay for %s: %s%s", client_ip, err,
                            f" ({skipped} more not logged)" if skipped else "")
            socks.reply(core.Reply.GENERAL_FAILURE)
            await _send_quietly(client, socks.data_to_send())
            return
        self.associations.add(association)
        try:
            log.debug("SOCKS5 proxy: UDP ASSOCIATE for %s on %s:%d", client_ip, *association.address)
            socks.reply(core.Reply.SUCCEEDED, association.address)
            await client.sendall(socks.data_to_send())
            ended = await association.run(client)
            log.debug("SOCKS5 proxy: UDP association of %s ended (%s): %s", client_ip,
                      {"closed": "control connection closed"}.get(ended, ended), dict(association.counts) or "no datagrams")
        except OSError:
            pass
        finally:
            self.associations.discard(association)
            association.close()

    async def _dial(self, socks: core.Socks5Connection, request: core.ConnectRequest, client_ip: str) -> Connection | None:
        """The upstream connection, or None with the failure's reply queued."""
        host, port = request.host, request.port
        log.debug("SOCKS5 proxy: CONNECT %s:%d", peer_text(host), port)
        if not this_host.may_reach(client_ip, host):  # every spelling of this machine, before dialling
            socks.reply(core.Reply.NOT_ALLOWED)
            return None
        try:
            return await dial_for_client(self.dialer, client_ip, host, port)
        except Forbidden:
            socks.reply(core.Reply.NOT_ALLOWED)
        except DialError as err:
            log.debug("SOCKS5 proxy: cannot reach %s:%d: %s", peer_text(host), port, err.reason)
            socks.reply(core.reply_for(err))
        return None


async def _negotiate(socks: core.Socks5Connection,
                     client: Connection) -> core.ConnectRequest | core.AssociateRequest | core.Refused | None:
    """Read and answer until the request or a refusal (its answer sent); None at EOF.

    Raises Socks5ProtocolError (its answer, if any, still queued) or OSError."""
    buf = memoryview(bytearray(HANDSHAKE_BUFFER))
    while True:
        event = socks.next_event()
        out = socks.data_to_send()  # the method selection, the auth status, a refusal's answer
        if out:
            await client.sendall(out)
        if event is not core.NEED_DATA:
            return event
        n = await client.recv_into(buf)
        if n == 0:
            return None
        socks.receive_data(bytes(buf[:n]))


async def _send_quietly(client: Connection, data: bytes) -> None:
    if not data:
        return
    try:
        await client.sendall(data)
    except OSError:
        pass  # the client is gone: closing says enough
