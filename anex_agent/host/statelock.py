"""One instance per state directory: an exclusive lock taken before anything else.

Every role (``anex-agent run``/``daemon``, ``gateway``, ``coordinator``) calls
:func:`acquire` first thing in its CLI entry, right after its settings are parsed and
before it registers, touches an interface, a firewall rule, a socket or a file of its
state. A second instance on the same state directory gets :class:`StateDirInUse` (a
:class:`~anex_agent.errors.ConfigError`: the CLI prints it and exits with status 2) and
has changed nothing. A state directory this process may not create or write (an unprivileged
user and a root-owned default) is a :class:`~anex_agent.errors.ConfigError` too, naming the
path and what to do (:func:`unusable`).

The lock is ``flock(LOCK_EX | LOCK_NB)`` on :data:`LOCK_NAME` inside the state directory
(created 0700 if missing). The kernel releases it when the holder's last descriptor
closes, so a crashed (even SIGKILLed) instance never blocks a restart; the descriptor is
close-on-exec, so a child (the workload, wireguard-go) never keeps it alive. The file holds
the holder's PID and role, only to name them in the refusal: the lock, not the file's
presence, is what counts, and the file is never removed (removing it would let two
instances lock two different files).
"""

from __future__ import annotations

import errno
import fcntl
import os
from dataclasses import dataclass
from pathlib import Path

from anex_agent.errors import ConfigError

#: The lock file inside the state directory.
LOCK_NAME = "instance.lock"


class StateDirInUse(ConfigError):
    """Another live process holds the state directory's lock."""

    def __init__(self, state_dir: Path, holder: str) -> None:
        self.state_dir = state_dir
        self.holder = holder
        super().__init__("state dir", f"{state_dir} is in use by {holder}; stop it first "
                                      "(one instance per state directory)")


@dataclass(eq=False)
class StateLock:
    """A held lock; held while referenced: :meth:`release`, dropping it, or process exit gives it back."""

    state_dir: Path
    fd: int | None

    def release(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def __del__(self) -> None:
        self.release()


def acquire(state_dir: Path | str, role: str) -> StateLock:
    """Take the state directory's lock for ``role`` or raise :class:`StateDirInUse`; never blocks."""
    state_dir = Path(state_dir)
    path = state_dir / LOCK_NAME
    try:
        state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as err:
        raise unusable(path, err) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        holder = _holder(fd)
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise StateDirInUse(state_dir, holder) from None
        raise ConfigError("state dir", f"cannot lock {path}: {err.strerror}") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {role}\n".encode(), 0)
    return StateLock(state_dir, fd)


def unusable(path: Path, err: OSError) -> ConfigError:
    """The one line for a state directory (or a file in it) this process may not use: the path,
    why, and what to do (every role takes ``--state-dir`` and ``ANEX_STATE_DIR``)."""
    what = f"{path}: {err.strerror or err}"
    if isinstance(err, PermissionError):
        return ConfigError("state dir", f"{what}: run as root (or as the user who owns it), or give a state "
                                        "directory this user may write with --state-dir or ANEX_STATE_DIR")
    return ConfigError("state dir", f"{what}: give a usable state directory with --state-dir or ANEX_STATE_DIR")


def _holder(fd: int) -> str:
    """``anex-agent gateway (PID 1234)`` from the lock file, as far as it says."""
    try:
        text = os.pread(fd, 128, 0).decode("ascii", "replace").split()
    except OSError:
        text = []
    if text and text[0].isascii() and text[0].isdigit():
        role = f"anex-agent {text[1]}" if len(text) > 1 else "another instance"
        return f"{role} (PID {text[0]})"
    return "another instance (PID unknown)"
