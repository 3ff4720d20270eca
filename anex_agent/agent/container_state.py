"""The workload's state as Kubernetes reports a container's (``ContainerState``).

``waiting`` (before it started), ``running`` (``started_at``), ``terminated`` (exit code,
signal, ``started_at``, ``finished_at`` and the reason: ``Completed`` for status 0,
``OOMKilled`` when the kernel's OOM killer killed a process of the workload's memory cgroup
while it ran, else ``Error``), with ``restart_count``; between two runs of a workload its
restart policy starts again, ``waiting`` ``CrashLoopBackOff`` carrying the last run's end
(exit code, signal, ``started_at``, ``finished_at``: the pod's ``lastState``).

OOM kills are read from the kernel's per-cgroup ``oom_kill N`` counter: cgroup v2's
``memory.events`` (which counts the kills in the cgroup and below it) or, on a cgroup v1
host, the memory controller's ``memory.oom_control`` (kernel 4.13 and later; it counts the
kills of the cgroup's own processes, which is where a container's workload runs). The
counter is read when the workload starts and when it ends, and a workload killed by
SIGKILL while the counter grew is ``OOMKilled``. The file comes from
:func:`oom_counter_path` (the agent's own cgroup, which in a container is the container's);
None where neither hierarchy has a memory controller with the counter: OOM kills are then
reported as ``Error`` with the signal.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from anex_agent.wire.base import SHORT_TEXT_MAX
from anex_agent.wire.heartbeat import ContainerState

CGROUP_ROOT = Path("/sys/fs/cgroup")


def oom_counter_path(proc_cgroup: str, root: Path = CGROUP_ROOT) -> Path | None:
    """The file with the ``oom_kill`` counter of the cgroup in ``proc_cgroup`` (the text of
    ``/proc/self/cgroup``): cgroup v2's ``memory.events`` where the unified hierarchy has the
    memory controller, else cgroup v1's ``memory/<path>/memory.oom_control`` when it carries the
    counter; None when there is neither."""
    v1: Path | None = None
    for line in proc_cgroup.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        relative = path.strip().lstrip("/")
        if hierarchy == "0" and controllers == "":
            events = root / relative / "memory.events"
            if events.is_file():
                return events
        elif "memory" in controllers.split(","):
            v1 = root / "memory" / relative / "memory.oom_control"
    if v1 is not None and oom_kills(v1) is not None:  # kernels before 4.13 have no counter there
        return v1
    return None


def oom_kills(path: Path | None) -> int | None:
    """The ``oom_kill`` counter of a ``memory.events`` or ``memory.oom_control`` file; None when
    unreadable or absent."""
    if path is None:
        return None
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return None


def _now() -> datetime:
    return datetime.now(UTC)


class StateTracker:
    """Follows one workload through its life (and restarts) and answers :class:`ContainerState`."""

    def __init__(self, oom_counter: Path | None = None) -> None:
        self.oom_counter = oom_counter
        self.restart_count = 0
        self._state = ContainerState(state="waiting", reason="ContainerCreating")
        self._oom_at_start: int | None = None
        self._ran = False
        #: called after every change of the state (the agent then sends a heartbeat soon)
        self.listeners: list[Callable[[], None]] = []
        self.probe_failures = 0  # probe decisions against the workload, all runs (carried in every state)
        self.probe_message = ""

    @property
    def state(self) -> ContainerState:
        return self._state

    def _set(self, value: ContainerState) -> ContainerState:
        if self.probe_failures:
            value = value.model_copy(update={"probe_failures": self.probe_failures,
                                             "probe_message": self.probe_message})
        self._state = value
        for listener in list(self.listeners):
            listener()
        return value

    def started(self, *, ready: bool | None = None, started: bool | None = None) -> None:
        """A run began; ``ready``/``started`` as its probes start it (:meth:`.probes.Prober.initial`)."""
        if self._ran:
            self.restart_count += 1
        self._ran = True
        self._oom_at_start = oom_kills(self.oom_counter)
        self._set(ContainerState(state="running", started_at=_now(), restart_count=self.restart_count,
                                 ready=ready, started=started))

    def probed(self, *, ready: bool | None = None, started: bool | None = None) -> None:
        """A probe's verdict on the running workload (None: unchanged)."""
        if self._state.state != "running":
            return
        update = {k: v for k, v in (("ready", ready), ("started", started)) if v is not None}
        if any(getattr(self._state, k) != v for k, v in update.items()):
            self._set(self._state.model_copy(update=update))

    def probe_failed(self, message: str) -> None:
        """A probe decided against the workload (``message`` says which and why): counted and carried."""
        self.probe_failures += 1
        self.probe_message = message[:SHORT_TEXT_MAX]
        self._set(self._state)

    def terminated(self, returncode: int) -> ContainerState:
        """Record the end (``returncode`` as asyncio gives it: ``-N`` for signal N)."""
        sig = -returncode if returncode < 0 else None
        code = 128 + sig if sig is not None else returncode
        oom_now = oom_kills(self.oom_counter)
        oom = (sig == signal.SIGKILL and self._oom_at_start is not None and oom_now is not None
               and oom_now > self._oom_at_start)
        reason = "OOMKilled" if oom else ("Completed" if code == 0 else "Error")
        return self._set(ContainerState(
            state="terminated", reason=reason, exit_code=code, signal=sig,
            started_at=self._state.started_at, finished_at=_now(), restart_count=self.restart_count,
        ))

    def backing_off(self) -> ContainerState:
        """The workload ended and waits to be started again: ``CrashLoopBackOff`` with the end of its last run."""
        last = self._state
        return self._set(last.model_copy(update={"state": "waiting", "reason": "CrashLoopBackOff"}))
