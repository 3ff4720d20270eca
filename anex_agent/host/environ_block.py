"""Taking secrets out of the environment the kernel shows for this process (``/proc/<pid>/environ``).

Deleting a variable from ``os.environ`` (:func:`anex_agent.host.childenv.scrub_environ`) keeps it
from everything started later, but ``/proc/<pid>/environ`` is not that: it is the memory of
the environment block the process was started with (between the ``env_start`` and
``env_end`` addresses of ``/proc/<pid>/stat``), which any process of the same user, or root
(a root workload), can read for as long as the process lives. :func:`blank_environ_values`
overwrites, in that block, the value of every variable its predicate selects with NUL bytes:
afterwards ``/proc/<pid>/environ`` shows ``ANEX_JOIN_TOKEN=`` followed by NULs.

Why in place rather than re-executing the agent with the secrets handed over in a file or a
pipe: the PID stays (PID 1 of a container, systemd's main PID and its notify socket), nothing
starts twice (the single-file build would unpack itself again), no second place ever holds
the secret, and it is the same for ``run`` and ``daemon``. Only the block the kernel reports
is written, within its bounds, and only the bytes of a selected value.

Linux only. Where ``/proc`` is not mounted or the addresses are not reported, nothing is
changed and :func:`blank_environ_values` returns ``None`` (the caller says so in its log).
What it cannot reach: a parent process that holds the same environment (the single-file
build's bootloader), and copies the caller already made (settings, ``os.environ`` until it
is scrubbed).
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

# /proc/<pid>/stat, fields counted from 1 (proc(5)): 3 is the state after "(comm)", 50/51 the environment
_STATE_FIELD, _ENV_START_FIELD, _ENV_END_FIELD = 3, 50, 51


def environ_bounds(proc: Path = Path("/proc/self")) -> tuple[int, int] | None:
    """``(env_start, env_end)`` of a process from ``proc/stat``; ``None`` where they are not reported."""
    try:
        stat = (proc / "stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # comm may hold spaces and parentheses
    try:
        start = int(fields[_ENV_START_FIELD - _STATE_FIELD])
        end = int(fields[_ENV_END_FIELD - _STATE_FIELD])
    except (IndexError, ValueError):
        return None
    return (start, end) if 0 < start < end else None


def blank_environ_values(selected: Callable[[str], bool]) -> list[str] | None:
    """Overwrite with NULs, in this process's start-up environment block, the value of every
    variable ``selected(name)`` picks. Returns the names blanked, or ``None`` when the block
    cannot be found (not Linux, no ``/proc``)."""
    bounds = environ_bounds()
    if bounds is None:
        return None
    start, end = bounds
    try:
        block = Path("/proc/self/environ").read_bytes()
    except OSError:
        return None
    blanked: list[str] = []
    offset = 0
    for entry in block.split(b"\0"):
        name, sep, value = entry.partition(b"=")
        value_at = start + offset + len(name) + 1
        if sep and value and value_at + len(value) <= end:
            text = name.decode("utf-8", "replace")
            if selected(text):
                ctypes.memset(value_at, 0, len(value))
                blanked.append(text)
        offset += len(entry) + 1
    return blanked
