"""A small HTTP/1.1 client over asyncio streams (h11 through :mod:`.stream`), for the coordinator client.

Contract:
* :meth:`HttpClient.request` sends one request and returns ``(status, headers, body)``;
  :meth:`HttpClient.stream` does the same but hands the body over chunk by chunk as it
  arrives (never the whole body in memory).
* Connections are kept alive and reused per (scheme, host, port); a reused connection
  that the server had closed while idle is replaced once, before any answer was read.
* ``https://``: TLS with the ``ssl_context`` given (certificate and host name verified
  against the URL's host, SNI sent).
* ``proxy`` (``http://[USER:PASS@]HOST:PORT``): ``https://`` targets through ``CONNECT``;
  ``http://`` targets as absolute-form requests to the proxy (as browsers and aiohttp do).
  The user and password in the proxy URL go in ``Proxy-Authorization: Basic``.
* ``timeout`` bounds the whole call (connect, send, the whole answer); a streamed call
  bounds only the connect and the answer's head (``connect_timeout``).
* An answer body larger than ``max_body`` bytes fails the call.
* Failures: :class:`HttpError` (connection refused or lost, TLS, proxy refusal, a broken
  answer, a body too large) and :class:`TimeoutError`; the caller maps them.
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from urllib.parse import unquote, urlencode, urlsplit

import h11

from anex_agent.errors import AnexError
from anex_agent.net.http.stream import H11Stream

READ_CHUNK = 64 * 1024
DEFAULT_MAX_BODY = 256 << 20
MAX_IDLE_PER_HOST = 4
USER_AGENT = "anex-agent"


class HttpError(AnexError):
    """The request could not be completed (no answer, or an unusable one)."""


class BodyTooLarge(HttpError):
    pass


Headers = dict[str, str]  # lower-case names


class _Conn:
    """One HTTP/1.1 connection: an asyncio stream pair and its h11 stream."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, reused: bool = False) -> None:
        self.reader = reader
        self.writer = writer
        self.stream = H11Stream.over_streams(h11.CLIENT, reader, writer, read_chunk=READ_CHUNK)
        self.h11 = self.stream.h11
        self.reused = reused

    @property
    def got_bytes(self) -> bool:
        return self.stream.got_bytes

    def usable(self) -> bool:
        return (not self.writer.is_closing() and not self.reader.at_eof()
                and self.h11.our_state is h11.IDLE and self.h11.their_state is h11.IDLE)

    async def send(self, *events) -> None:
        await self.stream.send(*events, flush=True)

    async def next_event(self):
        try:
            return await self.stream.next_event()
        except h11.RemoteProtocolError as err:
            raise HttpError(f"a broken HTTP answer: {err}") from None

    def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()


class StreamedResponse:
    """An answer whose body is read with :meth:`chunks` (or :meth:`read`)."""

    def __init__(self, conn: _Conn, status: int, headers: Headers, max_body: int) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        self._max_body = max_body
        self.complete = False

    async def chunks(self) -> AsyncIterator[bytes]:
        total = 0
        while True:
            event = await self._conn.next_event()
            if isinstance(event, h11.Data):
                total += len(event.data)
                if total > self._max_body:
                    raise BodyTooLarge(f"the answer is larger than {self._max_body} bytes")
                if event.data:
                    yield bytes(event.data)
            elif isinstance(event, h11.EndOfMessage):
                self.complete = True
                return
            elif isinstance(event, h11.ConnectionClosed):
                raise HttpError("the server closed the connection before the answer was complete")

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])


