"""Bind: the datagram path under a WireGuard engine (seam 2; wireguard-go's ``conn.Bind``).

A Bind moves whole datagrams to and from *endpoints*. WireGuard over UDP and WireGuard
over a WebSocket relay are two Binds; the built-in userspace engine takes any of them as
its datagram transport directly (``UserspaceEngine(bind_factory=...)``)::

    class Bind(Protocol):
        def send(self, datagram: bytes, endpoint: Hashable) -> None   # fire and forget, never blocks
        async def receive(self) -> tuple[bytes, Hashable]               # next datagram and its sender
        def close(self) -> None                                         # idempotent; receive() then raises BindClosed
        local_port: int                                                 # 0 where ports make no sense

Two optional batch methods let a driver skip the per-datagram queue and task step (the UDP
Bind and the switch Bind have both; :func:`set_receiver` and :func:`send_all` fall back to
the methods above for a Bind without them)::

        def set_receiver(self, receiver: Callable[[list[tuple[bytes, Hashable]]], None] | None) -> None
            # every datagram from now on goes to receiver(batch), called in the event loop with
            # all that one wake-up read; receive() then only raises BindClosed once closed
        def send_batch(self, datagrams: list[tuple[bytes, Hashable]]) -> None   # send() of each, in order

Implementations:

* :class:`anex_agent.tunnels.binds.udp.UdpBind` -- a UDP socket; endpoints are ``(ip, port)``.
* :class:`anex_agent.tunnels.binds.ws.WebSocketBind` -- one relay connection per gateway,
  reconnecting on its own; endpoints are the gateways' UDP endpoints ``(ip, port)``, so the
  core does not know which path a datagram took.
* :class:`anex_agent.tunnels.binds.switch.SwitchBind` -- UDP and WebSocket side by side; the
  path chooser moves each endpoint between them (``use(endpoint, "websocket")``).

For the native engines (kernel, wireguard-go), which own their UDP socket, the WebSocket
path is :class:`anex_agent.tunnels.binds.ws.LocalRelay`: a UDP socket on 127.0.0.1 that the
WireGuard peer's endpoint points at.

Endpoints are opaque to the core. A datagram that cannot be sent (unreachable, buffer
full, relay reconnecting) is dropped, as UDP would; WireGuard's timers recover.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable
from typing import Protocol, runtime_checkable

from anex_agent.errors import AnexError

Receiver = Callable[[list[tuple[bytes, Hashable]]], None]


class BindClosed(AnexError):
    """receive() on a closed Bind. Internal to drivers: never escapes an engine."""


@runtime_checkable
class Bind(Protocol):
    local_port: int

    def send(self, datagram: bytes, endpoint: Hashable) -> None: ...

    async def receive(self) -> tuple[bytes, Hashable]: ...

    def close(self) -> None: ...


#: A Bind's receive queue takes a handshake message (WireGuard types 1 and 2) only while it holds
#: fewer datagrams than this; past it they are dropped at once, so the data of established
#: sessions never waits behind a flood of initiations (the core budgets those that get through:
#: anex_agent/wg/budget.py; wireguard-go gives handshakes a queue of their own).
HANDSHAKE_QUEUE_SHARE = 256


def admit(queue: asyncio.Queue[tuple[bytes, Hashable] | None], item: tuple[bytes, Hashable]) -> bool:
    """Put a received ``(datagram, endpoint)`` into a Bind's queue; False (dropped) when the queue
    is full, or holds HANDSHAKE_QUEUE_SHARE datagrams and this one is a handshake message."""
    if queue.qsize() >= HANDSHAKE_QUEUE_SHARE and item[0][:1] in (b"\x01", b"\x02"):
        return False
    try:
        queue.put_nowait(item)
    except asyncio.QueueFull:
        return False
    return True


async def next_datagram(queue: asyncio.Queue[tuple[bytes, Hashable] | None], closed: bool) -> tuple[bytes, Hashable]:
    """``receive()`` of a Bind that queues what it gets: the next ``(datagram, endpoint)``, or
    :class:`BindClosed` once the Bind is closed and the queue drained (``None`` in the queue is
    the close marker)."""
    if closed and queue.empty():
        raise BindClosed()
    item = await queue.get()
    if item is None:
        raise BindClosed()
    return item


def set_receiver(bind: Bind, receiver: Receiver | None) -> bool:
    """Have ``bind`` push its datagrams to ``receiver(batch)``; False when it cannot (read with receive())."""
    method = getattr(bind, "set_receiver", None)
    if method is None:
        return False
    method(receiver)
    return True


def send_all(bind: Bind, datagrams: list[tuple[bytes, Hashable]]) -> None:
    """Send ``datagrams`` through ``bind``: one ``send_batch`` call where it has one."""
    batch = getattr(bind, "send_batch", None)
    if batch is not None:
        batch(datagrams)
        return
    send = bind.send
    for datagram, endpoint in datagrams:
        send(datagram, endpoint)
