"""UDP and the WebSocket relays side by side under one Bind, switched per endpoint: :class:`SwitchBind`.

The datagram transport the agent gives an engine that takes a Bind (the built-in userspace
engine): every endpoint goes over UDP (:class:`~anex_agent.tunnels.binds.udp.UdpBind`) until the
path chooser (:mod:`anex_agent.agent.path`) moves it to a relay
(:class:`~anex_agent.tunnels.binds.relay_client.RelayClient`) and back. The WireGuard core sees
the same peer endpoint on both paths.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any

from anex_agent.tunnels.binds.base import BindClosed, admit, next_datagram
from anex_agent.tunnels.binds.relay_client import RelayClient, RelayTarget
from anex_agent.tunnels.binds.ws import RECEIVE_QUEUE

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)


class SwitchBind:
    """UDP and the WebSocket relays side by side: the datagram transport of an engine that takes a
    Bind (the userspace engine), with no local UDP hop on either path.

    Every endpoint goes over UDP until :meth:`use_websocket` moves it to a relay (and
    :meth:`use_udp` back); what arrives from a relay is reported as coming from that endpoint,
    so the WireGuard core sees the same peer endpoint on both paths. Create with
    ``await SwitchBind.open(port, host, tasks, ...)``; its tasks end with :meth:`close`.
    With a receiver set (:meth:`set_receiver`) the UDP side's batches go straight to it and each
    relay datagram as a batch of one: no queue between the socket and the driver.
    """

    def __init__(self, udp: Any, tasks: Tasks, *, private_key: bytes, public_key: str) -> None:
        self.udp = udp
        self.tasks = tasks
        self._private, self._public = private_key, public_key
        self.clients: dict[Hashable, RelayClient] = {}
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self._receiver: Callable[[list[tuple[bytes, Hashable]]], None] | None = None
        self._closed = False
        self.dropped = 0

    @classmethod
    async def open(cls, port: int | None, host: str, tasks: Tasks, *, private_key: bytes, public_key: str) -> SwitchBind:
        from anex_agent.tunnels.binds.udp import UdpBind

        bind = cls(await UdpBind.open(port or 0, host), tasks, private_key=private_key, public_key=public_key)
        tasks.spawn("switch-bind-udp", bind._pump_udp)
        return bind

    @property
    def local_port(self) -> int:
        return self.udp.local_port

    async def _pump_udp(self) -> None:
        try:
            while True:
                self._put(await self.udp.receive())
        except BindClosed:
            return

    def _put(self, item: tuple[bytes, Hashable]) -> None:
        receiver = self._receiver
        if receiver is not None:
            try:
                receiver([item])
            except Exception:  # the driver's bug must not end the relay connection
                log.exception("switch bind: the receiver failed")
            return
        if not admit(self._queue, item):
            self.dropped += 1

    def set_receiver(self, receiver: Callable[[list[tuple[bytes, Hashable]]], None] | None) -> None:
        """Every datagram, from either path, to ``receiver(batch)`` from now on (None: queue them again)."""
        self._receiver = receiver
        set_udp = getattr(self.udp, "set_receiver", None)
        if set_udp is not None:
            set_udp(receiver)

    def use_websocket(self, endpoint: Hashable, target: RelayTarget) -> None:
        """Send to (and hear) ``endpoint`` through the relay ``target`` from now on."""
        current = self.clients.get(endpoint)
        if current is not None and current.target == target:
            return
        if current is not None:
            current.close()
        client = RelayClient(target, private_key=self._private, public_key=self._public,
                             on_datagram=lambda data, ep=endpoint: self._put((data, ep)))
        self.clients[endpoint] = client
        self.tasks.spawn(f"switch-bind-ws-{len(self.clients)}", client.run)

    def use_udp(self, endpoint: Hashable) -> None:
        client = self.clients.pop(endpoint, None)
        if client is not None:
            client.close()

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        if self._closed:
            return
        client = self.clients.get(endpoint)
        if client is not None:
            client.send(datagram)
        else:
            self.udp.send(datagram, endpoint)

    def send_batch(self, datagrams: list[tuple[bytes, Hashable]]) -> None:
        """:meth:`send` of each, in order; the UDP ones in one ``send_batch`` when no relay is in use."""
        if self._closed:
            return
        if not self.clients and hasattr(self.udp, "send_batch"):
            self.udp.send_batch(datagrams)
            return
        for datagram, endpoint in datagrams:
            self.send(datagram, endpoint)

    async def receive(self) -> tuple[bytes, Hashable]:
        return await next_datagram(self._queue, self._closed)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self.clients.values():
            client.close()
        self.clients.clear()
        self.udp.close()
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            pass

    def report(self) -> dict[str, Any]:
        return {f"{ep[0]}:{ep[1]}" if isinstance(ep, tuple) else str(ep): c.report() for ep, c in self.clients.items()}
