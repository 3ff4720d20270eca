"""The workload of ``anex-agent run -- CMD ARGS...``: start it, forward signals, report its status.

Contract:

* :meth:`Workload.start` is called only once the mesh and the front-ends are up;
* SIGTERM, SIGINT and SIGHUP received by the agent are forwarded to the workload (the agent
  keeps running until the workload exits, so it can still reach the cluster while it
  shuts down); a second SIGINT/SIGTERM kills the workload;
* :meth:`Workload.wait` returns the shell-style exit status: the workload's own, or
  ``128 + N`` when signal N killed it (as a shell reports it);
* the workload gets the environment it is given (the CLI passes
  :func:`anex_agent.childenv.workload_env`: no ``ANEX_*`` secret); with an
  :class:`~anex_agent.childenv.AccountInfo` (``--user``) it runs as that account: the child
  calls setgroups (the account's groups), setgid and setuid before exec.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import signal
from collections.abc import Mapping, Sequence

from anex_agent.childenv import AccountInfo
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


def resolve_account(name: str, source: str, *, euid: int) -> AccountInfo:
    """The account ``name`` (a user name, or a numeric uid) for running the workload as it.

    ConfigError naming ``source`` (``--user`` or ``ANEX_WORKLOAD_USER``) when there is no such
    user, or when the agent (effective uid ``euid``) is not root and so cannot switch users."""
    name = name.strip()
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
    except (KeyError, ValueError, OverflowError):
        raise ConfigError(source, f"no user {name!r} on this machine; expected a user name (or uid) from the "
                                  "password database, e.g. nobody") from None
    if euid != 0:
        raise ConfigError(source, f"running the workload as {entry.pw_name!r} needs root; the agent runs as uid {euid} "
                                  f"(start it as root, or drop {source})")
    groups = tuple(sorted(set(os.getgrouplist(entry.pw_name, entry.pw_gid))))
    return AccountInfo(entry.pw_name, entry.pw_uid, entry.pw_gid, entry.pw_dir or "/", groups)


class Workload:
    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, account: AccountInfo | None = None
    ) -> None:
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.account = account
        self.proc: asyncio.subprocess.Process | None = None
        self._signals_seen = 0

    async def start(self) -> None:
        """Start the workload; ConfigError naming ``CMD`` when it cannot be executed (as the account)."""
        ids = {}
        if self.account is not None:
            ids = dict(user=self.account.uid, group=self.account.gid, extra_groups=list(self.account.groups))
        try:
            self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env, **ids)
        except OSError as err:
            who = f" as user {self.account.name!r}" if self.account is not None else ""
            raise ConfigError("CMD", f"cannot run {self.argv[0]!r}{who}: {err.strerror or err}") from None
        who = f" as {self.account.name} (uid {self.account.uid})" if self.account is not None else ""
        log.info("workload started (pid %d)%s: %s", self.proc.pid, who, " ".join(self.argv))

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
