"""The workload of ``anex-agent run -- CMD ARGS...``: start it, forward signals, report its status.

Contract:

* :meth:`Workload.start` is called only once the mesh and the front-ends are up;
* SIGTERM, SIGINT and SIGHUP received by the agent are forwarded to the workload (the agent
  keeps running until the workload exits, so it can still reach the cluster while it
  shuts down); a second SIGINT/SIGTERM kills the workload;
* :meth:`Workload.wait` returns the shell-style exit status: the workload's own, or
  ``128 + N`` when signal N killed it (as a shell reports it).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import signal
from collections.abc import Mapping, Sequence

from anex_agent.errors import ConfigError

log = logging.getLogger(__name__)

FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def exit_status(returncode: int) -> int:
    return 128 - returncode if returncode < 0 else returncode


def check_command(argv: Sequence[str]) -> None:
    """Raise ConfigError when the workload command cannot be run (before the mesh is built)."""
    if not argv:
        raise ConfigError("CMD", "no workload given; expected: anex-agent run [options] -- CMD ARGS...")
    cmd = argv[0]
    if os.sep in cmd:
        if not (os.path.isfile(cmd) and os.access(cmd, os.X_OK)):
            raise ConfigError("CMD", f"{cmd!r} is not an executable file")
    elif shutil.which(cmd) is None:
        raise ConfigError("CMD", f"{cmd!r} is not found on PATH")


class Workload:
    def __init__(self, argv: Sequence[str], env: Mapping[str, str] | None = None) -> None:
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.proc: asyncio.subprocess.Process | None = None
        self._signals_seen = 0

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env)
        log.info("workload started (pid %d): %s", self.proc.pid, " ".join(self.argv))

    def forward(self, signum: int) -> None:
        """Forward ``signum`` to the workload; the second terminating signal kills it."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self._signals_seen += 1 if signum in (signal.SIGTERM, signal.SIGINT) else 0
        if self._signals_seen >= 2:
            log.warning("second signal: killing the workload")
            self.proc.kill()
            return
        log.info("forwarding %s to the workload", signal.Signals(signum).name)
        self.proc.send_signal(signum)

    async def wait(self) -> int:
        assert self.proc is not None, "start() first"
        code = exit_status(await self.proc.wait())
        log.info("workload exited with status %d", code)
        return code

    async def terminate(self, grace: float = 10.0) -> None:
        """Stop the workload if it still runs (the agent is failing): SIGTERM, then SIGKILL."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.terminate()
        try:
            await asyncio.wait_for(self.proc.wait(), grace)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
