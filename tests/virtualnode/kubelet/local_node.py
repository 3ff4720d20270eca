"""A stand-in for a node's SSH connection that runs commands and dials ports on this machine.

What the streams code calls on an asyncssh client connection, with the same shapes:
``create_process(command, term_type=, term_size=, encoding=None)`` (the command run by ``sh -c``;
with a terminal type, on a real PTY whose size follows ``change_terminal_size``),
``open_connection(host, port, **options)`` (the options kept in ``channel_options``), ``close()``.
``closed`` is set when the bridge closes it; ``processes`` are what ran (``started`` is set at
the first; ``hung_up``: closed before the command ended; ``resized`` set at each size change)."""

from __future__ import annotations

import asyncio
import fcntl
import os
import pty
import struct
import termios
from types import SimpleNamespace


class _Stdin:
    def __init__(self, write, close):
        self._write, self._close = write, close

    def write(self, data):
        self._write(data)

    async def drain(self):
        pass

    def write_eof(self):
        self._close()


class _FdReader:
    def __init__(self, fd):
        self.fd = fd
        self.queue: asyncio.Queue[bytes] = asyncio.Queue()
        loop = asyncio.get_running_loop()
        loop.add_reader(fd, self._ready)
        self._loop = loop

    def _ready(self):
        try:
            data = os.read(self.fd, 65536)
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self.fd)
        self.queue.put_nowait(data)

    async def read(self, size):
        return await self.queue.get() or b""


class LocalProcess:
    def __init__(self):
        self.sizes: list[tuple[int, int]] = []
        self.resized = asyncio.Event()
        self.hung_up = False

    @classmethod
    async def start(cls, command, term_type, term_size):
        self = cls()
        self.command = command
        if term_type:
            master, slave = pty.openpty()
            self._set(slave, term_size or (80, 24))
            self.proc = await asyncio.create_subprocess_exec(
                "sh", "-c", command, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0))
            os.close(slave)
            self.master = master
            out = _FdReader(master)
            self.stdout, self.stderr = out, None
            self.stdin = _Stdin(lambda data: os.write(master, data), lambda: os.write(master, b"\x04"))
        else:
            self.master = None
            self.proc = await asyncio.create_subprocess_exec(
                "sh", "-c", command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, start_new_session=True)
            self.stdout, self.stderr = self.proc.stdout, self.proc.stderr
            self.stdin = _Stdin(self.proc.stdin.write, self.proc.stdin.close)
        return self

    @staticmethod
    def _set(fd, size):
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))

    def change_terminal_size(self, width, height):
        self.sizes.append((width, height))
        self.resized.set()
        self._set(self.master, (width, height))

    async def wait(self, check=False):
        code = await self.proc.wait()
        if code < 0:
            import signal
            return SimpleNamespace(exit_status=None, exit_signal=(signal.Signals(-code).name[3:], False, "", ""))
        return SimpleNamespace(exit_status=code, exit_signal=None)

    def close(self):
        if self.proc.returncode is None:
            self.hung_up = True
            os.killpg(self.proc.pid, 1)  # SIGHUP, as the node's SSH server does on a closed channel


class LocalNode:
    def __init__(self):
        self.processes: list[LocalProcess] = []
        self.started = asyncio.Event()
        self.connects: list[str] = []
        self.features: list[list[str]] = []  # the certificate features each connection asked for
        self.channel_options: list[dict] = []  # the options of each open_connection (max_pktsize, ...)
        self.closed = asyncio.Event()
        self.refuse: str | None = None

    async def connect(self, target, requested_for, features):
        from anex_agent.virtualnode.kubelet.streams.node_ssh import NodeUnreachable

        self.connects.append(requested_for)
        self.features.append(features)
        if self.refuse:
            raise NodeUnreachable(self.refuse)
        return self

    async def create_process(self, command, *, term_type=None, term_size=None, encoding=None):
        process = await LocalProcess.start(command, term_type, term_size)
        self.processes.append(process)
        self.started.set()
        return process

    async def open_connection(self, host, port, **options):
        self.channel_options.append(options)
        return await asyncio.open_connection(host, port)

    def close(self):
        self.closed.set()
