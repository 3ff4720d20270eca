"""Inbound forwards for the built-in engine: ``<mesh address>:<port>`` -> ``127.0.0.1:<port>``.

The kernel and wireguard-go engines put the mesh address on an interface, so the
workload's own listeners are reachable from the mesh. The built-in engine has no
interface: its user-space stack listens on the workload's ports (``ANEX_INBOUND_PORTS``)
and relays each accepted connection to the same port on loopback. The workload sees
connections from 127.0.0.1; that is why the agent API and the proxy are never
inbound ports (the settings refuse them: a mesh caller would look local).

:meth:`InboundServer.run` is a task of the engine's role; it owns one TaskGroup with
one named task per connection. :meth:`InboundServer.sync` makes the listened ports match.
"""

from __future__ import annotations

import asyncio
import itertools
import logging

from anex_agent.dialer import OSDialer
from anex_agent.errors import DialError
from anex_agent.frontends.relay import relay
from anex_agent.netstack.aio import NetstackRuntime, TcpStream

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Connections waiting for the server task before new ones are reset (a burst of SYNs).
QUEUE = 1024


class InboundServer:
    def __init__(self, *, target_host: str = LOOPBACK, connect_timeout: float = 5.0) -> None:
        self.target_host = target_host
        self._dialer = OSDialer(connect_timeout=connect_timeout)
        self._queue: asyncio.Queue[tuple[int, TcpStream] | None] = asyncio.Queue(QUEUE)
        self._runtime: NetstackRuntime | None = None
        self._ports: set[int] = set()
        self._ids = itertools.count(1)
        self.served = 0
        self.failed = 0

    def sync(self, runtime: NetstackRuntime, ports: tuple[int, ...]) -> None:
        """Listen on exactly ``ports`` of ``runtime`` (a new runtime: listen there from scratch)."""
        if runtime is not self._runtime:
            self._runtime, self._ports = runtime, set()
        for port in self._ports - set(ports):
            runtime.unlisten(port)
            self._ports.discard(port)
        for port in set(ports) - self._ports:
            runtime.listen(port, lambda stream, port=port: self._accepted(port, stream))
            self._ports.add(port)
            log.info("inbound: mesh port %d -> %s:%d", port, self.target_host, port)

    def _accepted(self, port: int, stream: TcpStream) -> None:
        try:
            self._queue.put_nowait((port, stream))
        except asyncio.QueueFull:
            stream.abort()

    def stop(self) -> None:
        with_runtime = self._runtime
        if with_runtime is not None:
            for port in self._ports:
                with_runtime.unlisten(port)
        self._ports = set()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                port, stream = item
                tg.create_task(self._serve(port, stream), name=f"inbound-{port}-conn-{next(self._ids)}")

    async def _serve(self, port: int, stream: TcpStream) -> None:
        upstream = None
        try:
            try:
                upstream = await self._dialer.open_connection(self.target_host, port)
            except DialError as err:
                self.failed += 1
                log.info("inbound %d: %s", port, err.reason)
                stream.abort()  # nothing listens: the caller sees a reset, as from a closed port
                return
            self.served += 1
            await relay(stream, upstream)
        except Exception:  # one connection must never take the server down
            log.exception("inbound %d: connection failed", port)
        finally:
            if upstream is not None:
                await upstream.aclose()
            await stream.aclose()
