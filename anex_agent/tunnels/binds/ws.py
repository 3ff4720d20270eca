"""WireGuard over the gateways' WebSocket relays, for every kind of engine: relay clients
(:class:`~anex_agent.tunnels.binds.relay_client.RelayClient`) under a Bind or a local UDP socket.

* :class:`WebSocketBind` -- a :class:`~anex_agent.tunnels.binds.base.Bind` over relay clients, one per
  gateway endpoint: the datagram transport of the built-in userspace engine, with no local
  UDP hop (``UserspaceEngine(bind_factory=...)``).
* :class:`LocalRelay` -- for the native engines (kernel, wireguard-go), which own their UDP
  socket: a UDP socket on 127.0.0.1 that the WireGuard peer's endpoint points at; what the
  engine sends there goes to the relay, what the relay sends comes back from there.

UDP and the relays side by side, switched per endpoint, is :class:`.switch.SwitchBind`.
Datagrams that cannot go (relay reconnecting, buffers full) are dropped, as UDP would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Mapping
from typing import TYPE_CHECKING, Any

from anex_agent.tunnels.binds.base import next_datagram
from anex_agent.tunnels.binds.relay_client import RelayClient, RelayTarget
from anex_agent.tunnels.binds.relay_io import UdpReader, udp_socket

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

RECEIVE_QUEUE = 4096


class WebSocketBind:
    """A Bind over relay clients, one per gateway endpoint: the userspace engine's transport, no UDP hop.

    ``targets`` maps each gateway's endpoint (as the engine's peer config names it:
    ``(ip, port)``) to its relay; datagrams to an endpoint without a relay are dropped.
    Received datagrams are reported as coming from that endpoint. Create with :meth:`open`.
    """

    local_port = 0

    def __init__(self, targets: Mapping[Hashable, RelayTarget], *, private_key: bytes, public_key: str) -> None:
        self._queue: asyncio.Queue[tuple[bytes, Hashable] | None] = asyncio.Queue(RECEIVE_QUEUE)
        self.clients: dict[Hashable, RelayClient] = {}
        self.dropped = 0
        self._closed = False
        for endpoint, target in targets.items():
            self.clients[endpoint] = RelayClient(target, private_key=private_key, public_key=public_key,
                                                 on_datagram=self._deliverer(endpoint))

    @classmethod
    def open(cls, targets: Mapping[Hashable, RelayTarget], tasks: Tasks, *, private_key: bytes,
             public_key: str) -> WebSocketBind:
        bind = cls(targets, private_key=private_key, public_key=public_key)
        for index, client in enumerate(bind.clients.values()):
            tasks.spawn(f"ws-bind-{index}", client.run)
        return bind

    def _deliverer(self, endpoint: Hashable) -> Callable[[bytes], None]:
        def deliver(data: bytes) -> None:
            try:
                self._queue.put_nowait((data, endpoint))
            except asyncio.QueueFull:
                self.dropped += 1
        return deliver

    def send(self, datagram: bytes, endpoint: Hashable) -> None:
        client = self.clients.get(endpoint)
        if client is not None and not self._closed:
            client.send(datagram)

    async def receive(self) -> tuple[bytes, Hashable]:
        return await next_datagram(self._queue, self._closed)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for client in self.clients.values():
            client.close()
        try:
            self._queue.put_nowait(None)
        except asyncio.QueueFull:
            pass


class LocalRelay:
    """A UDP socket on 127.0.0.1 in front of a :class:`RelayClient`, for engines that own their UDP socket.

    Point the WireGuard peer's endpoint at :attr:`endpoint`; the engine's datagrams go to
    the relay, and the relay's come back from this socket to the engine's port (learned from
    what the engine sent). Create with ``await LocalRelay.open(target, ...)``, run
    :meth:`run` in a task, :meth:`close` when done.
    """

    def __init__(self, target: RelayTarget, *, private_key: bytes, public_key: str) -> None:
        self.client = RelayClient(target, private_key=private_key, public_key=public_key, on_datagram=self._to_engine)
        self._reader: UdpReader | None = None
        self._engine_addr: Any = None
        self.port = 0

    @classmethod
    async def open(cls, target: RelayTarget, *, private_key: bytes, public_key: str) -> LocalRelay:
        relay = cls(target, private_key=private_key, public_key=public_key)
        sock = udp_socket(local=("127.0.0.1", 0))
        relay._reader = UdpReader(sock, relay._from_engine)
        relay.port = sock.getsockname()[1]
        return relay

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _from_engine(self, batch: list[tuple[bytes, Any]]) -> None:
        self._engine_addr = batch[-1][1]
        self.client.send_many([data for data, _ in batch])

    def _to_engine(self, data: bytes) -> None:
        if self._engine_addr is not None and self._reader is not None:
            self._reader.sendto(data, self._engine_addr)

    async def run(self) -> None:
        await self.client.run()

    def close(self) -> None:
        self.client.close()
        if self._reader is not None:
            self._reader.close()
            self._reader = None
