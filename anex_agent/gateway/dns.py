"""DNS for the mesh: a forwarder on the gateway's mesh address, port 53, UDP and TCP.

Every query is parsed with dnspython and sent to the configured upstream (the cluster
DNS) over the same transport it came in on; the upstream's answer goes back unchanged
in substance and with the client's ID (RFC 1035 §4.1.1: the ID is copied into the
reply). When the upstream does not answer within ``timeout`` or fails, the client gets
SERVFAIL (RFC 1035 §4.1.1 RCODE 2); a query that cannot be parsed gets FORMERR
(RCODE 1) when at least its ID can be read, else nothing.

Who may connect: the listener binds only the gateway's mesh address, and the gateway's
nftables input chain drops port 53 to that address from any interface but the mesh
one (and loopback). No recursion of our own, no cache: the upstream decides.

Concurrency: at most ``max_inflight`` UDP queries are forwarded at once (extra ones are
dropped, as a loaded resolver does; clients retry). Each query's task is named and
owned by the TaskGroup passed to :meth:`DnsForwarder.serve`.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from dataclasses import dataclass

import dns.asyncquery
import dns.exception
import dns.message
import dns.rcode

from anex_agent.gateway.settings import DNS_PORT

log = logging.getLogger(__name__)

#: RFC 1035 §4.2.2: TCP messages carry a two-byte length prefix.
TCP_LENGTH = struct.Struct("!H")
TCP_IDLE_TIMEOUT = 30.0


def error_reply(query_wire: bytes, rcode: int) -> bytes | None:
    """A minimal reply with ``rcode`` echoing the query's ID (and question when parseable)."""
    try:
        query = dns.message.from_wire(query_wire)
    except Exception:
        if len(query_wire) < 2:
            return None
        (qid,) = struct.unpack("!H", query_wire[:2])
        flags = 0x8000 | (rcode & 0xF)  # QR=1, opcode QUERY, RCODE
        return struct.pack("!HHHHHH", qid, flags, 0, 0, 0, 0)
    reply = dns.message.make_response(query)
    reply.set_rcode(rcode)
    return reply.to_wire()


@dataclass
class DnsForwarder:
    """Forwards mesh DNS queries to ``upstream``. Bind with :meth:`serve` (inside the caller's TaskGroup)."""

    listen_host: str
    upstream: tuple[str, int]
    listen_port: int = DNS_PORT
    timeout: float = 3.0
    max_inflight: int = 512

    def __post_init__(self) -> None:
        self._inflight = 0
        self._transport: asyncio.DatagramTransport | None = None
        self._server: asyncio.base_events.Server | None = None

    # ------------------------------------------------------------ forwarding core

    async def resolve(self, query_wire: bytes, *, tcp: bool) -> bytes | None:
        """The reply for one query (SERVFAIL on upstream failure, FORMERR if unparseable)."""
        try:
            query = dns.message.from_wire(query_wire)
        except Exception:
            return error_reply(query_wire, dns.rcode.FORMERR)
        host, port = self.upstream
        try:
            if tcp:
                answer = await dns.asyncquery.tcp(query, host, port=port, timeout=self.timeout)
            else:
                answer = await dns.asyncquery.udp(query, host, port=port, timeout=self.timeout,
                                                  ignore_unexpected=True, raise_on_truncation=False)
        except (dns.exception.Timeout, asyncio.TimeoutError):
            log.info("DNS upstream %s:%s did not answer within %.1f s", host, port, self.timeout)
            return error_reply(query_wire, dns.rcode.SERVFAIL)
        except (OSError, dns.exception.DNSException, EOFError) as err:
            log.info("DNS upstream %s:%s failed: %s", host, port, err)
            return error_reply(query_wire, dns.rcode.SERVFAIL)
        answer.id = query.id
        # Keep the upstream's wire form as far as dnspython allows; no size cap on TCP,
        # and on UDP the client's advertised size (or 512) as the upstream already applied.
        return answer.to_wire(max_size=65535)

    # ------------------------------------------------------------ listeners

    async def serve(self, tg: asyncio.TaskGroup) -> None:
        """Bind UDP and TCP on (listen_host, listen_port). Queries run as tasks of ``tg``."""
        loop = asyncio.get_running_loop()
        forwarder = self

        class _Udp(asyncio.DatagramProtocol):
            def datagram_received(self, data: bytes, addr) -> None:
                if forwarder._inflight >= forwarder.max_inflight:
                    return
                try:
                    tg.create_task(forwarder._answer_udp(data, addr), name=f"dns-udp-{addr[0]}:{addr[1]}")
                except RuntimeError:  # the TaskGroup is shutting down: drop, the client retries
                    return
                forwarder._inflight += 1

        self._transport, _ = await loop.create_datagram_endpoint(_Udp, local_addr=(self.listen_host, self.listen_port))

        async def on_tcp(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await self._serve_tcp(reader, writer)

        self._server = await asyncio.start_server(on_tcp, self.listen_host, self.listen_port)
        log.info("DNS forwarder on %s:%s -> %s:%s", self.listen_host, self.listen_port, *self.upstream)

    @property
    def bound_port(self) -> int:
        assert self._transport is not None
        return self._transport.get_extra_info("sockname")[1]

    async def _answer_udp(self, data: bytes, addr) -> None:
        try:
            reply = await self.resolve(data, tcp=False)
            if reply is not None and self._transport is not None and not self._transport.is_closing():
                self._transport.sendto(reply, addr)
        finally:
            self._inflight -= 1

    async def _serve_tcp(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(TCP_IDLE_TIMEOUT):
                        header = await reader.readexactly(2)
                    (length,) = TCP_LENGTH.unpack(header)
                    async with asyncio.timeout(TCP_IDLE_TIMEOUT):
                        data = await reader.readexactly(length)
                except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError):
                    return
                reply = await self.resolve(data, tcp=True)
                if reply is None:
                    return
                writer.write(TCP_LENGTH.pack(len(reply)) + reply)
                await writer.drain()
        except ConnectionError:
            return
        finally:
            writer.close()

    async def close(self) -> None:
        if self._transport is not None:
            self._transport.close()
            self._transport = None
        if self._server is not None:
            self._server.close()
            try:
                async with asyncio.timeout(5):
                    await self._server.wait_closed()
            except asyncio.TimeoutError:
                pass
            self._server = None
