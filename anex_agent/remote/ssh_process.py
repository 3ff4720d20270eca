"""A session's process and its streams: the plumbing between an SSH session channel and the
command it runs (:mod:`.ssh_session` says which command, as whom).

Contract: :func:`run_pipes` and :func:`run_pty` start ``argv`` (with ``env``, ``cwd``, and ``ids``:
the ``user``/``group``/``extra_groups`` of :func:`asyncio.create_subprocess_exec`) in a session
of its own (its own process group), wire it to asyncssh's server ``process``, and return its
return code once it exited (negative: the signal that ended it); they raise OSError when it
cannot start.

* Client to command (:func:`_feed`): the data, then EOF (pipes: stdin closed); window size
  changes (PTY: ``TIOCSWINSZ``); signals, and a break as SIGINT, to the command's process group.
* Command to client: stdout and stderr over pipes; with a PTY, one terminal, the command's
  controlling terminal, with the client's window size and terminal modes (:mod:`.ssh_pty`),
  read for up to :data:`DRAIN_AFTER_EXIT` s after the command exited (its last output: a
  background child may keep the terminal open).
* The client went away: the command's process group gets SIGHUP (as with sshd); so does one
  still running when the session ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import signal
import struct
import termios

import asyncssh

log = logging.getLogger(__name__)

DRAIN_AFTER_EXIT = 0.5  # seconds the PTY is still read after the command exited (its last output)


async def run_pipes(process, argv, env, cwd, ids) -> int:
    """Run the command over pipes (stdin, stdout, stderr) until it exited; its return code."""
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True, **ids)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def write(data: bytes) -> None:
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close() -> None:
        with contextlib.suppress(Exception):
            proc.stdin.close()

    async def copy(source: asyncio.StreamReader, sink) -> None:
        while data := await source.read(65536):
            try:
                sink.write(data)
                await sink.drain()
            except (asyncssh.Error, ConnectionError, BrokenPipeError):
                return

    async with asyncio.TaskGroup() as tg:  # the helpers end with the command (cancelled, then awaited)
        helpers = (tg.create_task(_feed(process, proc, write, close, lambda size: None), name="ssh-session-stdin"),
                   tg.create_task(_hang_up_on_close(process, proc), name="ssh-session-hangup"))
        try:
            await asyncio.gather(copy(proc.stdout, process.stdout), copy(proc.stderr, process.stderr))
            return await proc.wait()
        finally:
            for task in helpers:
                task.cancel()
            await _hang_up_if_running(proc)


async def run_pty(process, argv, env, cwd, ids) -> int:
    """Run the command on a new terminal (the client's size and modes) until it exited; its return code."""
    from anex_agent.remote import ssh_pty

    master, slave = os.openpty()
    try:
        _set_size(master, process.term_size)
        if not ssh_pty.apply_modes(slave, process.term_modes):
            log.info("SSH: the terminal refused the client's terminal modes; keeping its defaults")
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True,
            preexec_fn=_make_controlling_tty, **ids)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    loop = asyncio.get_running_loop()

    async def wait_fd(add, remove) -> None:
        ready = loop.create_future()
        add(master, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            remove(master)

    async def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(master, view):]
            except BlockingIOError:
                await wait_fd(loop.add_writer, loop.remove_writer)
            except OSError:
                return

    async def pump_out() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                await wait_fd(loop.add_reader, loop.remove_reader)
                continue
            except OSError:  # EIO: every holder of the terminal closed it
                return
            if not data:
                return
            try:
                process.stdout.write(data)
                await process.stdout.drain()
            except (asyncssh.Error, ConnectionError, BrokenPipeError):
                return

    try:
        async with asyncio.TaskGroup() as tg:  # the helpers end with the command (cancelled, then awaited)
            output = tg.create_task(pump_out(), name="ssh-session-pty")
            helpers = (tg.create_task(_feed(process, proc, write, lambda: None, lambda size: _set_size(master, size)),
                                      name="ssh-session-stdin"),
                       tg.create_task(_hang_up_on_close(process, proc), name="ssh-session-hangup"), output)
            try:
                returncode = await proc.wait()
                with contextlib.suppress(TimeoutError):  # its last output; a background child may keep the terminal
                    async with asyncio.timeout(DRAIN_AFTER_EXIT):
                        await asyncio.shield(output)
                return returncode
            finally:
                for task in helpers:
                    task.cancel()
                await _hang_up_if_running(proc)
    finally:
        os.close(master)  # after the helpers, which read and write it, are done


async def _feed(process, proc: asyncio.subprocess.Process, write, close, resize) -> None:
    """Client to command: data, EOF, window size changes, signals."""
    while True:
        try:
            data = await process.stdin.read(65536)
        except asyncssh.TerminalSizeChanged as change:
            resize((change.width, change.height, change.pixwidth, change.pixheight))
            continue
        except asyncssh.SignalReceived as received:
            signum = _signal_of(received.signal)
            if signum is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)
            continue
        except asyncssh.BreakReceived:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            continue
        except (asyncssh.Error, ConnectionError, OSError):
            break
        if not data:
            break
        await write(data)
    close()


async def _hang_up_on_close(process, proc: asyncio.subprocess.Process) -> None:
    """The client went away: the command's process group gets SIGHUP (as with sshd)."""
    await process.channel.wait_closed()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGHUP)


async def _hang_up_if_running(proc: asyncio.subprocess.Process) -> None:
    """The session ends with the command still running: its process group gets SIGHUP, and it is waited for."""
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGHUP)
        await proc.wait()


def _set_size(fd: int, size) -> None:
    width, height, pixwidth, pixheight = (tuple(size) + (0, 0, 0, 0))[:4]
    if width and height:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))


def _signal_of(name: str) -> int | None:
    try:
        return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
    except KeyError:
        return None


def _make_controlling_tty() -> None:  # runs in the child, after setsid
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
