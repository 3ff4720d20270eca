"""Memory cgroups with a limit, as a container runtime's ``--memory`` makes them, for the tests
and the demo's simulated machines: what a real OOM kill needs.

Contract: :func:`memory_controller` says where a writable memory controller with an OOM-kill
counter is (``("v2", /sys/fs/cgroup)`` with the memory controller on the unified hierarchy,
else ``("v1", /sys/fs/cgroup/memory)`` on a kernel whose ``memory.oom_control`` counts
``oom_kill``), or None. :func:`make_group` makes a group there with ``limit`` bytes and no swap
beyond it and returns it: ``path``, ``counter`` (the file with its ``oom_kill`` counter, the one
the agent finds from ``/proc/self/cgroup``) and :meth:`MemoryGroup.enter_argv`, an argv prefix that
moves the command into the group before it runs (root only: the cgroup files are root's).
``ip netns exec`` mounts a fresh sysfs without the cgroup hierarchies: inside it,
:meth:`MemoryGroup.mount_argv` mounts the memory hierarchy back where a container has it, so
that the agent finds its counter as it would in one. :meth:`MemoryGroup.remove` removes the
group once its processes are gone.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path

from anex_agent.agent.container_state import oom_kills

ROOT = Path("/sys/fs/cgroup")


def memory_controller(root: Path = ROOT) -> tuple[str, Path] | None:
    """Where a group with a memory limit can be made here, and which cgroup version it is."""
    try:
        if "memory" in (root / "cgroup.controllers").read_text().split() and os.access(root, os.W_OK):
            return "v2", root
    except OSError:
        pass
    v1 = root / "memory"
    if os.access(v1, os.W_OK) and oom_kills(v1 / "memory.oom_control") is not None:
        return "v1", v1
    return None


@dataclass(frozen=True)
class MemoryGroup:
    path: Path
    counter: Path
    version: str  # "v1" or "v2"

    def enter_argv(self) -> list[str]:
        """A prefix for an argv: a shell that writes its own PID to the group, then execs the rest."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.path)]

    def mount_argv(self) -> list[str]:
        """A prefix for an argv run under ``ip netns exec`` (its own mount namespace and sysfs): the
        group's hierarchy mounted at ``/sys/fs/cgroup`` (v2) or ``/sys/fs/cgroup/memory`` (v1)."""
        if self.version == "v2":
            mount = "mount -t cgroup2 cgroup2 /sys/fs/cgroup"
        else:
            mount = ("mount -t tmpfs cgroups /sys/fs/cgroup && mkdir /sys/fs/cgroup/memory && "
                     "mount -t cgroup -o memory memory /sys/fs/cgroup/memory")
        return ["sh", "-c", f'{mount} && exec "$@"', "mount-cgroup"]

    def remove(self) -> None:
        try:
            self.path.rmdir()
        except FileNotFoundError:
            pass


def make_group(limit: int, prefix: str = "anex-test") -> MemoryGroup:
    """A new memory group of ``limit`` bytes (no swap beyond it); RuntimeError where there is no
    writable memory controller."""
    found = memory_controller()
    if found is None:
        raise RuntimeError("no writable memory controller with an OOM-kill counter here")
    version, root = found
    path = root / f"{prefix}-{uuid.uuid4().hex[:8]}"
    path.mkdir()
    if version == "v2":
        (path / "memory.max").write_text(f"{limit}\n")
        swap, counter = (path / "memory.swap.max", "0\n"), path / "memory.events"
    else:
        (path / "memory.limit_in_bytes").write_text(f"{limit}\n")
        swap, counter = (path / "memory.memsw.limit_in_bytes", f"{limit}\n"), path / "memory.oom_control"
    try:
        swap[0].write_text(swap[1])
    except OSError:  # no swap accounting on this kernel: nothing to limit
        pass
    return MemoryGroup(path, counter, version)
