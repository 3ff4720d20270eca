"""Child processes of the engines (wireguard-go, wireproxy): started one way, dying with us.

Every engine that runs a program starts it with :func:`spawn`, which sets
``PR_SET_PDEATHSIG`` in the child so that it gets SIGTERM when the agent or gateway dies,
even by SIGKILL, and no tunnel process outlives its owner.

Fork safety: between ``fork`` and ``exec`` the child of a process that runs threads
(asyncio's default executor, pyroute2) may find any lock held by a thread that no longer
exists. So the libc ``prctl`` symbol is looked up here, in the parent, and the child only
makes two plain system calls (``prctl`` and ``getppid``): no import, no allocation worth
a lock. If the parent died before ``prctl`` took effect (the race the man page warns
about), the child signals itself.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable
from typing import Any

#: linux/prctl.h
PR_SET_PDEATHSIG = 1

_prctl: Any = None


def _libc_prctl() -> Any:
    global _prctl
    if _prctl is None:
        import ctypes

        _prctl = ctypes.CDLL(None, use_errno=True).prctl
    return _prctl


def pdeathsig_preexec(sig: int = signal.SIGTERM) -> Callable[[], None]:
    """A ``preexec_fn`` that makes the child receive ``sig`` when this process dies. Call it in the parent."""
    prctl = _libc_prctl()
    parent = os.getpid()
    signum = int(sig)

    def preexec() -> None:  # pragma: no cover - runs in the child, between fork and exec
        prctl(PR_SET_PDEATHSIG, signum)
        if os.getppid() != parent:  # the parent died before prctl: nobody will signal us
            os.kill(os.getpid(), signum)

    preexec.pdeathsig = signum  # type: ignore[attr-defined]  # lets tests see that spawn set it
    return preexec


async def spawn(program: str, *args: str, **kwargs: Any) -> asyncio.subprocess.Process:
    """``asyncio.create_subprocess_exec(program, *args, **kwargs)`` with PR_SET_PDEATHSIG=SIGTERM.

    ``preexec_fn`` must not be given (this function owns it). OSError when the program cannot run.
    """
    if "preexec_fn" in kwargs:
        raise TypeError("spawn() sets preexec_fn itself")
    return await asyncio.create_subprocess_exec(program, *args, preexec_fn=pdeathsig_preexec(), **kwargs)
