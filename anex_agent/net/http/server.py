"""A small HTTP/1.1 server over asyncio streams (h11 through :mod:`.stream`), for the agent API.

Contract:
* :class:`HttpServer` serves one ``handler(Request) -> Response | StreamResponse`` on any
  number of TCP listeners (:meth:`HttpServer.listen`) and on streams handed over by an
  engine that holds the mesh address itself (:meth:`HttpServer.protocol_factory`: an
  asyncio protocol factory; the transport's ``peername`` is the caller).
* Connections are kept alive between requests (idle at most :data:`KEEPALIVE_TIMEOUT` s);
  a request's head must arrive within :data:`HEAD_TIMEOUT` s and be at most
  :data:`~anex_agent.net.http.stream.MAX_HEAD_BYTES`. A broken request is answered 400 with the fixed text
  :data:`MALFORMED` and the connection closed; what h11 found wrong is logged at debug level
  only (the peer never sees exception text).
* A request body is read by the handler (:meth:`Request.chunks`); what it leaves unread is
  discarded up to :data:`MAX_DISCARD` bytes, beyond which the connection is closed.
* A :class:`StreamResponse` is written chunk by chunk as its iterator yields, each chunk
  sent at once (``follow`` streams); it ends when the iterator ends or the caller goes
  away (the iterator is then closed). Such a connection is not reused.
* A handler that raises gets a 500 problem document (logged); errors never leak details.
* :meth:`HttpServer.close` stops every listener and ends every open connection.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import h11

from anex_agent import parse
from anex_agent.errors import BadRequest
from anex_agent.net.http.stream import H11Stream
from anex_agent.net.peer_log import peer_text

log = logging.getLogger(__name__)

HEAD_TIMEOUT = 30.0
KEEPALIVE_TIMEOUT = 75.0
MAX_DISCARD = 1 << 20
READ_CHUNK = 64 * 1024
#: The detail of the 400 answering a request that does not parse (the same for every flaw).
MALFORMED = "bad request: malformed HTTP"


class Headers(dict):
    """Header fields by lower-case name (the last one of a repeated field)."""

    def get(self, name: str, default: Any = None) -> Any:  # type: ignore[override]
        return super().get(name.lower(), default)

    def __getitem__(self, name: str) -> str:
        return super().__getitem__(name.lower())

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name.lower() if isinstance(name, str) else name)


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]  # the first value of each parameter
    headers: Headers
    peername: Any
    content_length: int | None
    _body: Callable[[], Awaitable[bytes | None]] = field(repr=False)
    _done: bool = field(default=False, repr=False)

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body as it arrives."""
        while not self._done:
            chunk = await self._body()
            if chunk is None:
                self._done = True
                return
            if chunk:
                yield chunk


@dataclass
class Response:
    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/plain; charset=utf-8"


@dataclass
class StreamResponse:
    chunks: AsyncIterator[bytes]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "text/plain; charset=utf-8"


def text_response(text: str, status: int = 200) -> Response:
    return Response(status=status, body=text.encode())


def json_response(doc: Any, status: int = 200, *, content_type: str = "application/json",
                  headers: dict[str, str] | None = None, dumps: Callable[[Any], str] = json.dumps) -> Response:
    return Response(status=status, body=dumps(doc).encode(), headers=dict(headers or {}), content_type=content_type)


def problem(status: int, title: str, detail: str, headers: dict[str, str] | None = None, **extra: Any) -> Response:
    """An RFC 9457 problem document."""
    body = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return json_response(body, status, content_type="application/problem+json", headers=headers)


Handler = Callable[[Request], Awaitable["Response | StreamResponse"]]