class HttpClient:
    """See the module docstring. ``ssl_context`` is called once, on the first ``https://`` call."""

    def __init__(self, *, ssl_context: Callable[[], ssl.SSLContext] | None = None, proxy: str | None = None,
                 timeout: float | None = 10.0, max_body: int = DEFAULT_MAX_BODY) -> None:
        self._ssl_factory = ssl_context or ssl.create_default_context
        self._ssl: ssl.SSLContext | None = None
        self.proxy = proxy
        self.timeout = timeout
        self.max_body = max_body
        self._idle: dict[tuple[str, str, int], list[_Conn]] = {}
        self._closed = False

    async def close(self) -> None:
        for conns in self._idle.values():
            for conn in conns:
                conn.close()
        self._idle.clear()

    # ------------------------------------------------------------ public

    async def request(self, method: str, url: str, *, headers: Headers | None = None, body: bytes | None = None,
                      timeout: float | None = ...) -> tuple[int, Headers, bytes]:  # type: ignore[assignment]
        total = self.timeout if timeout is ... else timeout
        async with asyncio.timeout(total):
            async with self._exchange(method, url, headers or {}, body) as response:
                data = await response.read()
                return response.status, response.headers, data

    @asynccontextmanager
    async def stream(self, method: str, url: str, *, headers: Headers | None = None, body: bytes | None = None,
                     connect_timeout: float | None = 10.0) -> AsyncIterator[StreamedResponse]:
        """The answer, its head read within ``connect_timeout``; its body read as it comes."""
        opened = self._exchange(method, url, headers or {}, body)
        async with asyncio.timeout(connect_timeout):
            response = await opened.__aenter__()
        try:
            yield response
        except BaseException as err:
            if not await opened.__aexit__(type(err), err, err.__traceback__):
                raise
        else:
            await opened.__aexit__(None, None, None)

    # ------------------------------------------------------------ internals

    @asynccontextmanager
    async def _exchange(self, method: str, url: str, headers: Headers, body: bytes | None):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise HttpError(f"{url!r} is not an http:// or https:// URL")
        port = parts.port or (443 if parts.scheme == "https" else 80)
        key = (parts.scheme, parts.hostname, port)
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host_header = parts.netloc.rpartition("@")[2]
        if self.proxy and parts.scheme == "http":
            target = f"http://{host_header}{target}"
        head = [("Host", host_header), ("User-Agent", USER_AGENT), ("Accept-Encoding", "identity")]
        head += list(headers.items())
        if self.proxy and parts.scheme == "http":
            head += self._proxy_auth()
        if body is not None:
            head.append(("Content-Length", str(len(body))))
        request = h11.Request(method=method, target=target, headers=head)
        for attempt in (0, 1):
            conn = await self._connection(key)
            try:
                await conn.send(request, *( [h11.Data(data=body)] if body else []), h11.EndOfMessage())
                event = await conn.next_event()
                while isinstance(event, h11.InformationalResponse):
                    event = await conn.next_event()
                if isinstance(event, h11.ConnectionClosed):
                    raise HttpError("the server closed the connection without answering")
            except (HttpError, OSError) as err:
                conn.close()
                if attempt == 0 and conn.reused and not conn.got_bytes:
                    continue  # the server had closed the idle connection: once more on a fresh one
                if isinstance(err, ssl.SSLError):
                    raise HttpError(f"TLS with {parts.hostname}:{port}: {err.reason or err}") from None
                raise err if isinstance(err, HttpError) else HttpError(_os_error(err)) from None
            except BaseException:
                conn.close()
                raise
            break
        response = StreamedResponse(conn, event.status_code,
                                    {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in event.headers},
                                    self.max_body)
        try:
            yield response
        except OSError as err:
            conn.close()
            raise HttpError(_os_error(err)) from None
        except BaseException:
            conn.close()
            raise
        self._release(key, conn, response)

    def _release(self, key, conn: _Conn, response: StreamedResponse) -> None:
        if not response.complete or conn.h11.our_state is not h11.DONE or conn.h11.their_state is not h11.DONE:
            conn.close()
            return
        try:
            conn.h11.start_next_cycle()
        except h11.LocalProtocolError:
            conn.close()
            return
        idle = self._idle.setdefault(key, [])
        if len(idle) >= MAX_IDLE_PER_HOST:
            conn.close()
        else:
            idle.append(conn)

    async def _connection(self, key: tuple[str, str, int]) -> _Conn:
        idle = self._idle.get(key, [])
        while idle:
            conn = idle.pop()
            if conn.usable():
                conn.reused = True
                conn.stream.got_bytes = False
                return conn
            conn.close()
        scheme, host, port = key
        context = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = self._ssl_factory()
            context = self._ssl
        try:
            if self.proxy:
                reader, writer = await self._via_proxy(host, port, context)
            else:
                reader, writer = await asyncio.open_connection(host, port, ssl=context,
                                                               server_hostname=host if context else None,
                                                               limit=READ_CHUNK * 2)
        except ssl.SSLError as err:
            raise HttpError(f"TLS with {host}:{port}: {err.reason or err}") from None
        except OSError as err:
            raise HttpError(f"cannot connect to {host}:{port}: {_os_error(err)}") from None
        return _Conn(reader, writer)

    def _proxy_auth(self) -> list[tuple[str, str]]:
        parts = urlsplit(self.proxy or "")
        if parts.username is None:
            return []
        secret = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        return [("Proxy-Authorization", "Basic " + base64.b64encode(secret).decode())]

    async def _via_proxy(self, host: str, port: int, context: ssl.SSLContext | None):
        proxy = urlsplit(self.proxy or "")
        if proxy.scheme not in ("http", "") or not proxy.hostname:
            raise HttpError(f"the proxy {self.proxy!r} is not an http://HOST:PORT URL")
        reader, writer = await asyncio.open_connection(proxy.hostname, proxy.port or 80, limit=READ_CHUNK * 2)
        if context is None:  # http:// target: absolute-form requests go to the proxy itself
            return reader, writer
        try:
            authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            conn = _Conn(reader, writer)
            await conn.send(h11.Request(method="CONNECT", target=authority,
                                        headers=[("Host", authority), ("User-Agent", USER_AGENT), *self._proxy_auth()]),
                            h11.EndOfMessage())
            event = await conn.next_event()
            while isinstance(event, h11.InformationalResponse):
                event = await conn.next_event()
            if not isinstance(event, h11.Response) or not 200 <= event.status_code < 300:
                status = getattr(event, "status_code", None)
                raise HttpError(f"the proxy {proxy.hostname}:{proxy.port or 80} refused CONNECT {authority}"
                                + (f" ({status})" if status else ""))
            await writer.start_tls(context, server_hostname=host)
        except BaseException:
            writer.close()
            raise
        return reader, writer


def _os_error(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


def with_query(url: str, params: dict[str, str]) -> str:
    return f"{url}{'&' if '?' in url else '?'}{urlencode(params)}" if params else url
