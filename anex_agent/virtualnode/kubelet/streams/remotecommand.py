"""exec and attach over a SPDY or WebSocket session: the client's streams bridged to the node.

Contract:

* :func:`exec_body` runs ``options.command`` on the node through ``open_process`` (an SSH
  session: ``create_process`` of an asyncssh connection, argv joined as the node's shell reads
  it). stdin is copied to the command and closed when the client closes it (no stdin asked
  for: closed at once); stdout and stderr are copied back, each stream ended when the command's
  ends; with a TTY the command gets a PTY of the size in the client's first resize message
  (waited for up to :data:`FIRST_SIZE_WAIT` s), resized as later messages say. When the
  command is done the error stream carries the kubelet's ``metav1.Status`` (Success, or Failure
  ``NonZeroExitCode`` with the exit code; 128+N for a signal N, as a container runtime reports)
  and every stream is ended. A command that could not start, or a node that went away, is a
  Failure status with a message naming the node.
* :func:`attach_body` copies the workload's output as it is written (the node's logs followed
  through the coordinator, nothing of the past) until the workload ends or the client goes
  away. The workload's stdin is not reachable: the agent does not pipe it (the handler refuses
  ``stdin`` before upgrading).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shlex
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from anex_agent.errors import AnexError, CoordinatorError, RemoteProtocolError
from anex_agent.remote.ssh_client import exit_code
import anex_agent.virtualnode.kubelet.streams.channels as channels
from anex_agent.virtualnode.kubelet.streams.channels import ERROR, RESIZE, STDERR, STDIN, STDOUT, ExecOptions
from anex_agent.virtualnode.kubelet.streams.session import SpdyStream

log = logging.getLogger(__name__)

READ_SIZE = 64 * 1024
DEFAULT_SIZE = (80, 24)  # the PTY's size when the client sends none
FIRST_SIZE_WAIT = 5.0  # seconds a TTY command waits for the client's first size before it starts
TERM = "xterm"

OpenProcess = Callable[[str, "str | None", "tuple[int, int] | None"], Awaitable[Any]]


class NodeFailure(AnexError):
    """The command could not run on the node; ``str()`` is what the client is told."""


async def _copy_out(source: Any, stream: SpdyStream) -> None:
    try:
        while data := await source.read(READ_SIZE):
            await stream.write(data)
        await stream.close()
    except ConnectionResetError:
        pass


async def _copy_in(stream: SpdyStream | None, process: Any) -> None:
    try:
        if stream is not None:
            while data := await stream.read():
                process.stdin.write(data)
                await process.stdin.drain()
        process.stdin.write_eof()
    except (ConnectionError, OSError, BrokenPipeError):
        pass
    except Exception as err:  # asyncssh's channel errors once the command is gone
        log.debug("stdin copy ended: %s", err)


async def _first_size(stream: SpdyStream, decoder: channels.ResizeDecoder) -> tuple[int, int]:
    """The size in the client's first resize message (kubectl sends it as soon as its streams are
    up), so the command starts on a terminal of the right size; DEFAULT_SIZE if none comes soon."""
    try:
        async with asyncio.timeout(FIRST_SIZE_WAIT):
            while data := await stream.read():
                sizes = decoder.feed(data)
                if sizes:
                    return sizes[-1]
    except (TimeoutError, RemoteProtocolError):
        pass
    return DEFAULT_SIZE


async def _resizes(stream: SpdyStream, process: Any, decoder: channels.ResizeDecoder) -> None:
    try:
        while data := await stream.read():
            for width, height in decoder.feed(data):
                process.change_terminal_size(width, height)
    except RemoteProtocolError as err:
        log.info("resize stream: %s; ignoring it", err)
    except Exception as err:  # the channel is gone: resizing is moot
        log.debug("resize ended: %s", err)


async def _finish(streams: dict[str, SpdyStream], status: bytes) -> None:
    error = streams[ERROR]
    with contextlib.suppress(ConnectionResetError):
        await error.write(status)
    for stream in streams.values():
        await stream.close()


async def exec_body(streams: dict[str, SpdyStream], options: ExecOptions, open_process: OpenProcess,
                    where: str) -> None:
    """See the module docstring; ``where`` names the node in messages."""
    command = shlex.join(options.command)
    term = TERM if options.tty else None
    decoder = channels.ResizeDecoder()
    size = None
    if options.tty:
        size = await _first_size(streams[RESIZE], decoder) if RESIZE in streams else DEFAULT_SIZE
    try:
        process = await open_process(command, term, size)
    except NodeFailure as err:
        await _finish(streams, channels.status_json(None, message=str(err), reason="InternalError"))
        return
    try:
        async with asyncio.TaskGroup() as group:
            stdin = group.create_task(_copy_in(streams.get(STDIN), process), name="exec: stdin")
            if STDOUT in streams:
                group.create_task(_copy_out(process.stdout, streams[STDOUT]), name="exec: stdout")
            if STDERR in streams:
                group.create_task(_copy_out(process.stderr, streams[STDERR]), name="exec: stderr")
            resize = None
            if RESIZE in streams:
                resize = group.create_task(_resizes(streams[RESIZE], process, decoder), name="exec: resize")
            result = await process.wait(check=False)
            stdin.cancel()  # the command is done: what the client still types goes nowhere
            if resize is not None:
                resize.cancel()
        if result.exit_status is None and not result.exit_signal:
            status = channels.status_json(None, message=f"the connection to {where} ended before the command did",
                                          reason="InternalError")
        else:
            status = channels.status_json(exit_code(result.exit_status, result.exit_signal), command=options.command)
        await _finish(streams, status)
    finally:
        process.close()


async def attach_body(streams: dict[str, SpdyStream], options: ExecOptions,
                      follow: Callable[[str | None], AsyncIterator[bytes]], where: str) -> None:
    """See the module docstring; ``follow(stream)`` yields the workload's new output
    (``stream`` stdout, stderr or None for both)."""

    async def copy(kind: str | None, stream: SpdyStream) -> None:
        try:
            async for chunk in follow(kind):
                await stream.write(chunk)
        except ConnectionResetError:
            return
        await stream.close()

    async def drain(stream: SpdyStream) -> None:
        while await stream.read():
            pass

    try:
        async with asyncio.TaskGroup() as group:
            copies = []
            if STDOUT in streams:
                kind = None if options.tty else STDOUT
                copies.append(group.create_task(copy(kind, streams[STDOUT]), name="attach: stdout"))
            if STDERR in streams:
                copies.append(group.create_task(copy(STDERR, streams[STDERR]), name="attach: stderr"))
            resize = group.create_task(drain(streams[RESIZE]), name="attach: resize") if RESIZE in streams else None
            await asyncio.wait(copies)
            if resize is not None:
                resize.cancel()
    except* CoordinatorError as group_error:
        failure = group_error.exceptions[0]
    else:
        failure = None
    if failure is not None:
        status = channels.status_json(None, message=f"the output of {where} cannot be read now: {failure}",
                                      reason="InternalError")
    else:
        status = channels.status_json(0)
    await _finish(streams, status)
