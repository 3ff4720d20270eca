"""The workload lives no longer than its agent, wherever the agent runs.

Two halves:

* :func:`die_with_parent` is the workload child's last step before exec: it asks the kernel
  for SIGKILL when its parent dies (``prctl(PR_SET_PDEATHSIG)``), so a ``kill -9`` of the
  agent (not PID 1: there the kernel kills the whole PID namespace anyway) ends the
  workload too. The signal follows the death of the parent *thread* that forked the child:
  the workload is forked by the agent's event-loop thread (the main thread, ``asyncio.run``),
  which lives exactly as long as the agent. It runs after the child switched to the
  ``--user`` account (the kernel clears the setting on a credential change) and re-checks
  the parent, which may have died between fork and prctl. A workload that execs a
  set-user-ID program loses it (the kernel clears it there too): the record below is the
  second line of defence.
* :class:`WorkloadRecord`: the running workload's pid and start time (``/proc/<pid>/stat``
  field 22, clock ticks since boot) in the state dir (``workload.json``, 0600). A restarted
  agent, before it starts a new workload, stops a previous run's that still runs with that
  very pid and start time (a reused pid is someone else's and is left alone): SIGTERM to its
  process group, SIGKILL to it after the grace period. The record is removed once the
  workload ended.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import json
import logging
import os
import signal
from pathlib import Path

from anex_agent.host.private_file import write_private

log = logging.getLogger(__name__)

PR_SET_PDEATHSIG = 1  # prctl(2)
RECORD_FILE = "workload.json"
_START_TIME_FIELD = 22  # proc(5): starttime, in clock ticks after boot
_STATE_FIELD = 3


def _libc_prctl():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # looked up before any fork: the child only calls it


def die_with_parent(parent: int):
    """A ``preexec_fn`` for the workload: SIGKILL when ``parent`` (the agent) dies; exits at
    once when the agent is already gone. ``None`` where prctl is not available."""
    prctl = _PRCTL
    if prctl is None:
        return None
    kill = int(signal.SIGKILL)

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, kill, 0, 0, 0)
        if os.getppid() != parent:  # the agent died before the request took effect
            os._exit(128 + kill)

    return preexec


def _stat_fields(pid: int) -> list[str] | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2:].split()  # from field 3 on; comm may hold spaces


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); ``None`` when it does not run (or is a zombie)."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X"):
        return None
    return int(fields[_START_TIME_FIELD - _STATE_FIELD])


class WorkloadRecord:
    """``workload.json`` in the state dir: which process is this agent's workload."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def save(self, pid: int) -> None:
        write_private(self.path, json.dumps({"pid": pid, "start_time": start_time(pid)}) + "\n")

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def still_running(self) -> int | None:
        """The recorded pid when that very process (same start time) still runs, else ``None``."""
        try:
            record = json.loads(self.path.read_text())
            pid, started = int(record["pid"]), record["start_time"]
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError):
            log.warning("ignoring %s: not a workload record this agent wrote", self.path)
            return None
        if pid <= 1 or pid == os.getpid() or started is None or start_time(pid) != started:
            return None
        return pid

    async def stop_previous(self, grace: float) -> int | None:
        """Stop a previous run's workload that still runs (see the module); its pid, or ``None``."""
        pid = self.still_running()
        if pid is None:
            self.clear()
            return None
        log.warning("the workload a previous run of the agent started still runs (pid %d): stopping it "
                    "(SIGTERM, SIGKILL after %g s) before starting a new one", pid, grace)
        _signal_group(pid, signal.SIGTERM)
        if not await _gone(pid, grace):
            _signal_group(pid, signal.SIGKILL)
            await _gone(pid, 10.0)
        self.clear()
        return pid


def _signal_group(pid: int, signum: int) -> None:
    """``signum`` to the process group ``pid`` leads (the workload runs in one of its own), else to ``pid``."""
    try:
        if os.getpgid(pid) == pid:
            os.killpg(pid, signum)
        else:
            os.kill(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass


async def _gone(pid: int, timeout: float) -> bool:
    """Whether ``pid`` ended within ``timeout`` s (a pidfd where the kernel has them, else polling)."""
    started = start_time(pid)
    if started is None:
        return True
    loop = asyncio.get_running_loop()
    try:
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):
        fd = None
    if fd is not None:
        ended = asyncio.Event()
        loop.add_reader(fd, ended.set)  # readable once the process exited
        try:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout):
                    await ended.wait()
        finally:
            loop.remove_reader(fd)
            os.close(fd)
        return start_time(pid) != started
    deadline = loop.time() + timeout
    while start_time(pid) == started:
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(0.1)
    return True