class HttpServer:
    """See the module docstring."""

    def __init__(self, handler: Handler, *, name: str = "http") -> None:
        self._handler = handler
        self._name = name
        self._servers: dict[tuple[str, int], asyncio.Server] = {}
        self._connections: set[asyncio.Task] = set()

    # ------------------------------------------------------------ listeners

    async def listen(self, host: str, port: int) -> None:
        if (host, port) in self._servers:
            return
        loop = asyncio.get_running_loop()
        self._servers[(host, port)] = await loop.create_server(self.protocol_factory(), host, port, reuse_address=True)

    def listening(self, host: str, port: int) -> bool:
        return (host, port) in self._servers

    async def stop_listening(self, host: str, port: int) -> None:
        server = self._servers.pop((host, port), None)
        if server is not None:
            server.close()

    def protocol_factory(self) -> Callable[[], asyncio.Protocol]:
        def build() -> asyncio.Protocol:
            return asyncio.StreamReaderProtocol(asyncio.StreamReader(limit=2 * READ_CHUNK), self._connected)

        return build

    def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.get_running_loop().create_task(self.serve(reader, writer), name=f"{self._name}-connection")
        self._connections.add(task)
        task.add_done_callback(self._connections.discard)

    async def close(self) -> None:
        for key in list(self._servers):
            await self.stop_listening(*key)
        tasks = list(self._connections)
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    # ------------------------------------------------------------ one connection

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one connection until it closes."""
        stream = H11Stream.over_streams(h11.SERVER, reader, writer, read_chunk=READ_CHUNK)
        conn = stream.h11
        next_event = stream.next_event
        peer = writer.get_extra_info("peername")

        async def send(*events) -> None:
            await stream.send(*events, flush=True)

        try:
            while True:
                try:
                    async with asyncio.timeout(KEEPALIVE_TIMEOUT if conn.their_state is h11.IDLE else HEAD_TIMEOUT):
                        event = await next_event()
                        if isinstance(event, h11.Request):
                            pass
                        elif isinstance(event, h11.ConnectionClosed):
                            return
                        else:
                            raise BadRequest(f"unexpected {type(event).__name__}")
                except (h11.RemoteProtocolError, BadRequest) as err:
                    log.debug("%s: a malformed request from %s: %s", self._name, peer, peer_text(str(err)))
                    if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                        await self._send_plain(send, problem(400, "Bad Request", MALFORMED), close=True)
                    return
                except TimeoutError:
                    return
                request = self._request(event, peer, next_event)
                keep = await self._answer(conn, send, request, reader)
                if not keep or conn.our_state is not h11.DONE:
                    return
                # discard what the handler left of the body, within bounds
                discarded = 0
                while conn.their_state is h11.SEND_BODY:
                    event = await next_event()
                    if isinstance(event, h11.Data):
                        discarded += len(event.data)
                        if discarded > MAX_DISCARD:
                            return
                    elif isinstance(event, h11.ConnectionClosed):
                        return
                if conn.their_state is not h11.DONE:
                    return
                conn.start_next_cycle()
        except (OSError, h11.ProtocolError, asyncio.IncompleteReadError, BadRequest):
            return
        except Exception:
            log.exception("%s: a connection from %s failed", self._name, peer)
        finally:
            writer.close()

    def _request(self, event: h11.Request, peer: Any, next_event) -> Request:
        target = event.target.decode("latin-1")
        parts = urlsplit(target)
        query: dict[str, str] = {}
        for name, value in parse_qsl(parts.query, keep_blank_values=True):
            query.setdefault(name, value)
        headers = Headers((k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in event.headers)
        length = headers.get("content-length")

        async def body() -> bytes | None:
            event = await next_event()
            if isinstance(event, h11.Data):
                return bytes(event.data)
            if isinstance(event, h11.EndOfMessage):
                return None
            raise BadRequest("the request body ended early")

        return Request(method=event.method.decode("ascii", "replace").upper(), path=parts.path or "/",
                       query=query, headers=headers, peername=peer,
                       content_length=int(length) if parse.is_integer(length) else None, _body=body)

    async def _answer(self, conn: h11.Connection, send, request: Request, reader: asyncio.StreamReader) -> bool:
        """Run the handler and send its answer; False when the connection must close after it."""
        try:
            response = await self._handler(request)
        except BadRequest as err:  # a designed text (the body ended early, a handler's refusal)
            await self._send_plain(send, problem(400, "Bad Request", err.reason), close=True)
            return False
        except Exception:
            log.exception("%s: %s %s failed", self._name, peer_text(request.method), peer_text(request.path))
            response = problem(500, "Internal Server Error", "the request could not be served; see the agent's log")
        head_only = request.method == "HEAD"
        if isinstance(response, Response):
            await self._send_plain(send, response, head_only=head_only)
            return True
        return await self._send_stream(send, response, reader, head_only)

    async def _send_plain(self, send, response: Response, *, close: bool = False, head_only: bool = False) -> None:
        headers = [("Content-Type", response.content_type), *response.headers.items(),
                   ("Content-Length", str(len(response.body)))]
        if close:
            headers.append(("Connection", "close"))
        events: list = [h11.Response(status_code=response.status, headers=headers)]
        if response.body and not head_only:
            events.append(h11.Data(data=response.body))
        events.append(h11.EndOfMessage())
        await send(*events)

    async def _send_stream(self, send, response: StreamResponse, reader: asyncio.StreamReader, head_only: bool) -> bool:
        headers = [("Content-Type", response.content_type), *response.headers.items(), ("Connection", "close")]
        await send(h11.Response(status_code=response.status, headers=headers))
        chunks = response.chunks
        if head_only:
            await chunks.aclose()  # type: ignore[attr-defined]
            await send(h11.EndOfMessage())
            return False

        async def caller_gone() -> None:  # any bytes or EOF from the caller: a streamed answer is not pipelined
            await reader.read(1)

        gone = asyncio.get_running_loop().create_task(caller_gone(), name=f"{self._name}-stream-caller")
        try:
            while True:
                following = asyncio.ensure_future(anext(chunks))
                done, _ = await asyncio.wait({following, gone}, return_when=asyncio.FIRST_COMPLETED)
                if following not in done:
                    following.cancel()
                    await asyncio.gather(following, return_exceptions=True)
                    return False
                try:
                    chunk = following.result()
                except StopAsyncIteration:
                    break
                await send(h11.Data(data=chunk))
            await send(h11.EndOfMessage())
            return False
        finally:
            gone.cancel()
            aclose = getattr(chunks, "aclose", None)
            if aclose is not None:
                try:
                    await aclose()
                except RuntimeError:  # still running (cancelled above): it ends with its task
                    pass


#: Prometheus' text exposition format (version 0.0.4)
METRICS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class MetricsEndpoint:
    """``GET /metrics`` of a Prometheus registry on its own small server (a role's --metrics-listen).

    A subclass sets ``self.registry`` (a prometheus_client ``CollectorRegistry``) and passes its
    server's name; :meth:`serve` listens, :meth:`close` stops. Anything but ``GET``/``HEAD
    /metrics`` is a problem answer (404, 405)."""

    def __init__(self, name: str) -> None:
        self._server_name = name
        self._server: HttpServer | None = None
        self.registry: Any = None

    def exposition(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)

    async def _handle(self, request: Request) -> Response:
        if request.path != "/metrics":
            return problem(404, "Not Found", "only /metrics is served here")
        if request.method not in ("GET", "HEAD"):
            return problem(405, "Method Not Allowed", "GET /metrics", headers={"Allow": "GET, HEAD"})
        return Response(200, self.exposition(), content_type=METRICS_CONTENT_TYPE)

    async def serve(self, host: str, port: int) -> None:
        """Listen on ``host:port`` (EngineError naming the address when it cannot)."""
        from anex_agent.errors import EngineError

        self._server = HttpServer(self._handle, name=self._server_name)
        try:
            await self._server.listen(host, port)
        except OSError as err:
            self._server = None
            raise EngineError(f"cannot serve metrics on {host}:{port} (--metrics-listen): "
                              f"{err.strerror or err}") from None

    async def close(self) -> None:
        if self._server is not None:
            await self._server.close()
            self._server = None
