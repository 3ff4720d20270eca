"""The HTTP/1.1 forward proxy the workload reaches at ``ANEX_PROXY_LISTEN`` (127.0.0.1:3128).

What it does (h11 on both sides; the pure decisions are in :mod:`.proxy_core`):

* ``CONNECT host:port`` -> dial, answer ``200``, then relay bytes both ways
  (:func:`anex_agent.frontends.relay.relay`: half-close, ``os.splice``);
* absolute-form requests (``GET http://host:port/path``) for every method: hop-by-hop
  fields removed (RFC 9110 §7.6.1), ``Host`` set from the URL, ``Via`` added; request
  and response bodies are streamed in both directions at the same time (never
  buffered whole), chunked or with Content-Length; ``Expect: 100-continue`` is
  answered by the proxy;
* keep-alive: a client connection may carry many requests, each to any origin. Origin
  connections are reused only by the same client connection (never shared between
  clients), only after a complete exchange that both sides left reusable; an idempotent
  request (RFC 9110 §9.2.2) without a body that fails on a reused connection before any
  response byte is retried once on a fresh one; any other such failure is a ``502``;
* errors: ``400`` (text) for a malformed request, one with ambiguous body framing
  (Content-Length and Transfer-Encoding together, RFC 9112 §6.3; never forwarded), or a
  target that is not absolute-form / authority-form, ``403`` when a client from beyond
  loopback asks for this machine (:mod:`.this_host`), ``407`` with a Basic challenge
  when credentials are configured and missing or wrong, ``502`` naming ``host:port``
  and the reason when the destination does not resolve or does not accept the
  connection. Error responses close the client connection.

Who may connect: anyone who can reach the listen address. The default is loopback
(processes on this machine only); binding anywhere else without ``auth`` logs a warning.

Start it in-process::

    async with ProxyServer(OSDialer(resolver), host="127.0.0.1", port=3128) as proxy:
        print(proxy.address)
        await proxy.wait_closed()      # or do other work; leaving the block stops it
"""

from __future__ import annotations

import asyncio
import collections
import logging

import h11

from anex_agent.net.dialer import Connection, Dialer
from anex_agent.errors import BadRequest, DialError
from anex_agent.frontends import proxy_core as core
from anex_agent.frontends import this_host
from anex_agent.frontends.dial_guard import Forbidden, dial_for_client
from anex_agent.net.http.stream import H11Stream
from anex_agent.frontends.relay import relay
from anex_agent.frontends.tcp_server import DEFAULT_MAX_CONNECTIONS, TcpServer
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

IDLE_TIMEOUT = 120.0  # seconds a client connection may wait before (or between) request heads
ORIGINS_PER_CLIENT = 4  # idle origin connections kept per client connection


class _Forbidden(Exception):
    """The client may not reach that destination; the text is the 403 body."""


class _ClientGone(Exception):
    """The client closed or broke its connection in the middle of a request."""


class _OriginFailed(Exception):
    """The origin connection failed; ``started`` says whether a response had begun."""

    def __init__(self, started: bool) -> None:
        self.started = started
        super().__init__("origin failed after the response started" if started else "origin failed before responding")


class _OriginWriteFailed(Exception):
    """The origin stopped accepting the request body."""


class ProxyServer(TcpServer):
    """Listens for proxy clients and serves each connection in a named task.

    Async context manager: entering binds (``PortInUseError`` naming ANEX_PROXY_LISTEN
    when the port is taken) and starts accepting; leaving stops and closes everything.
    """

    listen_source = "ANEX_PROXY_LISTEN"
    task_prefix = "proxy"
    what = "HTTP proxy"

    def __init__(
        self,
        dialer: Dialer,
        *,
        host: str = core.DEFAULT_LISTEN[0],
        port: int = core.DEFAULT_LISTEN[1],
        auth: core.ProxyAuth | None = None,
        idle_timeout: float = IDLE_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
    ) -> None:
        super().__init__(host, port, max_connections)
        self.dialer = dialer
        self.auth = auth
        self.idle_timeout = idle_timeout

    def started(self) -> None:
        if not core.is_loopback(self.host) and self.auth is None:
            log.warning(
                "HTTP proxy listens on %s:%d WITHOUT authentication: anyone who reaches that address can use the "
                "mesh through it; set proxy credentials or bind 127.0.0.1",
                *self.address,
            )
        log.info("HTTP proxy on %s:%d (%s)", *self.address, "auth required" if self.auth else "no auth")

    async def serve_client(self, conn: Connection, client_ip: str) -> None:
        session = _ClientSession(self, conn, client_ip)
        try:
            await session.run()
        finally:
            await session.aclose()


