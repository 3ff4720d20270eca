"""``GW_TUNNEL_<port>`` forwards: ``127.0.0.1:<listen_port>`` -> ``target`` over the mesh.

Who may connect: only processes on this machine (the listeners bind the loopback
address; there is no authentication, as with the upstream wireproxy tunnels).

Use it from the agent::

    async with ForwardManager(dialer) as forwards:
        await forwards.apply(config.tunnels)      # again on every pushed config
        ...

or standalone (benchmarks, tests)::

    async with ForwardManager(OSDialer()) as fm:
        await fm.apply([TunnelSpec(listen_port=8080, target="10.96.0.10:80")])
        await asyncio.Event().wait()

Each accepted connection dials ``target`` through the :class:`~anex_agent.net.dialer.Dialer`
and relays bytes both ways (:func:`anex_agent.frontends.relay.relay`: half-close
propagated, ``os.splice`` when both ends are kernel sockets). When the dial fails the
client connection is closed at once (a TCP forward cannot say why; the log does).

Each port relays at most ``max_connections`` connections at once
(``ANEX_FORWARD_MAX_CONNECTIONS``, default :data:`DEFAULT_MAX_CONNECTIONS`): one more is
closed as soon as it is accepted, counted in :attr:`ForwardManager.refused` (the agent's
``anex_agent_forward_refused_connections_total``), and logged at most once per
:data:`REFUSAL_LOG_INTERVAL` seconds per port.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import itertools
import logging
import socket
from collections.abc import Iterable
from dataclasses import dataclass, field

from anex_agent import parse
from anex_agent.net.dialer import Dialer, SocketConnection
from anex_agent.errors import AnexError, DialError, PortInUseError
from anex_agent.frontends.relay import relay, tune_socket
from anex_agent.wire.nodes import TunnelSpec

log = logging.getLogger(__name__)

LISTEN_BACKLOG = 128
DEFAULT_MAX_CONNECTIONS = 1024  # per forward port
REFUSAL_LOG_INTERVAL = 60.0  # seconds between two "refused" log lines of one port


def bind_listener(host: str, port: int) -> socket.socket:
    """A non-blocking listening TCP socket; raises OSError (EADDRINUSE...) as the kernel says."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # SO_REUSEADDR lets us rebind while old connections sit in TIME_WAIT; it does
        # not let two listeners share a port on Linux (that is SO_REUSEPORT).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(LISTEN_BACKLOG)
        sock.setblocking(False)
    except BaseException:
        sock.close()
        raise
    return sock


@dataclass
class _Listener:
    port: int
    target: str
    sock: socket.socket
    accept_task: asyncio.Task | None = None
    conn_tasks: set[asyncio.Task] = field(default_factory=set)
    refused_since_log: int = 0
    last_refusal_log: float | None = None


