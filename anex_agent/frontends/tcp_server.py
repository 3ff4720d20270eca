"""The listening half the proxies share: bind, accept, one named task per client connection.

:class:`TcpServer` is an async context manager: entering binds (``PortInUseError`` naming the
setting, :attr:`TcpServer.listen_source`) and starts accepting in a task of its own TaskGroup;
leaving cancels every task and closes the listener. A subclass says what one connection is
(:meth:`TcpServer.serve_client`); an exception there is logged and ends that connection only.

At most ``max_connections`` clients are served at once (the agent's ``ANEX_PROXY_MAX_CONNECTIONS``,
default :data:`DEFAULT_MAX_CONNECTIONS`, per listener): one more is closed as soon as it is
accepted, counted in :attr:`TcpServer.refused`, and logged at most once per
:data:`REFUSAL_LOG_INTERVAL` with the number refused since the last line, so a stranger holding
connections open through the handshake timeout cannot exhaust the agent's descriptors.
"""

from __future__ import annotations

import asyncio
import errno
import itertools
import logging
import socket
from typing import ClassVar

from anex_agent.net.dialer import Connection, SocketConnection
from anex_agent.errors import PortInUseError
from anex_agent.frontends.forward import bind_listener
from anex_agent.frontends.relay import tune_socket

log = logging.getLogger(__name__)

DEFAULT_MAX_CONNECTIONS = 1024  # clients served at once per listener
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two "refused" log lines of one listener


class TcpServer:
    """Accepts TCP connections on ``host:port`` and serves each in a named task.

    Subclasses set :attr:`listen_source` (the setting named when the port is taken),
    :attr:`task_prefix` (tasks are ``<prefix>-accept-<port>`` and ``<prefix>-client-<n>``) and
    :attr:`what` (for logs), and implement :meth:`serve_client`; :meth:`started` runs once bound.
    """

    listen_source: ClassVar[str]
    task_prefix: ClassVar[str]
    what: ClassVar[str]

    def __init__(self, host: str, port: int, max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.host = host
        self.port = port
        self.max_connections = max_connections
        #: connections closed at once because ``max_connections`` clients were being served
        self.refused = 0
        self._refused_since_log = 0
        self._last_refusal_log: float | None = None
        self._sock: socket.socket | None = None
        self._tg: asyncio.TaskGroup | None = None
        self._accept_task: asyncio.Task | None = None
        self._sessions: set[asyncio.Task] = set()
        self._ids = itertools.count(1)
        self._closed = asyncio.Event()

    @property
    def address(self) -> tuple[str, int]:
        """The bound (host, port); the real port when 0 was asked."""
        assert self._sock is not None, "not started"
        return self._sock.getsockname()[:2]

    async def __aenter__(self):
        try:
            self._sock = bind_listener(self.host, self.port)
        except OSError as exc:
            reason = "already in use by another process" if exc.errno == errno.EADDRINUSE else (
                errno.errorcode.get(exc.errno or 0, "bind failed")
            )
            raise PortInUseError(
                self.listen_source, [self.port], f"cannot listen on {self.host}:{self.port}: {reason}"
            ) from None
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        self._accept_task = self._tg.create_task(self._accept_loop(), name=f"{self.task_prefix}-accept-{self.address[1]}")
        self.started()
        return self

    async def __aexit__(self, *exc_info) -> None:
        for task in [t for t in [self._accept_task, *self._sessions] if t is not None]:
            task.cancel()
        tg, self._tg = self._tg, None
        assert tg is not None
        await tg.__aexit__(*exc_info)
        if self._sock is not None:
            self._sock.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()

    def started(self) -> None:
        """Called once the listener is bound and accepting (a log line, a warning)."""

    async def serve_client(self, conn: Connection, client_ip: str) -> None:
        """Serve one accepted connection from ``client_ip``; it is closed afterwards."""
        raise NotImplementedError

    async def _accept_loop(self) -> None:
        loop = asyncio.get_running_loop()
        assert self._sock is not None and self._tg is not None
        while True:
            try:
                sock, _ = await loop.sock_accept(self._sock)
            except OSError as exc:
                log.warning("%s: accept failed (%s); retrying in 1 s", self.what,
                            errno.errorcode.get(exc.errno or 0, "error"))
                await asyncio.sleep(1)
                continue
            if len(self._sessions) >= self.max_connections:
                self._refuse(sock, loop.time())
                continue
            tune_socket(sock)
            task = self._tg.create_task(self._serve(sock), name=f"{self.task_prefix}-client-{next(self._ids)}")
            self._sessions.add(task)
            task.add_done_callback(self._sessions.discard)

    def _refuse(self, sock: socket.socket, now: float) -> None:
        """Close a connection past the cap at once; count it; one log line per interval."""
        sock.close()
        self.refused += 1
        self._refused_since_log += 1
        if self._last_refusal_log is None or now - self._last_refusal_log >= REFUSAL_LOG_INTERVAL:
            log.warning("%s %s:%d: %d connection(s) refused, %d already open (the limit, ANEX_PROXY_MAX_CONNECTIONS)",
                        self.what, self.host, self.port, self._refused_since_log, self.max_connections)
            self._refused_since_log = 0
            self._last_refusal_log = now

    async def _serve(self, sock: socket.socket) -> None:
        try:
            client_ip = sock.getpeername()[0]
        except OSError:
            sock.close()
            return
        conn = SocketConnection(sock)
        try:
            await self.serve_client(conn, client_ip)
        except Exception:  # one client must never take the server down
            log.exception("%s: client connection failed", self.what)
        finally:
            await conn.aclose()
