"""Inbound forwards for the built-in engine: ``<mesh address>:<port>`` -> ``127.0.0.1:<port>``.

The kernel and wireguard-go engines put the mesh address on an interface, so the
workload's own listeners are reachable from the mesh. The built-in engine has no
interface: its user-space stack listens on the workload's ports (``ANEX_INBOUND_PORTS``)
and relays each accepted connection to the same port on loopback. The workload sees
connections from 127.0.0.1; that is why the agent API and the proxy are never
inbound ports (the settings refuse them: a mesh caller would look local). The agent
API's mesh side is served differently (:meth:`InboundServer.serve_protocol`): its
asyncio protocol runs right on the stack's connection, and sees the mesh peer's address.
UDP ports (``PORT/udp``) are relayed by :class:`anex_agent.frontends.inbound_udp.UdpInboundPort`,
one session (a kernel socket) per mesh peer, all ports sharing one :class:`SessionBudget`.

:meth:`InboundServer.run` is a task of the engine's role; it owns one TaskGroup with
one named task per connection (UDP needs none: callbacks move the datagrams).
:meth:`InboundServer.sync` makes the listened ports match.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Callable

from anex_agent.net.dialer import OSDialer
from anex_agent.errors import DialError
from anex_agent.frontends.inbound_udp import SessionBudget, UdpInboundPort
from anex_agent.frontends.relay import relay
from anex_agent.netstack.aio import NetstackRuntime, StreamTransport, TcpStream
from anex_agent.netstack.stack import StackError

log = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
#: Connections waiting for the server task before new ones are reset (a burst of SYNs).
QUEUE = 1024


class InboundServer:
    def __init__(self, *, target_host: str = LOOPBACK, connect_timeout: float = 5.0) -> None:
        self.target_host = target_host
        self._dialer = OSDialer(connect_timeout=connect_timeout)
        self._queue: asyncio.Queue[tuple[int, TcpStream, Callable[[], asyncio.Protocol] | None] | None] = asyncio.Queue(QUEUE)
        self._runtime: NetstackRuntime | None = None
        self._ports: set[int] = set()
        self._protocols: dict[int, Callable[[], asyncio.Protocol]] = {}
        self._ids = itertools.count(1)
        self._udp: dict[int, UdpInboundPort] = {}
        self._udp_budget = SessionBudget()
        self.served = 0
        self.failed = 0

    def serve_protocol(self, port: int, factory: Callable[[], asyncio.Protocol]) -> None:
        """Serve ``port`` of the mesh address with ``factory()``'s protocol per connection (on the next sync)."""
        self._protocols[port] = factory
        if self._runtime is not None and port not in self._runtime.listening:
            self._runtime.listen(port, lambda stream: self._accepted(port, stream, factory))

    def sync(self, runtime: NetstackRuntime, ports: tuple[int, ...], udp_ports: tuple[int, ...] = ()) -> None:
        """Listen on exactly ``ports`` (TCP) and ``udp_ports`` (relayed to loopback) and the protocol
        ports of ``runtime`` (a new runtime: listen there from scratch). A UDP port the stack holds
        already (an ephemeral port of the agent's own) is left out with a warning, and tried again
        at the next sync."""
        if runtime is not self._runtime:
            self._runtime, self._ports = runtime, set()
            self._close_udp()
            for port, factory in self._protocols.items():
                runtime.listen(port, lambda stream, port=port, factory=factory: self._accepted(port, stream, factory))
        for port in self._ports - set(ports):
            runtime.unlisten(port)
            self._ports.discard(port)
        for port in set(ports) - self._ports:
            runtime.listen(port, lambda stream, port=port: self._accepted(port, stream))
            self._ports.add(port)
            log.info("inbound: mesh port %d -> %s:%d", port, self.target_host, port)
        for port in set(self._udp) - set(udp_ports):
            self._udp.pop(port).close()
        for port in sorted(set(udp_ports) - set(self._udp)):
            try:
                self._udp[port] = UdpInboundPort(runtime, port, target_host=self.target_host, budget=self._udp_budget)
            except StackError as err:
                log.warning("inbound %d/udp: not served for now: %s", port, err)
                continue
            log.info("inbound: mesh port %d/udp -> %s:%d", port, self.target_host, port)

    def report(self) -> dict:
        """Counters of the UDP ports (sessions, drops), by port."""
        return {f"{port}/udp": udp.report() for port, udp in sorted(self._udp.items())}

    def _close_udp(self) -> None:
        for udp in self._udp.values():
            udp.close()
        self._udp = {}

    def _accepted(self, port: int, stream: TcpStream, factory: Callable[[], asyncio.Protocol] | None = None) -> None:
        try:
            self._queue.put_nowait((port, stream, factory))
        except asyncio.QueueFull:
            stream.abort()

    def stop(self) -> None:
        with_runtime = self._runtime
        if with_runtime is not None:
            for port in self._ports | set(self._protocols):
                with_runtime.unlisten(port)
        self._ports = set()
        self._close_udp()

    async def run(self) -> None:
        async with asyncio.TaskGroup() as tg:
            while True:
                item = await self._queue.get()
                if item is None:
                    return
                port, stream, factory = item
                if factory is not None:
                    tg.create_task(self._serve_protocol(stream, factory), name=f"mesh-{port}-conn-{next(self._ids)}")
                else:
                    tg.create_task(self._serve(port, stream), name=f"inbound-{port}-conn-{next(self._ids)}")

    async def _serve_protocol(self, stream: TcpStream, factory: Callable[[], asyncio.Protocol]) -> None:
        peer, local = stream.peername, stream.sockname
        try:
            await StreamTransport(stream, factory(), peer, local).pump()
        except Exception:  # one connection must never take the server down
            log.exception("mesh port %d: connection failed", local[1])

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