class ForwardManager:
    """Owns the forward listeners; :meth:`apply` makes them match a list of TunnelSpec.

    Must be used as an async context manager (it owns a TaskGroup: one named accept
    task per port, one named task per relayed connection). Leaving the context closes
    every listener and connection. ``max_connections`` caps the connections relayed at
    once per port; :attr:`refused` counts, per port, those closed because of it.
    """

    def __init__(self, dialer: Dialer, *, listen_host: str = "127.0.0.1",
                 max_connections: int = DEFAULT_MAX_CONNECTIONS) -> None:
        if max_connections < 1:
            raise ValueError("max_connections must be at least 1")
        self.dialer = dialer
        self.listen_host = listen_host
        self.max_connections = max_connections
        #: listen port -> connections closed at once because the port had max_connections open
        self.refused: dict[int, int] = {}
        self._listeners: dict[int, _Listener] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._ids = itertools.count(1)
        self._apply_lock = asyncio.Lock()  # concurrent apply() calls run one after the other

    async def __aenter__(self) -> ForwardManager:
        self._tg = asyncio.TaskGroup()
        await self._tg.__aenter__()
        return self

    async def __aexit__(self, *exc_info) -> None:
        for port in list(self._listeners):
            await self._remove(port)
        tg, self._tg = self._tg, None
        assert tg is not None
        await tg.__aexit__(*exc_info)

    @property
    def active(self) -> dict[int, str]:
        """listen port -> target of every listener now open."""
        return {port: lst.target for port, lst in sorted(self._listeners.items())}

    @property
    def open_connections(self) -> dict[int, int]:
        """listen port -> connections being relayed now."""
        return {port: len(lst.conn_tasks) for port, lst in sorted(self._listeners.items())}

    async def apply(self, specs: Iterable[TunnelSpec]) -> None:
        """Open, retarget and close listeners so that exactly ``specs`` are served.

        Idempotent: the same specs twice change nothing (open connections are kept).
        A changed target applies to new connections; connections of a removed port are
        closed. Ports that cannot be bound are skipped, the rest is applied, and then
        :class:`PortInUseError` (a ConfigError) names every port that failed.
        """
        if self._tg is None:
            raise AnexError("ForwardManager.apply() called outside 'async with ForwardManager(...)'")
        async with self._apply_lock:
            await self._apply(list(specs))

    async def _apply(self, specs: list[TunnelSpec]) -> None:
        assert self._tg is not None
        desired: dict[int, str] = {}
        for spec in specs:
            desired[spec.listen_port] = spec.target
        for port in [p for p in self._listeners if p not in desired]:
            await self._remove(port)
            log.info("forward 127.0.0.1:%d removed", port)
        failed: dict[int, str] = {}
        for port, target in desired.items():
            current = self._listeners.get(port)
            if current is not None:
                if current.target != target:
                    log.info("forward %s:%d now goes to %s (was %s)", self.listen_host, port, target, current.target)
                    current.target = target
                continue
            try:
                sock = bind_listener(self.listen_host, port)
            except OSError as exc:
                failed[port] = _bind_reason(exc)
                continue
            lst = _Listener(port=port, target=target, sock=sock)
            lst.accept_task = self._tg.create_task(self._accept_loop(lst), name=f"forward-accept-{port}")
            self._listeners[port] = lst
            log.info("forward %s:%d -> %s (local processes only)", self.listen_host, port, target)
        if failed:
            names = ", ".join(f"GW_TUNNEL_{p}" for p in failed)
            details = "; ".join(f"{self.listen_host}:{p}: {why}" for p, why in failed.items())
            raise PortInUseError(
                names, sorted(failed), f"cannot listen: {details}. Choose a free port for the tunnel (1-65535)."
            )

    async def _remove(self, port: int) -> None:
        """Stop accepting on ``port`` and close its connections; returns once the port is free."""
        lst = self._listeners.pop(port)
        tasks = [t for t in [lst.accept_task, *lst.conn_tasks] if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            # the tasks close their sockets themselves (after unregistering them from the loop)
            await asyncio.wait(tasks)
        lst.sock.close()

    async def _accept_loop(self, lst: _Listener) -> None:
        loop = asyncio.get_running_loop()
        assert self._tg is not None
        try:
            while True:
                try:
                    client, _ = await loop.sock_accept(lst.sock)
                except OSError as exc:
                    # out of descriptors or memory: keep the listener, retry later
                    why = errno.errorcode.get(exc.errno or 0, "error")
                    log.warning("forward %d: accept failed (%s); retrying in 1 s", lst.port, why)
                    await asyncio.sleep(1)
                    continue
                if len(lst.conn_tasks) >= self.max_connections:
                    self._refuse(lst, client, loop.time())
                    continue
                self._spawn(lst, client)
        finally:
            lst.sock.close()

    def _refuse(self, lst: _Listener, client: socket.socket, now: float) -> None:
        """Close a connection past the cap at once; count it; one log line per interval per port."""
        client.close()
        self.refused[lst.port] = self.refused.get(lst.port, 0) + 1
        lst.refused_since_log += 1
        if lst.last_refusal_log is None or now - lst.last_refusal_log >= REFUSAL_LOG_INTERVAL:
            log.warning(
                "forward %s:%d: %d connection(s) refused, %d already open (the limit, "
                "ANEX_FORWARD_MAX_CONNECTIONS)", self.listen_host, lst.port, lst.refused_since_log,
                self.max_connections)
            lst.refused_since_log = 0
            lst.last_refusal_log = now

    def _spawn(self, lst: _Listener, client: socket.socket) -> None:
        assert self._tg is not None
        tune_socket(client)
        task = self._tg.create_task(self._serve(lst, client), name=f"forward-{lst.port}-conn-{next(self._ids)}")
        lst.conn_tasks.add(task)
        task.add_done_callback(lst.conn_tasks.discard)

    async def _serve(self, lst: _Listener, client_sock: socket.socket) -> None:
        client = SocketConnection(client_sock)
        target = lst.target
        upstream = None
        try:
            host, port = parse.host_port(target)  # the wire model already validated it
            try:
                upstream = await self.dialer.open_connection(host, port)
            except DialError as err:
                log.warning("forward %d -> %s: %s", lst.port, target, err.reason)
                return
            stats = await relay(client, upstream)
            log.debug("forward %d -> %s closed: %d bytes out, %d back", lst.port, target, stats.a_to_b, stats.b_to_a)
        except Exception:  # one connection must never take the manager down
            log.exception("forward %d -> %s: connection failed", lst.port, target)
        finally:
            if upstream is not None:
                await upstream.aclose()
            await client.aclose()


def _bind_reason(exc: OSError) -> str:
    if exc.errno == errno.EADDRINUSE:
        return "port already in use by another process"
    if exc.errno == errno.EACCES:
        return "permission denied (ports below 1024 need privileges)"
    if exc.errno == errno.EADDRNOTAVAIL:
        return "address not available on this machine"
    return f"bind failed ({errno.errorcode.get(exc.errno or 0, 'error')})"


@contextlib.asynccontextmanager
async def running_forwards(dialer: Dialer, specs: Iterable[TunnelSpec], *, listen_host: str = "127.0.0.1",
                           max_connections: int = DEFAULT_MAX_CONNECTIONS):
    """Start forwards for ``specs`` in-process; yields the :class:`ForwardManager`.

    For benchmarks and standalone use: ``async with running_forwards(OSDialer(), specs): ...``.
    """
    async with ForwardManager(dialer, listen_host=listen_host, max_connections=max_connections) as manager:
        await manager.apply(specs)
        yield manager
