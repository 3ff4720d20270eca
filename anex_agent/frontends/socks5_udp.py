"""One SOCKS5 UDP association (RFC 1928 §4, §7): the relay socket the client sends to, and its datagrams into the mesh.

:class:`UdpAssociation` is what the SOCKS5 proxy (:mod:`.socks5`) opens for a ``UDP ASSOCIATE``
request: a kernel UDP socket (the *relay*) bound on the address the client reached the proxy
at (the listener's host and family; loopback by default), port chosen by the system, and a
:class:`~anex_agent.net.datagram.DatagramSocket` of the engine's
:class:`~anex_agent.net.datagram.DatagramDialer` for the mesh side.

* A datagram to the relay is the client's only if it comes from the control connection's IP
  address and the port the request named (the first port seen when it named 0):
  :class:`.socks5_udp_core.ClientSource`; others are dropped and counted (:attr:`UdpAssociation.counts`).
* Its header names the destination: an IP address, or a name resolved by the engine's resolver
  (the one the CONNECT path uses: cluster names by the cluster's DNS over the mesh, never the
  host's), then it is sent with the header stripped. Fragments (``FRAG`` not 0) are dropped:
  RFC 1928 §7 allows a server that does not reassemble to drop them. A destination on this
  machine is refused for a client from beyond loopback, before and after resolving, as for
  CONNECT (:mod:`.this_host`), and so are multicast and broadcast destinations; port 0 and
  malformed headers are dropped.
* A datagram from the mesh goes to the client with the header naming its source, if the
  client sent to that address and port before (:class:`.socks5_udp_core.ReplyPeers`).
* Nothing is queued here: the client's datagrams wait in the relay socket's kernel buffer
  while one is resolved, replies are sent as they arrive (dropped when the client's socket
  buffer is full), and the stack's UDP ports hold at most their own bounded queue.

:meth:`UdpAssociation.run` relays until the control connection closes (RFC 1928 §7: the
association ends with it) or no datagram went either way for ``idle_timeout`` seconds
(:data:`IDLE_TIMEOUT`, RFC 4787 REQ-5's recommended UDP mapping lifetime), then the sockets
are closed by :meth:`UdpAssociation.close`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket

from anex_agent.errors import ResolveError
from anex_agent.frontends import socks5_udp_core as udp_core
from anex_agent.frontends import this_host
from anex_agent.frontends.socks5_core import AddressType, AssociateRequest, Socks5ProtocolError
from anex_agent.net.datagram import MAX_DATAGRAM, DatagramDialer, DatagramSocket
from anex_agent.net.dialer import Connection
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 300.0  # seconds without a datagram either way before the association ends
RELAY_BUFFER = MAX_DATAGRAM + 262  # a payload and the longest header (a 255-byte name)


class UdpAssociation:
    """The relay of one ``UDP ASSOCIATE`` for the client at ``client_ip``; see the module docstring.

    :meth:`open` binds the relay on ``local_ip`` (OSError when it cannot) and opens the mesh
    side; :meth:`close` closes both. :attr:`address` is the relay's (ip, port), the reply's
    BND.ADDR and BND.PORT.
    """

    def __init__(self, datagrams: DatagramDialer, client_ip: str, request: AssociateRequest, local_ip: str, *,
                 idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.datagrams = datagrams
        self.client_ip = client_ip
        self.local_ip = local_ip
        self.idle_timeout = idle_timeout
        self.source = udp_core.ClientSource(client_ip, request.port)
        self.peers = udp_core.ReplyPeers()
        #: what happened to datagrams: "sent", "replied", and why others were dropped
        self.counts: collections.Counter[str] = collections.Counter()
        self._relay: socket.socket | None = None
        self._mesh: DatagramSocket | None = None
        self._client: tuple | None = None  # the client's full socket address, once it sent
        self._idle: asyncio.Timeout | None = None
        self._loop = asyncio.get_running_loop()

    @property
    def address(self) -> tuple[str, int]:
        assert self._relay is not None, "not open"
        return self._relay.getsockname()[:2]

    def open(self) -> None:
        family = socket.AF_INET6 if ":" in self.local_ip else socket.AF_INET
        relay = socket.socket(family, socket.SOCK_DGRAM)
        try:
            relay.setblocking(False)
            relay.bind((self.local_ip, 0))
            self._mesh = self.datagrams.open_datagram(self._from_mesh)
        except BaseException:
            relay.close()
            raise
        self._relay = relay

    def close(self) -> None:
        if self._mesh is not None:
            self._mesh.close()
        if self._relay is not None:
            self._relay.close()

    async def run(self, control: Connection) -> str:
        """Relay until the control connection closes ("closed"), the association is idle ("idle")
        or the relay socket fails ("relay failed")."""
        port = self.address[1]
        try:
            async with asyncio.timeout(self.idle_timeout) as self._idle:
                async with asyncio.TaskGroup() as group:
                    pump = group.create_task(self._pump(), name=f"socks5-udp-{port}-relay")
                    closed = group.create_task(_until_closed(control), name=f"socks5-udp-{port}-control")
                    await asyncio.wait({pump, closed}, return_when=asyncio.FIRST_COMPLETED)
                    pump.cancel()
                    closed.cancel()
        except TimeoutError:
            return "idle"
        finally:
            self._idle = None
        return "closed" if closed.done() and not closed.cancelled() else "relay failed"

    def _active(self) -> None:
        """A datagram went through: the idle timeout starts again (the timer moves at most every
        tenth of the timeout, a second at most, not at every datagram)."""
        idle = self._idle
        if idle is not None and not idle.expired():  # an expired one is ending the association
            deadline = self._loop.time() + self.idle_timeout
            current = idle.when()
            if current is None or deadline - current >= min(1.0, self.idle_timeout / 10):
                idle.reschedule(deadline)

    async def _pump(self) -> None:
        """The client's datagrams, one at a time (the next waits in the kernel while a name resolves);
        returns when the relay socket fails."""
        assert self._relay is not None
        while True:
            try:
                data, source = await self._loop.sock_recvfrom(self._relay, RELAY_BUFFER)
            except OSError as err:
                log.debug("SOCKS5 UDP relay %s:%d failed: %s", *self.address, err)
                return
            await self._from_client(data, source)

    async def _from_client(self, data: bytes, source: tuple) -> None:
        if not self.source.accepts(source[0], source[1]):
            self._drop("stranger", "a datagram from %s:%d (not the association's client)", source[0], source[1])
            return
        self._client = source
        try:
            dgram = udp_core.parse_datagram(data)
        except Socks5ProtocolError as err:
            self._drop("malformed", "%s", peer_text(err.reason, 240))
            return
        if dgram.frag != 0:
            self._drop("fragment", "fragment %d for %s:%d (fragments are not reassembled)", dgram.frag,
                       peer_text(dgram.host), dgram.port)
            return
        if not this_host.may_reach(self.client_ip, dgram.host):
            self._drop("forbidden", "%s:%d is this machine", peer_text(dgram.host), dgram.port)
            return
        address = await self._resolve(dgram)
        if address is None:
            return
        if not this_host.may_reach(self.client_ip, address):
            self._drop("forbidden", "%s:%d resolved to this machine (%s)", peer_text(dgram.host), dgram.port, address)
            return
        if this_host.fans_out(address) and not this_host.is_local_client(self.client_ip):
            self._drop("forbidden", "%s:%d is a multicast or broadcast address", peer_text(dgram.host), dgram.port)
            return
        assert self._mesh is not None
        try:
            self._mesh.sendto(dgram.payload, address, dgram.port)
        except OSError as err:
            self._drop("unreachable", "cannot send to %s:%d: %s", address, dgram.port, err)
            return
        self.peers.sent(address, dgram.port)
        self.counts["sent"] += 1
        self._active()

    async def _resolve(self, dgram: udp_core.ClientDatagram) -> str | None:
        """The address to send to (a name's first); None, counted, when the name does not resolve."""
        host = dgram.host
        if dgram.address_type is not AddressType.DOMAIN:
            return host
        try:
            addresses = await self.datagrams.resolver.resolve(host)
        except ResolveError as err:
            self._drop("unresolved", "%s does not resolve: %s", peer_text(host), err.reason)
            return None
        if not addresses:
            self._drop("unresolved", "%s has no address", peer_text(host))
            return None
        return addresses[0]

    def _from_mesh(self, data: bytes, source: tuple[str, int]) -> None:
        relay, client = self._relay, self._client
        if relay is None or client is None or not self.peers.allows(source[0], source[1]):
            self.counts["reply from a stranger"] += 1
            return
        try:
            relay.sendto(udp_core.encode_datagram(source[0], source[1], data), client)
        except OSError:  # the client's buffer is full, or it is gone: UDP drops
            self.counts["reply dropped"] += 1
            return
        self.counts["replied"] += 1
        self._active()

    def _drop(self, why: str, message: str, *args) -> None:
        """Count a dropped datagram; the first of each kind per association is logged at debug level."""
        self.counts[why] += 1
        if self.counts[why] == 1:
            log.debug("SOCKS5 UDP relay %s:%d: dropped " + message, *self.address, *args)


async def _until_closed(control: Connection) -> None:
    """Read (and discard) the control connection until EOF or an error: its end ends the association."""
    buf = bytearray(512)
    try:
        while await control.recv_into(buf):
            pass
    except OSError:
        pass
