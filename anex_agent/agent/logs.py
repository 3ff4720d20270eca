"""The workload's output: passed through unchanged, and kept with timestamps for the cluster.

Contract:

* :func:`pump` reads one of the workload's pipes, writes every chunk at once and unchanged
  to the agent's own file descriptor (1 or 2: what the container runtime shows), and hands
  the text, cut into lines, to :meth:`LogStore.append`. A line longer than
  :data:`MAX_LINE` bytes is kept in pieces (``partial``), as the container runtimes do.
* :class:`LogStore` keeps the newest lines in a ring bounded in bytes (``ring_bytes``,
  default 4 MiB) and appends each line to ``<state dir>/logs/workload.log`` in the CRI log
  format (``<RFC 3339 time> <stream> <F|P> <text>``); the file is rotated at ``file_bytes``
  (default 16 MiB) to ``workload.log.1`` (one old file kept). A file that cannot be written
  is logged once and left; the ring goes on.
* :meth:`LogStore.query` answers ``tail``/``since``/``stream`` from the ring;
  :meth:`LogStore.follow` then yields new lines as they come until the store is closed
  (the workload ended). A follower that falls :data:`FOLLOW_QUEUE` lines behind is ended
  (its last line says so) rather than let memory grow.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from anex_agent.host.private_file import open_private_append

log = logging.getLogger(__name__)

MAX_LINE = 16 * 1024
FOLLOW_QUEUE = 4096
STREAMS = ("stdout", "stderr")


@dataclass(frozen=True)
class LogLine:
    seq: int
    time: datetime
    stream: str  # stdout | stderr
    text: bytes  # without the newline
    partial: bool = False

    def cri(self) -> bytes:
        stamp = self.time.isoformat(timespec="microseconds").replace("+00:00", "Z")
        return b"%s %s %s %s\n" % (stamp.encode(), self.stream.encode(), b"P" if self.partial else b"F", self.text)


class LogStore:
    def __init__(self, directory: Path | None, *, ring_bytes: int = 4 << 20, file_bytes: int = 16 << 20,
                 clock: Callable[[], datetime] = lambda: datetime.now(UTC)) -> None:
        self.directory = directory
        self.ring_bytes = ring_bytes
        self.file_bytes = file_bytes
        self._clock = clock
        self._ring: collections.deque[LogLine] = collections.deque()
        self._size = 0
        self._seq = 0
        self._followers: set[asyncio.Queue] = set()
        self._file = None
        self._file_size = 0
        self._file_failed = False
        self.closed = False

    # ---------------------------------------------------------------- writing

    def append(self, stream: str, text: bytes, *, partial: bool = False) -> LogLine:
        self._seq += 1
        line = LogLine(self._seq, self._clock(), stream, text, partial)
        self._ring.append(line)
        self._size += len(text) + 64
        while self._size > self.ring_bytes and len(self._ring) > 1:
            self._size -= len(self._ring.popleft().text) + 64
        self._write_file(line)
        for queue in list(self._followers):
            if queue.qsize() >= FOLLOW_QUEUE - 1:
                queue.put_nowait(None)  # too slow: end this follower
                self._followers.discard(queue)
            else:
                queue.put_nowait(line)
        return line

    def _write_file(self, line: LogLine) -> None:
        if self.directory is None or self._file_failed:
            return
        data = line.cri()
        try:
            if self._file is None:
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                path = self.directory / "workload.log"
                self._file = open_private_append(path)  # kept open; closed in close()
                self._file_size = self._file.tell()
            if self._file_size + len(data) > self.file_bytes and self._file_size > 0:
                self._file.close()
                os.replace(self.directory / "workload.log", self.directory / "workload.log.1")
                self._file = open_private_append(self.directory / "workload.log")
                self._file_size = 0
            self._file.write(data)
            self._file_size += len(data)
        except OSError as err:
            self._file_failed = True
            log.warning("workload log file in %s cannot be written (%s); the output is kept in memory only",
                        self.directory, err.strerror or err)

    def close(self) -> None:
        """The workload ended: followers get the end of the stream."""
        self.closed = True
        for queue in self._followers:
            queue.put_nowait(None)
        self._followers.clear()
        if self._file is not None:
            self._file.close()
            self._file = None

    # ---------------------------------------------------------------- reading

    def query(self, *, tail: int | None = None, since: datetime | None = None,
              stream: str | None = None) -> list[LogLine]:
        lines = [line for line in self._ring
                 if (stream is None or line.stream == stream) and (since is None or line.time >= since)]
        return lines[-tail:] if tail is not None and tail > 0 else ([] if tail == 0 else lines)

    async def follow(self, *, tail: int | None = None, since: datetime | None = None,
                     stream: str | None = None) -> AsyncIterator[LogLine | None]:
        """The lines of :meth:`query`, then new ones until the store closes. ``None`` once at the
        end when this follower was too slow and was dropped."""
        queue: asyncio.Queue = asyncio.Queue()
        if not self.closed:
            self._followers.add(queue)
        try:
            last = 0
            for line in self.query(tail=tail, since=since, stream=stream):
                last = line.seq
                yield line
            if self.closed and not queue.qsize():
                return
            while True:
                line = await queue.get()
                if line is None:
                    if not self.closed:
                        yield None
                    return
                if line.seq > last and (stream is None or line.stream == stream):
                    yield line
        finally:
            self._followers.discard(queue)


async def pump(reader: asyncio.StreamReader, stream: str, fd: int, store: LogStore) -> None:
    """Copy one workload pipe to ``fd`` unchanged and into ``store`` line by line, until EOF."""
    pending = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        _write_all(fd, chunk)
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            _store(store, stream, line)
        while len(pending) > MAX_LINE:
            store.append(stream, pending[:MAX_LINE], partial=True)
            pending = pending[MAX_LINE:]
    if pending:
        store.append(stream, pending)


def _store(store: LogStore, stream: str, line: bytes) -> None:
    while len(line) > MAX_LINE:
        store.append(stream, line[:MAX_LINE], partial=True)
        line = line[MAX_LINE:]
    store.append(stream, line)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view):]
        except BlockingIOError:
            import select

            select.select([], [fd], [], 1.0)
        except OSError:  # our stdout is gone (closed terminal): keep the logs anyway
            return
