"""The workload of ``anex-agent run -- CMD ARGS...``: start it, forward signals, report its status.

Contract:

* :meth:`Workload.start` runs the command in a process group of its own (its pid is the
  group id), with the environment it is given (the CLI passes
  :func:`anex_agent.host.childenv.workload_env`: no ``ANEX_*`` secret); with an
  :class:`~anex_agent.host.childenv.AccountInfo` (``--user``) it runs as that account: the child
  calls setgroups (the account's groups), setgid and setuid before exec;
* the signals in :data:`FORWARDED` received by the agent are forwarded to the workload's
  process (the agent keeps running until the workload exits, so it can still reach the
  cluster while it shuts down). A forwarded SIGTERM, SIGINT, SIGHUP or SIGQUIT starts the
  grace period (``grace`` seconds, default :data:`DEFAULT_GRACE`): when it has not exited by
  then, its whole process group is killed (SIGKILL). A second SIGTERM/SIGINT kills at once;
* :meth:`Workload.wait` returns the shell-style exit status: the workload's own, or
  ``128 + N`` when signal N killed it (as a shell reports it), and records the
  :class:`~anex_agent.wire.heartbeat.ContainerState` (``state``): ``OOMKilled`` from the memory
  cgroup's events (:mod:`.container_state`);
* with a :class:`~anex_agent.agent.logs.LogStore` (``logs``) its stdout and stderr are pipes:
  :meth:`Workload.wait` copies them, unchanged, to the agent's own stdout and stderr and into
  the store (tasks ``workload-stdout``/``workload-stderr`` of its own TaskGroup), and closes
  the store once the workload ended and its pipes are drained (:data:`DRAIN_WAIT` s at most:
  a process it left behind may hold them open);
* :meth:`Workload.restart` (an action of the cluster) stops it like a SIGTERM (grace period
  included) and :meth:`Workload.wait` starts it again, with the same command, environment
  and account; the state's ``restart_count`` counts the restarts;
* with a restart policy (:mod:`.restart_policy`: ``OnFailure``, ``Always``) :meth:`Workload.wait`
  starts the workload again after it exited, as a kubelet restarts a container in place: the
  state is ``waiting`` ``CrashLoopBackOff`` for the back-off (10 s doubling to 5 min, reset by a
  run of 10 min), then running again with ``restart_count`` + 1. A workload stopped by a
  forwarded terminating signal is not started again (the agent is stopping);
* with a :class:`~.probes.Prober` (``prober``: the pod's startup, liveness and readiness probes)
  each run is probed by a task of the same TaskGroup; the state carries ``ready`` and
  ``started``, and a failed liveness or startup probe stops the run (:meth:`Workload.kill_unhealthy`),
  after which the restart policy decides as after any exit;
* :meth:`Workload.terminate` (teardown) stops what is left: SIGTERM, then SIGKILL to the
  whole process group after ``grace``;
* it dies with the agent (:mod:`.workload_lifetime`): SIGKILL when the agent dies, however it
  dies; with a :class:`~.workload_lifetime.WorkloadRecord` (``record``, in the state dir) its
  pid and start time are recorded while it runs, and the first :meth:`Workload.start` stops a
  previous run's workload that still runs (SIGTERM, SIGKILL after ``grace``) first.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pwd
import shutil
import signal
from collections.abc import Mapping, Sequence

from anex_agent.agent.container_state import StateTracker
from anex_agent.agent.logs import LogStore, pump
from anex_agent.agent.probes import Prober
from anex_agent.agent.restart_policy import CrashLoopBackoff, restarts
from anex_agent.agent.workload_lifetime import WorkloadRecord, die_with_parent
from anex_agent.host.childenv import AccountInfo
from anex_agent.errors import ConfigError
from anex_agent.wire.heartbeat import ContainerState

log = logging.getLogger(__name__)

#: signals the agent passes on to a running workload
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2,
             signal.SIGWINCH)
#: of those, the ones that ask the workload to stop (they start the grace period)
TERMINATING = frozenset({signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT})
#: seconds between a terminating signal and SIGKILL to the workload's process group
DEFAULT_GRACE = 30.0
#: seconds the output copy may go on after the workload exited
DRAIN_WAIT = 2.0


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
        self, argv: Sequence[str], env: Mapping[str, str] | None = None, account: AccountInfo | None = None,
        *, grace: float = DEFAULT_GRACE, tracker: StateTracker | None = None, logs: LogStore | None = None,
        record: WorkloadRecord | None = None,
        restart_policy: str = "Never", backoff: CrashLoopBackoff | None = None, prober: Prober | None = None,
    ) -> None:
        self.restart_policy = restart_policy
        self.prober = prober
        self.backoff = backoff or CrashLoopBackoff()
        self._told_to_stop = False  # a terminating signal was forwarded: no restart by policy
        self.logs = logs
        self.record = record
        self._started_once = False
        self.argv = list(argv)
        self.env = dict(env) if env is not None else None
        self.account = account
        self.grace = grace
        self.tracker = tracker or StateTracker()
        self.proc: asyncio.subprocess.Process | None = None
        self._signals_seen = 0
        self._restart = False
        self._grace_timer: asyncio.TimerHandle | None = None

    @property
    def state(self) -> ContainerState:
        return self.tracker.state

    async def start(self, **streams) -> None:
        """Start the workload; ConfigError naming ``CMD`` when it cannot be executed (as the account).

        ``streams``: ``stdout``/``stderr`` for the subprocess (default: the agent's own)."""
        ids = {}
        if self.logs is not None:
            streams = dict(stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, **streams)
        if self.account is not None:
            ids = dict(user=self.account.uid, group=self.account.gid, extra_groups=list(self.account.groups))
        if self.record is not None and not self._started_once:
            await self.record.stop_previous(self.grace)
        self._started_once = True
        try:
            # forked by this thread, the event loop's (the agent's main thread): the workload's
            # parent-death signal, set after the account switch, follows the agent's life
            self.proc = await asyncio.create_subprocess_exec(*self.argv, env=self.env, process_group=0,
                                                             preexec_fn=die_with_parent(os.getpid()),
                                                             **ids, **streams)
        except OSError as err:
            who = f" as user {self.account.name!r}" if self.account is not None else ""
            raise ConfigError("CMD", f"cannot run {self.argv[0]!r}{who}: {err.strerror or err}") from None
        ready, started = self.prober.initial() if self.prober is not None else (None, None)
        self.tracker.started(ready=ready, started=started)
        if self.record is not None:
            self.record.save(self.proc.pid)
        who = f" as {self.account.name} (uid {self.account.uid})" if self.account is not None else ""
        log.info("workload started (pid %d)%s: %s", self.proc.pid, who, " ".join(self.argv))

    def forward(self, signum: int) -> None:
        """Forward ``signum`` to the workload; a terminating one starts the grace period, the
        second SIGTERM/SIGINT kills its process group."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self._signals_seen += 1 if signum in (signal.SIGTERM, signal.SIGINT) else 0
        if self._signals_seen >= 2:
            log.warning("second signal: killing the workload")
            self.kill_group()
            return
        log.info("forwarding %s to the workload", signal.Signals(signum).name)
        self._told_to_stop = self._told_to_stop or signum in TERMINATING
        self.proc.send_signal(signum)
        if signum in TERMINATING and self._grace_timer is None:
            self._grace_timer = asyncio.get_running_loop().call_later(self.grace, self._grace_over)

    def _grace_over(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            log.warning("the workload did not exit within the grace period of %g s: killing its process group",
                        self.grace)
            self.kill_group()

    def kill_group(self) -> None:
        """SIGKILL to the workload's process group (what it started and left in it too)."""
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            if self.proc.returncode is None:
                self.proc.kill()

    async def wait(self) -> int:
        """Wait for the workload's end (restarting it when :meth:`restart` asked); its status."""
        assert self.proc is not None, "start() first"
        while True:
            returncode = await self._wait_once()
            if self._grace_timer is not None:
                self._grace_timer.cancel()
                self._grace_timer = None
            state = self.tracker.terminated(returncode)
            code = exit_status(returncode)
            if self._restart:
                self._restart = False
                self._signals_seen = 0
                log.info("workload exited with status %d (%s); starting it again as asked", code, state.reason)
                await self.start()
                continue
            if restarts(self.restart_policy, code) and not self._told_to_stop:
                ran = (state.finished_at - state.started_at).total_seconds() if state.started_at and \
                    state.finished_at else 0.0
                delay = self.backoff.next_delay(ran)
                self.tracker.backing_off()
                log.info("workload exited with status %d (%s); restart policy %s: starting it again in %g s "
                         "(CrashLoopBackOff)", code, state.reason, self.restart_policy, delay)
                await asyncio.sleep(delay)  # a stop signal meanwhile cancels this task (the agent's stop)
                self._signals_seen = 0
                await self.start()
                continue
            if self.logs is not None:
                self.logs.close()
            if self.record is not None:
                self.record.clear()
            log.info("workload exited with status %d (%s)", code, state.reason)
            return code

    async def _wait_once(self) -> int:
        assert self.proc is not None
        copying = self.logs is not None and self.proc.stdout is not None and self.proc.stderr is not None
        if not copying and self.prober is None:
            return await self.proc.wait()
        async with asyncio.TaskGroup() as tg:
            copies = [tg.create_task(pump(self.proc.stdout, "stdout", 1, self.logs), name="workload-stdout"),
                      tg.create_task(pump(self.proc.stderr, "stderr", 2, self.logs), name="workload-stderr")] \
                if copying else []
            probing = tg.create_task(self.prober.run(self), name="workload-probes") if self.prober else None
            returncode = await self.proc.wait()
            if probing is not None:
                probing.cancel()
            if copies:
                _, late = await asyncio.wait(copies, timeout=DRAIN_WAIT)
                for task in late:
                    task.cancel()
        return returncode

    def kill_unhealthy(self, grace: float | None = None) -> None:
        """Stop a workload its liveness or startup probe found unhealthy: SIGTERM, its process group
        SIGKILLed after ``grace`` (default: the grace period). Not a stop of the agent: its restart
        policy decides what follows, as after any exit."""
        if self.proc is None or self.proc.returncode is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        if self._grace_timer is None:
            self._grace_timer = asyncio.get_running_loop().call_later(
                self.grace if grace is None else grace, self._grace_over)

    def restart(self) -> bool:
        """Ask for a restart: SIGTERM with the grace period, then :meth:`wait` starts the
        workload again (``restart_count`` + 1). False when it is not running."""
        if self.proc is None or self.proc.returncode is not None:
            return False
        self._restart = True
        log.info("restarting the workload as asked: SIGTERM, grace %g s", self.grace)
        self.proc.send_signal(signal.SIGTERM)
        if self._grace_timer is None:
            self._grace_timer = asyncio.get_running_loop().call_later(self.grace, self._grace_over)
        return True

    async def terminate(self, grace: float = 10.0) -> None:
        """Stop the workload if it still runs (the agent is failing): SIGTERM, then SIGKILL to its
        process group; the group is killed also when the workload itself has exited already."""
        if self.proc is None:
            return
        if self.proc.returncode is None:
            self.proc.terminate()
            try:
                async with asyncio.timeout(grace):
                    await self.proc.wait()
            except TimeoutError:
                pass
        self.kill_group()
        await self.proc.wait()
        if self.record is not None:
            self.record.clear()
