"""port-forward over a SPDY session: each ``requestID``'s ``error`` + ``data`` stream pair is one TCP
connection to a port of the pod's machine.

Contract (as the kubelet's ``portforward`` handler): the client opens, per connection, an
``error`` stream and a ``data`` stream carrying the same ``port`` and ``requestID`` headers. Once a
pair is complete, :func:`forward_body` opens a TCP connection to ``127.0.0.1:<port>`` on the node
through ``dial`` (a direct-tcpip channel of one SSH connection per session, opened at the first
pair) and copies both ways: the client ending its data stream ends our side of the TCP
connection (half-close), the node's side ending ends the data stream, the node's side failing
(the SSH connection lost) resets it. A port that cannot be
reached writes ``error forwarding port N to pod NAME, uid UID: why`` on the error stream, as the
kubelet does, and ends the pair. A bad ``port`` header is such an error too. At most
:data:`MAX_PENDING` half-open pairs and :data:`MAX_CONNECTIONS` connections per session are kept;
more streams are reset.

Why SSH rather than plain TCP to the mesh address: the node's SSH server is there on every engine
(the userspace engine accepts only the ports it was told about), it reaches ports the workload
bound to loopback, and the channel is authenticated by a certificate the coordinator signs for
this node only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from anex_agent import parse
from anex_agent.errors import AnexError
from anex_agent.virtualnode.kubelet.streams.channels import DATA, ERROR, STREAM_TYPE
from anex_agent.virtualnode.kubelet.streams.session import SpdySession, SpdyStream

log = logging.getLogger(__name__)

READ_SIZE = 256 * 1024  # per read from the node's side: one SPDY write (and TLS flush) per read
#: SSH packets the node may send us on a forwarded channel (asyncssh's default is 32 KiB): a
#: packet is one decryption and one read's worth of bytes, so bigger ones mean fewer of each; at
#: 192 KiB and more the node's side cost more per MiB on this machine (asyncssh copies each packet
#: several times, and its reads of the socket are 256 KiB at most).
CHANNEL_PACKET = 128 * 1024
MAX_PENDING = 64
MAX_CONNECTIONS = 256

# dial(port) -> (reader, writer) of a TCP connection on the node; raises with a reason
Dial = Callable[[int], Awaitable[tuple[Any, Any]]]


class DialFailed(AnexError):
    """A port of the node could not be reached; ``str()`` says why."""


def parse_port(text: str) -> int:
    try:
        return parse.port(text)
    except ValueError:
        raise DialFailed(f"invalid port {text!r}: expected 1 to 65535") from None


async def _pump_to_node(stream: SpdyStream, writer: Any) -> None:
    try:
        while data := await stream.read():
            writer.write(data)
            await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
    except (ConnectionError, OSError):
        pass
    except Exception as err:  # the SSH channel is gone
        log.debug("port-forward to the node ended: %s", err)


async def _pump_to_client(reader: Any, stream: SpdyStream) -> None:
    """The node's bytes to the client; the node's EOF is the stream's FIN. A failure either way
    (the SSH connection lost, the client's stream reset) resets the stream: the client's
    connection ends at once rather than waiting on bytes that will not come, and the other
    direction's pump sees the end too."""
    try:
        while data := await reader.read(READ_SIZE):
            await stream.write(data)
        await stream.close()
        return
    except (ConnectionError, OSError) as err:
        log.debug("port-forward from the node ended: %s", err)
    except Exception as err:  # asyncssh: the connection to the node failed
        log.info("port-forward from the node failed: %s", err or type(err).__name__)
    await stream.abort()


async def forward_pair(error: SpdyStream, data: SpdyStream, dial: Dial, pod: str, uid: str) -> None:
    """One connection: dial the pair's port, copy, end both streams."""
    port_text = data.header("port")
    try:
        try:
            port = parse_port(port_text)
            reader, writer = await dial(port)
        except DialFailed as err:
            message = f"error forwarding port {port_text} to pod {pod}, uid {uid}: {err}"
            log.info("port-forward: %s", message)
            with contextlib.suppress(ConnectionResetError):
                await error.write(message.encode())
            return
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(_pump_to_node(data, writer), name=f"port-forward {port}: to the node")
                group.create_task(_pump_to_client(reader, data), name=f"port-forward {port}: to the client")
        finally:
            writer.close()
    finally:
        await error.close()
        await data.close()


async def forward_body(session: SpdySession, dial: Dial, pod: str, uid: str) -> None:
    """Pair the client's streams and forward each pair until the client closes the connection."""
    pending: dict[str, dict[str, SpdyStream]] = {}
    connections: set[asyncio.Task[None]] = set()
    async with asyncio.TaskGroup() as group:
        while (stream := await session.accept()) is not None:
            kind, request = stream.header(STREAM_TYPE), stream.header("requestid")
            if kind not in (DATA, ERROR) or not request:
                log.info("%s: a stream with type %r and requestID %r; reset", session.name, kind, request)
                await stream.abort()
                continue
            pair = pending.setdefault(request, {})
            if kind in pair or (len(pair) == 0 and len(pending) > MAX_PENDING) or len(connections) >= MAX_CONNECTIONS:
                if not pair:
                    pending.pop(request, None)
                await stream.abort()
                continue
            pair[kind] = stream
            if len(pair) == 2:
                del pending[request]
                task = group.create_task(forward_pair(pair[ERROR], pair[DATA], dial, pod, uid),
                                         name=f"{session.name}: request {request}")
                connections.add(task)
                task.add_done_callback(connections.discard)