class _ClientSession:
    """One client connection: a loop of requests, each proxied to its origin."""

    def __init__(self, server: ProxyServer, conn: Connection, client_ip: str) -> None:
        self.server = server
        self.client_ip = client_ip
        self.client = H11Stream.over_connection(h11.SERVER, conn)
        self.origins: collections.OrderedDict[tuple[str, int], H11Stream] = collections.OrderedDict()

    async def aclose(self) -> None:
        for origin in self.origins.values():
            await origin.conn.aclose()
        self.origins.clear()
        await self.client.conn.aclose()

    async def run(self) -> None:
        while True:
            try:
                async with asyncio.timeout(self.server.idle_timeout):
                    event = await self.client.next_event()
            except TimeoutError:
                return
            except h11.RemoteProtocolError as exc:
                await self.reply_error(exc.error_status_hint, "malformed HTTP/1.1 request")
                return
            except OSError:
                return
            if not isinstance(event, h11.Request):  # ConnectionClosed, PAUSED
                return
            if not await self.handle(event):
                return
            if self.client.h11.our_state is h11.DONE and self.client.h11.their_state is h11.DONE:
                self.client.h11.start_next_cycle()
            else:
                return

    async def reply_error(self, status: int, text: str, extra: core.Headers = ()) -> None:
        status, reason, headers, body = core.error_response(status, text)
        try:
            await self.client.send(h11.Response(status_code=status, headers=list(extra) + headers, reason=reason))
            await self.client.send(h11.Data(data=body))
            await self.client.send(h11.EndOfMessage(), flush=True)
        except (h11.LocalProtocolError, OSError):
            pass  # the client is gone or the state forbids a response: closing says enough

    async def handle(self, request: h11.Request) -> bool:
        """Proxy one request; True when the client connection may carry another."""
        headers = request.headers.raw_items()
        framing = core.framing_error(headers)
        if framing is not None:
            await self.reply_error(400, framing)  # and close: the body's end is unknown
            return False
        auth = self.server.auth
        if auth is not None and not auth.check(headers):
            await self.reply_error(407, "proxy authentication required (Basic)", auth.challenge())
            return False
        try:
            dest = core.parse_target(request.method, request.target)
        except BadRequest as err:
            await self.reply_error(400, err.reason)
            return False
        if not this_host.may_reach(self.client_ip, dest.host):  # before dialling anything
            await self.reply_error(403, core.forbidden_text(dest.host, dest.port))
            return False
        log.debug("proxy: %s %s", peer_text(request.method), peer_text(str(dest)))
        if request.method == b"CONNECT":
            await self.tunnel(dest)
            return False
        return await self.forward(request, dest, headers)

    # ------------------------------------------------------------------ CONNECT

    async def tunnel(self, dest: core.Destination) -> None:
        try:
            event = await self.client.next_event()  # EndOfMessage of the CONNECT request
        except (h11.RemoteProtocolError, OSError):
            return
        if not isinstance(event, h11.EndOfMessage):
            await self.reply_error(400, "CONNECT requests carry no body")
            return
        try:
            upstream = await self.dial(dest)
        except DialError as err:
            await self.reply_error(502, core.unreachable_text(dest.host, dest.port, err.reason))
            return
        except _Forbidden as err:
            await self.reply_error(403, str(err))
            return
        try:
            # RFC 9110 §9.3.6: 2xx, no Content-Length / Transfer-Encoding; then a tunnel
            await self.client.send(h11.Response(status_code=200, headers=[(b"Via", core.VIA)], reason=b"Connection established"), flush=True)
            prefix, _ = self.client.h11.trailing_data
            await relay(self.client.conn, upstream, a_to_b_prefix=bytes(prefix))
        except OSError:
            pass
        finally:
            await upstream.aclose()

    # ------------------------------------------------------------------ absolute-form

    async def forward(self, request: h11.Request, dest: core.Destination, headers: core.Headers) -> bool:
        with_body = core.has_body(headers)
        chunked = core.is_chunked(headers)
        out = h11.Request(
            method=request.method, target=dest.path, headers=core.request_headers(headers, dest, chunked=chunked)
        )
        if not with_body:
            # consume the request's end now, so that a retry does not wait for it again
            try:
                event = await self.client.next_event()
            except (h11.RemoteProtocolError, OSError):
                return False
            if not isinstance(event, h11.EndOfMessage):
                return False
        for attempt in range(2):
            try:
                origin, reused = await self.origin_for(dest, fresh=attempt > 0)
            except DialError as err:
                await self.reply_error(502, core.unreachable_text(dest.host, dest.port, err.reason))
                return False
            except _Forbidden as err:
                await self.reply_error(403, str(err))
                return False
            try:
                await self.exchange(request, out, origin, with_body=with_body, chunked=chunked)
            except _OriginFailed as failure:
                self.drop_origin(dest.key, origin)
                await origin.conn.aclose()
                if failure.started:
                    return False  # the client saw part of a response: only closing tells it
                if reused and attempt == 0 and core.may_retry(request.method, with_body):
                    log.debug("proxy: reused connection to %s:%d was stale; retrying", peer_text(dest.host), dest.port)
                    continue
                await self.reply_error(
                    502, core.unreachable_text(dest.host, dest.port, "the connection closed before a response")
                )
                return False
            except _ClientGone:
                self.drop_origin(dest.key, origin)
                await origin.conn.aclose()
                return False
            await self.keep_or_close_origin(dest.key, origin)
            return True
        return False

    async def origin_for(self, dest: core.Destination, *, fresh: bool) -> tuple[H11Stream, bool]:
        """An idle origin connection for ``dest`` (reused unless ``fresh``) and whether it was reused."""
        if not fresh:
            origin = self.origins.pop(dest.key, None)
            if origin is not None:
                return origin, True
        conn = await self.dial(dest)
        return H11Stream.over_connection(h11.CLIENT, conn), False

    async def dial(self, dest: core.Destination) -> Connection:
        """Open a connection for this client; raises DialError, or _Forbidden.

        :meth:`handle` has refused every spelling of this machine already; a name that
        resolved to it is caught here (:func:`.dial_guard.dial_for_client`): a 403 too.
        """
        try:
            return await dial_for_client(self.server.dialer, self.client_ip, dest.host, dest.port)
        except Forbidden:
            raise _Forbidden(core.forbidden_text(dest.host, dest.port)) from None

    def drop_origin(self, key: tuple[str, int], origin: H11Stream) -> None:
        if self.origins.get(key) is origin:
            del self.origins[key]

    async def keep_or_close_origin(self, key: tuple[str, int], origin: H11Stream) -> None:
        """Keep ``origin`` for the next request of this client if both directions ended cleanly."""
        h = origin.h11
        if h.our_state is h11.DONE and h.their_state is h11.DONE:
            h.start_next_cycle()
            old = self.origins.pop(key, None)
            if old is not None and old is not origin:
                await old.conn.aclose()
            self.origins[key] = origin
            while len(self.origins) > ORIGINS_PER_CLIENT:
                _, evicted = self.origins.popitem(last=False)
                await evicted.conn.aclose()
        else:
            await origin.conn.aclose()

    async def exchange(self, request: h11.Request, out: h11.Request, origin: H11Stream, *, with_body: bool, chunked: bool) -> None:
        """Send ``out`` (+ the client's body) to ``origin`` and stream the response back."""
        try:
            await origin.send(out)
        except (OSError, h11.LocalProtocolError):
            raise _OriginFailed(started=False) from None
        if not with_body:  # the client's EndOfMessage was consumed by forward()
            try:
                await origin.send(h11.EndOfMessage(), flush=True)
            except OSError:
                raise _OriginFailed(started=False) from None
            await self.relay_response(request, origin)
            return
        if self.client.h11.they_are_waiting_for_100_continue:
            await self.client.send(h11.InformationalResponse(status_code=100, headers=[(b"Via", core.VIA)]), flush=True)
        try:
            async with asyncio.TaskGroup() as tg:
                pump = tg.create_task(self.pump_request_body(origin, chunked), name="proxy-request-body")
                await self.relay_response(request, origin)
                if not pump.done():
                    # the origin answered before reading the whole body (e.g. 413): stop
                    # forwarding; the client connection cannot be reused after this
                    pump.cancel()
        except BaseExceptionGroup as group:
            if group.subgroup(_ClientGone) is not None:
                raise _ClientGone() from None
            failed = group.subgroup(_OriginFailed)
            if failed is not None:
                raise failed.exceptions[0] from None
            raise

    async def pump_request_body(self, origin: H11Stream, chunked: bool) -> None:
        """Client body -> origin; returns early (quietly) when the origin stops reading."""

        async def flush_origin() -> None:
            try:
                await origin.flush()
            except OSError:
                raise _OriginWriteFailed() from None

        while True:
            try:
                event = await self.client.next_event(before_wait=flush_origin)
            except _OriginWriteFailed:
                return
            except (h11.RemoteProtocolError, OSError):
                raise _ClientGone() from None
            if isinstance(event, h11.Data):
                data, trailers = event.data, None
            elif isinstance(event, h11.EndOfMessage):
                data, trailers = None, (list(event.headers.raw_items()) if chunked else [])
            else:
                raise _ClientGone()
            try:
                if data is not None:
                    await origin.send(h11.Data(data=data))
                else:
                    await origin.send(h11.EndOfMessage(headers=trailers), flush=True)
                    return
            except (OSError, h11.LocalProtocolError):
                # the origin stopped reading; its response (if any) still comes back
                return

    async def relay_response(self, request: h11.Request, origin: H11Stream) -> None:
        started = False
        client_chunked = False

        async def flush_client() -> None:
            try:
                await self.client.flush()
            except OSError:
                raise _ClientGone() from None

        while True:
            try:
                event = await origin.next_event(before_wait=flush_client)
            except (h11.RemoteProtocolError, OSError):
                raise _OriginFailed(started) from None
            try:
                if isinstance(event, h11.InformationalResponse):
                    if event.status_code != 101:  # Upgrade is hop-by-hop: never forwarded
                        await self.client.send(
                            h11.InformationalResponse(
                                status_code=event.status_code,
                                headers=core.response_headers(event.headers.raw_items()),
                                reason=event.reason,
                            )
                        )
                elif isinstance(event, h11.Response):
                    raw = event.headers.raw_items()
                    out_headers = core.response_headers(raw)
                    client_chunked = (
                        self.client.h11.their_http_version == b"1.1"
                        and request.method != b"HEAD"
                        and event.status_code not in (204, 304)
                        and not any(n.lower() == b"content-length" for n, _ in out_headers)
                    )
                    await self.client.send(
                        h11.Response(status_code=event.status_code, headers=out_headers, reason=event.reason)
                    )
                    started = True
                elif isinstance(event, h11.Data):
                    await self.client.send(h11.Data(data=event.data))
                elif isinstance(event, h11.EndOfMessage):
                    trailers = list(event.headers.raw_items()) if client_chunked else []
                    await self.client.send(h11.EndOfMessage(headers=trailers), flush=True)
                    return
                else:  # ConnectionClosed before the end
                    raise _OriginFailed(started)
            except OSError:
                raise _ClientGone() from None
