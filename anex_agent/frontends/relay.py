"""Bidirectional byte relay between two :class:`anex_agent.net.dialer.Connection` objects.

Used by the ``GW_TUNNEL_<port>`` forwards and by the proxy's ``CONNECT`` tunnels.

* Each direction copies until EOF, then propagates the half-close with
  ``shutdown_write()`` on the other side (RFC 9293 §3.6: a FIN closes one direction
  only); the relay returns when both directions have finished or one side failed.
* Fast path (Linux): when both ends expose a kernel ``socket``, bytes move with
  ``os.splice`` through a pipe (socket -> pipe -> socket) and never enter Python
  memory. The pipe is grown to :data:`PIPE_SIZE`. Readiness comes from the event
  loop (``add_reader``/``add_writer``), so no thread is needed.
* Otherwise (a user-space engine's stream) each direction copies with ``recv_into`` and
  ``sendall``, with buffers sized to the flow: it waits for data with only a small
  :data:`IDLE_BUFFER` of its own, and while reads fill that buffer it borrows a
  :data:`COPY_BUFFER` from a pool shared by every relay, handing it back after the first
  read that does not fill it (the source is drained). An idle direction so holds
  :data:`IDLE_BUFFER` bytes, an idle connection twice that; the pool keeps at most
  :data:`POOL_SPARE` spare buffers, so bulk flows reuse them without allocating.
  (A burst that ends exactly on a :data:`COPY_BUFFER` boundary keeps its borrowed buffer
  until the next bytes or EOF arrive.)
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import socket
from dataclasses import dataclass

from anex_agent.net.dialer import Connection

log = logging.getLogger(__name__)

COPY_BUFFER = 256 * 1024  # bytes per read on the generic path while data flows
IDLE_BUFFER = 2 * 1024  # bytes a direction of the generic path holds while it waits for data
POOL_SPARE = 8  # spare COPY_BUFFERs kept for reuse (the rest is freed)
PIPE_SIZE = 1024 * 1024  # default /proc/sys/fs/pipe-max-size; larger needs CAP_SYS_RESOURCE
SPLICE_CHUNK = PIPE_SIZE
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # fcntl(2), Linux 2.6.35+
HAVE_SPLICE = hasattr(os, "splice")


@dataclass
class RelayStats:
    """Bytes moved: ``a_to_b`` from the first connection to the second, ``b_to_a`` back."""

    a_to_b: int = 0
    b_to_a: int = 0


async def relay(a: Connection, b: Connection, *, a_to_b_prefix: bytes = b"", use_splice: bool = True) -> RelayStats:
    """Copy ``a`` <-> ``b`` until both directions reached EOF or one side failed.

    ``a_to_b_prefix`` is sent to ``b`` before anything read from ``a`` (bytes the caller
    already read, e.g. what followed a CONNECT request). Does not close ``a`` or ``b``;
    the caller does. Connection errors (reset, broken pipe) end the relay quietly:
    a TCP forward has nobody to report them to but the log.
    """
    stats = RelayStats()
    if a_to_b_prefix:
        await b.sendall(a_to_b_prefix)
        stats.a_to_b += len(a_to_b_prefix)
    fast = use_splice and HAVE_SPLICE and a.socket is not None and b.socket is not None
    if fast:
        one_way = _splice_one_way
    else:
        one_way = _copy_one_way

    async def a_to_b() -> None:
        stats.a_to_b += await one_way(a, b)

    async def b_to_a() -> None:
        stats.b_to_a += await one_way(b, a)

    try:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(a_to_b(), name="relay-a-to-b")
            tg.create_task(b_to_a(), name="relay-b-to-a")
    except* (ConnectionError, OSError) as group:
        log.debug("relay ended by a connection error: %r", group.exceptions[0])
    return stats


class _BufferPool:
    """Spare :data:`COPY_BUFFER` bytearrays; ``take`` one (new if none is spare), ``give`` it back."""

    def __init__(self, size: int, spare: int) -> None:
        self.size, self.spare = size, spare
        self._free: list[bytearray] = []
        self.lent = 0  # buffers taken and not given back yet

    def take(self) -> bytearray:
        self.lent += 1
        return self._free.pop() if self._free else bytearray(self.size)

    def give(self, buf: bytearray) -> None:
        self.lent -= 1
        if len(self._free) < self.spare:
            self._free.append(buf)


_pool = _BufferPool(COPY_BUFFER, POOL_SPARE)


async def _copy_one_way(src: Connection, dst: Connection) -> int:
    small = memoryview(bytearray(IDLE_BUFFER))
    total = 0
    while True:
        n = await src.recv_into(small)  # the wait for data holds only the small buffer
        if n == 0:
            break
        await dst.sendall(small[:n])
        total += n
        if n < IDLE_BUFFER:
            continue
        # reads fill the small buffer: the flow is busy, copy in large chunks while it stays so
        moved, eof = await _copy_busy(src, dst)
        total += moved
        if eof:
            break
    await dst.shutdown_write()
    return total


async def _copy_busy(src: Connection, dst: Connection) -> tuple[int, bool]:
    """Copy with a borrowed :data:`COPY_BUFFER` until a read does not fill it; (bytes, EOF seen)."""
    buf = _pool.take()
    total = 0
    try:
        with memoryview(buf) as view:
            while True:
                n = await src.recv_into(view)
                if n == 0:
                    return total, True
                await dst.sendall(view[:n])
                total += n
                if n < COPY_BUFFER:
                    return total, False
    finally:
        _pool.give(buf)


async def _wait_fd(loop: asyncio.AbstractEventLoop, fd: int, *, write: bool) -> None:
    fut = loop.create_future()

    def ready() -> None:
        if not fut.done():
            fut.set_result(None)

    if write:
        loop.add_writer(fd, ready)
    else:
        loop.add_reader(fd, ready)
    try:
        await fut
    finally:
        if write:
            loop.remove_writer(fd)
        else:
            loop.remove_reader(fd)


def _make_pipe() -> tuple[int, int]:
    r, w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    with contextlib.suppress(OSError):  # keep the default 64 KiB pipe when not allowed
        fcntl.fcntl(w, _F_SETPIPE_SZ, PIPE_SIZE)
    return r, w


async def _splice_one_way(src: Connection, dst: Connection) -> int:
    """socket -> pipe -> socket with non-blocking ``os.splice``; returns bytes moved."""
    assert src.socket is not None and dst.socket is not None
    loop = asyncio.get_running_loop()
    src_fd, dst_fd = src.socket.fileno(), dst.socket.fileno()
    flags = os.SPLICE_F_MOVE | os.SPLICE_F_NONBLOCK
    pipe_r, pipe_w = _make_pipe()
    total = 0
    try:
        while True:
            try:
                n = os.splice(src_fd, pipe_w, SPLICE_CHUNK, flags=flags)
            except BlockingIOError:
                await _wait_fd(loop, src_fd, write=False)
                continue
            if n == 0:
                break
            pending = n
            while pending:
                try:
                    pending -= os.splice(pipe_r, dst_fd, pending, flags=flags)
                except BlockingIOError:
                    await _wait_fd(loop, dst_fd, write=True)
            total += n
    finally:
        os.close(pipe_r)
        os.close(pipe_w)
    await dst.shutdown_write()
    return total


def tune_socket(sock: socket.socket) -> None:
    """Options for bulk relaying: no Nagle delay on the relayed stream."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
