"""Running one upgraded streaming request: the SPDY session and the work behind it, bounded.

Contract: :func:`run_bridged` reads the session (SPDY, :class:`~.session.SpdySession`, or
WebSocket, :class:`~.websocket.WsSession`: a :class:`Session`) and runs ``body`` together, as named tasks of
one TaskGroup. Whichever ends first ends the other: ``body`` returning closes the session
(GOAWAY, then the connection); the client going away (EOF, a broken protocol) or no traffic
either way for ``idle_timeout`` seconds cancels ``body``, whose ``finally`` closes what it
opened on the node (an SSH channel closed is a hang-up there: the command gets SIGHUP). An
exception ``body`` raises is logged and ends that request only.

:func:`collect_streams` waits for the streams a client opens for a request (by ``streamtype``),
each one once, within ``timeout`` seconds (the kubelet's stream creation timeout); a stream of
another type is reset.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Protocol

from anex_agent.errors import AnexError
from anex_agent.virtualnode.kubelet.streams.channels import STREAM_TYPE
from anex_agent.virtualnode.kubelet.streams.session import SpdySession, SpdyStream

log = logging.getLogger(__name__)


class Session(Protocol):
    name: str
    closed: asyncio.Event
    last_activity: float  # loop time of the last traffic either way

    async def run(self) -> None: ...

    async def close(self) -> None: ...


class StreamsMissing(AnexError):
    """The client did not open the streams the request needs in time (or went away first)."""


async def collect_streams(session: SpdySession, wanted: set[str], timeout: float) -> dict[str, SpdyStream]:
    streams: dict[str, SpdyStream] = {}
    try:
        async with asyncio.timeout(timeout):
            while set(streams) != wanted:
                stream = await session.accept()
                if stream is None:
                    raise StreamsMissing("the client closed the connection before opening its streams")
                kind = stream.header(STREAM_TYPE)
                if kind not in wanted or kind in streams:
                    log.info("%s: unexpected stream type %r; reset", session.name, kind)
                    await stream.abort()
                    continue
                streams[kind] = stream
    except TimeoutError:
        missing = ", ".join(sorted(wanted - set(streams)))
        raise StreamsMissing(f"timed out waiting for the client's streams ({missing})") from None
    return streams


async def _idle(session: Session, idle_timeout: float) -> None:
    loop = asyncio.get_running_loop()
    while True:
        remaining = session.last_activity + idle_timeout - loop.time()
        if remaining <= 0:
            log.info("%s: no traffic for %.0f s; closing", session.name, idle_timeout)
            return
        await asyncio.sleep(remaining)


async def _guarded(session: Session, body: Callable[[], Awaitable[None]]) -> None:
    try:
        await body()
    except Exception:  # a bug in a bridge ends its request only, logged; the client sees the stream end
        log.exception("%s: the bridge failed", session.name)


async def run_bridged(session: Session, body: Callable[[], Awaitable[None]], *, idle_timeout: float) -> None:
    """See the module docstring."""
    async with asyncio.TaskGroup() as group:
        reader = group.create_task(session.run(), name=f"{session.name}: read")
        work = group.create_task(_guarded(session, body), name=f"{session.name}: bridge")
        idle = group.create_task(_idle(session, idle_timeout), name=f"{session.name}: idle timeout")
        closed = group.create_task(session.closed.wait(), name=f"{session.name}: closed")
        try:
            await asyncio.wait({work, closed, idle}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (work, idle, closed):
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await work  # its finally closes the node side before the session goes
            await session.close()
            reader.cancel()
