"""PID 1 duties of the agent: child subreaper and reaping orphaned processes.

In a container the agent is PID 1: every process whose parent exits (a workload's
daemonised helper, a shell's background job) is re-parented to it and, once it exits,
stays a zombie until the agent reaps it. Outside a PID namespace the agent asks the kernel
to be a *child subreaper* (``PR_SET_CHILD_SUBREAPER``) so orphans of its workload come to
it rather than to the host's init.

Contract:

* :func:`become_subreaper` sets ``PR_SET_CHILD_SUBREAPER``; False (logged by the caller)
  where prctl is unavailable.
* :class:`Reaper` reaps zombie children the agent did **not** start through asyncio: the
  workload and the engines are started with asyncio subprocesses, whose child watcher waits
  for each of those pids itself. A zombie child is reaped only when it is still a zombie on
  a scan at least :attr:`Reaper.settle` seconds after it was first seen (asyncio reaps its
  own children within milliseconds), so the agent never steals an exit status asyncio waits
  for. Zombies are found in ``/proc/<pid>/stat`` (state ``Z``, parent the agent).
* :meth:`Reaper.run` scans every ``interval`` seconds until cancelled (the task ``reaper``).
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import logging
import os
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Register the calling process as child subreaper; True when the kernel accepted it."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def zombie_children(parent: int, proc: str = "/proc") -> list[int]:
    """Pids of the zombie children of ``parent`` (from ``/proc/<pid>/stat``)."""
    found = []
    try:
        names = os.listdir(proc)
    except OSError:
        return found
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"{proc}/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) S ppid ...": comm may hold spaces and parentheses; split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) >= 2 and fields[0] == b"Z" and int(fields[1]) == parent:
            found.append(int(name))
    return found


class Reaper:
    """Reaps orphaned zombie children (see the module contract)."""

    def __init__(self, *, interval: float = 0.5, settle: float = 1.0,
                 clock: Callable[[], float] = time.monotonic, proc: str = "/proc") -> None:
        self.interval = interval
        self.settle = settle
        self._clock = clock
        self._proc = proc
        self._seen: dict[int, float] = {}
        self.reaped = 0

    def scan(self) -> list[int]:
        """One pass: reap the zombies that outlived ``settle``; return their pids."""
        now = self._clock()
        zombies = set(zombie_children(os.getpid(), self._proc))
        self._seen = {pid: since for pid, since in self._seen.items() if pid in zombies}
        done = []
        for pid in zombies:
            since = self._seen.setdefault(pid, now)
            if now - since < self.settle:
                continue
            try:
                got, status = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                got = 0
            if got == pid:
                done.append(pid)
                log.debug("reaped orphaned process %d (status %d)", pid, os.waitstatus_to_exitcode(status))
            self._seen.pop(pid, None)
        self.reaped += len(done)
        return done

    async def run(self) -> None:
        while True:
            self.scan()
            await asyncio.sleep(self.interval)
