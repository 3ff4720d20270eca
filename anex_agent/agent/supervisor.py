"""The agent supervisor: one TaskGroup that owns every task of the node agent.

Order of start (each step only after the previous one worked)::

    detect -> choose engine -> identity (key; join or re-use the credential; config,
    or the last good config when the coordinator is down) -> engine.start/apply ->
    front-ends (proxy, forwards) -> agent API -> [workload] -> heartbeats + watch

Fail static: once the data plane is up, coordinator failures only make heartbeats and
the watch stream back off (with jitter) and retry; the tunnel, proxy and forwards keep
the last good config.

Stopping is bounded (:mod:`.stopping`): once the stop begins (the workload ended, or a stop
signal without one) an exit deadline is armed (:data:`~.stopping.STOP_MARGIN` s), every task
started through :attr:`Agent.tasks` is cancelled and waited for (bounded; one that goes on is
cancelled again), the last heartbeat carries the workload's end (``run``, bounded), then the
teardown (always, also on errors), each step bounded: workload, API, SSH, front-ends,
engine.stop(), so nothing of ours is left. A second SIGTERM/SIGINT while stopping kills the
workload, skips the last heartbeat and cuts every step short.

The agent API's and the GPU telemetry's modules (aiohttp's server, prometheus_client,
psutil, :mod:`anex_agent.gpu`) are imported once the data plane is up, in a worker thread,
so the proxy already serves while they load.

Tasks (named, owned by the TaskGroup of :meth:`Agent._supervise`): ``start-up`` (join
retries through workload start; a SIGTERM/SIGINT before the workload runs cancels it and
the agent exits with 128+N), then ``heartbeat``, ``watch``, ``ssh`` (the SSH server's upkeep, :mod:`anex_agent.remote.ssh_access`), ``gpu-telemetry`` (when
:mod:`anex_agent.gpu` is usable), ``workload`` (run only), and ``stop-wait`` and ``loop-watchdog`` (:mod:`anex_agent.host.loop_watchdog`: a step of the
event loop over 1 s is logged with the task that took it) throughout.
The data plane and its engine spawn theirs (``endpoint-follow``, an engine's own loops)
through :class:`anex_agent.tasks.Tasks` over the same TaskGroup: a failure is logged and
the task restarted with backoff.

The agent API listens on loopback and, when the engine puts the mesh address on an
interface of this host, on the mesh address too; that listener follows the address when
the coordinator changes it.
Signals: with a running workload they are forwarded to it (see :mod:`.workload`);
otherwise SIGTERM/SIGINT/SIGHUP/SIGQUIT stop the agent (``daemon`` exits 0 after a clean
stop; a second one while stopping hurries it) and the others are ignored. With a workload the agent is child subreaper and the task
``reaper`` reaps orphaned processes (:mod:`.reaper`). The workload starts once a gateway
handshake completed, ``wait_ready`` seconds at most (None: the data plane's default, 20 s;
0: at once); when none came by then it starts anyway and the task ``ready-wait`` logs when
the tunnel answers. ``on_ready`` is called once the tunnel answers, and
``notifier`` (:mod:`anex_agent.host.sdnotify`) then sends ``READY=1``; it gets ``STATUS=`` lines
along the start, ``STOPPING=1`` at teardown, and the task ``watchdog`` pings when systemd
asks for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import socket
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from anex_agent import __version__
from anex_agent.client import join_token
from anex_agent.host.sdnotify import Notifier
from anex_agent.backoff import Backoff
from anex_agent.agent.dataplane import DataPlane
from anex_agent.agent.heartbeat import (first_heartbeat, heartbeat_loop, last_heartbeat, last_heartbeat_timeout,
                                        start_telemetry, watch_loop)
from anex_agent.agent.stopping import HURRY_MARGIN, STOP_MARGIN, ExitDeadline, Teardown, cancel_and_wait
from anex_agent.client.link import CoordinatorLink
from anex_agent.tunnels.binds.egress_proxy import proxy_for
from anex_agent.agent.settings import AgentSettings, check_ports_free
from anex_agent.agent.state import NodeIdentity, StateDir
from anex_agent.agent.reaper import Reaper, become_subreaper
from anex_agent.agent.workload import FORWARDED, TERMINATING, Workload
from anex_agent.errors import ConfigError, CoordinatorError
from anex_agent.host.loop_watchdog import LoopWatchdog
from anex_agent.tasks import Tasks
from anex_agent.wire.nodes import NodeConfig, NodeFacts, NodeJoinRequest

if TYPE_CHECKING:
    from anex_agent.agent.api import AgentApi

log = logging.getLogger("anex_agent.agent")

#: How long a start-up call to the coordinator may take before we fall back (fail static).
STARTUP_TIMEOUT = 10.0
#: Teardown: SIGTERM to a workload still running, then SIGKILL after this (s); the step's bound.
TERMINATE_GRACE = 10.0
WORKLOAD_STOP = TERMINATE_GRACE + 2.0
#: Teardown: the data plane's stop (an engine's process gets 5 s to exit before SIGKILL).
DATAPLANE_STOP = 7.0


class Agent:
    """One node agent. ``run()`` returns the process exit status."""

    def __init__(self, settings: AgentSettings, *, detect_report: Callable[[], dict[str, Any]] | None = None,
                 wait_ready: float | None = None, notifier: Notifier | None = None,
                 push_dirs: tuple[str, ...] = (), exit_deadline: ExitDeadline | None = None,
                 pod_files=None) -> None:
        self.settings = settings
        self.pod_files = pod_files  # .pod_files.Delivery: the workload waits for the pod's files (run)
        self.push_dirs = push_dirs  # where the cluster may push files (run: ANEX_PUSH_DIRS)
        self.notifier = notifier or Notifier(None)  # systemd: READY=1 once the tunnel is up, STATUS=, watchdog
        self.wait_ready = wait_ready  # how long the workload waits for the tunnel (s); None: the default
        self.workload: Workload | None = None
        self.on_ready: Callable[[], None] | None = None  # called once when the tunnel first answers (sd_notify)
        self.state = StateDir(settings.state_dir)
        self.link = CoordinatorLink(settings.coordinator_url, ca_file=settings.ca_file,
                                    proxy=proxy_for(settings.coordinator_url, dict(settings.proxy_env)))
        self.dataplane: DataPlane | None = None
        self.identity: NodeIdentity | None = None
        self.coordinator_reachable: bool | None = None
        self.last_coordinator_error: str | None = None
        self._detect = detect_report
        self._stop = asyncio.Event()
        self._stop_signal: int | None = None
        self.exit_deadline = exit_deadline or ExitDeadline()  # the CLI's is enabled: see .stopping
        self._stopping = False  # the stop began (workload ended, stop signal, error): see _begin_stop
        self._exit_code = 1
        self._teardown_steps = Teardown()
        self.api: AgentApi | None = None
        self.telemetry = None  # anex_agent.gpu.monitor.TelemetryMonitor when available
        self.last_transport = None  # wire.TransportStatus, refreshed by heartbeats and /status (for /metrics)
        self._mesh_api_skipped = False
        self._mesh_api: tuple[str, int] | None = None  # where the mesh-side API listens now
        self.tasks: Tasks | None = None
        self.facts: NodeFacts | None = None  # what the node reported at its join (a re-join reports it again)
        self.credential_revoked: str | None = None  # set when the credential is refused and joining again failed
        self.heartbeat_acked = False  # a heartbeat of this run was acknowledged (heartbeat.last_heartbeat_timeout)
        self.heartbeat_wanted = asyncio.Event()  # the workload's state changed: heartbeat_loop sends one soon
        self.ssh = None  # anex_agent.remote.ssh_access.SshAccess when the SSH server is on (ssh_port > 0)

    # ---------------------------------------------------------------- start-up steps

    async def _join_or_load(self, pubkey: str, facts: NodeFacts) -> NodeConfig:
        """Identity + config: re-use the saved credential, else join; retry until it works.

        With a saved identity and a last good config, an unreachable coordinator is not
        an obstacle: we start fail-static on the saved config.
        """
        url = self.settings.coordinator_url
        backoff = Backoff(base=1.0, cap=30.0)
        saved_config = self.state.load_config()
        self.identity = self.state.load_identity(url)
        while True:
            try:
                if self.identity is not None:
                    self.link.set_credential(self.identity.credential)
                    async with asyncio.timeout(STARTUP_TIMEOUT):
                        config = await self.link.get_config(self.identity.node_id)
                    self.note_reachable(True)
                    log.info("re-using node identity %s (config version %d)", self.identity.node_id, config.version)
                    self._report_unused_token()
                    return config
                if not self.settings.join_token:
                    raise ConfigError("ANEX_JOIN_TOKEN", "is not set and this node has not joined yet; expected the join token")
                request = NodeJoinRequest(
                    token=self.settings.join_token,
                    public_key=pubkey,
                    name=self.settings.name,
                    provider=self.settings.provider,
                    facts=facts,
                )
                async with asyncio.timeout(STARTUP_TIMEOUT):
                    joined = await self.link.join(request)
                self.identity = NodeIdentity(url, joined.node_id, joined.credential)
                self.state.save_identity(self.identity)
                self.link.set_credential(joined.credential)
                self.note_reachable(True)
                log.info("joined %s as node %s, mesh address %s", url, joined.node_id, joined.config.address)
                return joined.config
            except (CoordinatorError, TimeoutError) as err:
                err = err if isinstance(err, CoordinatorError) else CoordinatorError("no answer in time", retryable=True)
                if err.status in (401, 403, 404) and self.identity is not None:
                    log.warning("the coordinator no longer knows node %s (%s); joining again", self.identity.node_id, err)
                    self.state.forget_identity()
                    self.identity = None
                    saved_config = None
                    continue
                if not err.retryable:
                    refused = join_token.refusal(self.settings.join_token_source, err)
                    if refused is not None:
                        raise refused from None
                    raise
                self.note_reachable(False, str(err))
                if saved_config is not None and self.identity is not None:
                    log.warning("coordinator unreachable (%s); starting fail-static on the last good config (version %d)", err, saved_config.version)
                    self._report_unused_token()
                    return saved_config
                delay = backoff.next_delay()
                log.warning("coordinator %s unreachable (%s); retrying in %.1f s", url, err, delay)
                await asyncio.sleep(delay)

    def _report_unused_token(self) -> None:
        """A join token given to a node that re-used its saved credential was not spent: say so.

        The coordinator lets only an admin revoke a join token (a node cannot revoke one it
        holds), so it stays good until it expires or is revoked; the agent already took it
        out of its environment (/proc/<pid>/environ) and no process it starts gets it."""
        if self.settings.join_token and self.identity is not None:
            log.warning("a join token was given but not used: this node re-used its saved credential (node %s). "
                        "The token stays valid until it expires or an admin revokes it (anex-agent admin tokens "
                        "list, then delete); give a join token only to a node that has not joined",
                        self.identity.node_id)

    def note_reachable(self, ok: bool, error: str | None = None) -> None:
        """Record whether the last coordinator call worked (``/status``, ``/metrics``); ``error`` says why not."""
        self.coordinator_reachable = ok
        self.last_coordinator_error = None if ok else error

    async def apply_config(self, config: NodeConfig, *, gateways_changed: bool = False) -> None:
        """Apply a new config from the coordinator (watch or heartbeat) and remember it.

        ``gateways_changed``: a gateway (re-)registered, e.g. after a restart: its
        WireGuard sessions are gone, so ours are reset for an immediate handshake.
        """
        assert self.dataplane is not None
        if gateways_changed:
            await self.dataplane.apply(config)
            await self.dataplane.reset_gateway_sessions()
        elif self.dataplane.config is not None and config == self.dataplane.config:
            return
        else:
            await self.dataplane.apply(config)
        self.state.save_config(config)
        if self.api is not None:
            await self._serve_api_on_mesh(config)
        if self.ssh is not None:
            await self.ssh.serve(self.dataplane, config.address)
            if self.ssh.node_id and self.ssh.node_id != config.node_id:  # joined again: a new identity
                self.ssh.node_id = ""  # the ssh task certifies the host key for the new node id

    async def _serve_api_on_mesh(self, config: NodeConfig) -> None:
        assert self.api is not None and self.dataplane is not None
        if not self.dataplane.host_address:
            if not self._mesh_api_skipped:  # the engine holds the address: it serves the port (once, it follows moves)
                port = self.settings.api_listen.port
                if await self.dataplane.serve_on_mesh(port, await self.api.protocol_factory()):
                    log.info("agent API listening on the mesh address, port %d, through the %s engine (bearer token required)",
                             port, self.dataplane.engine_cls.name)
                else:
                    log.info("agent API: not served on the mesh address (engine %s has no OS interface)", self.dataplane.engine_cls.name)
                self._mesh_api_skipped = True
            return
        where = (config.address, self.settings.api_listen.port)
        if where == self._mesh_api:
            return
        if self._mesh_api is not None:  # the coordinator moved the node: the old address is gone
            await self.api.stop_site(*self._mesh_api)
            log.info("agent API: no longer listening on %s:%d (the mesh address changed)", *self._mesh_api)
            self._mesh_api = None
        try:
            await self.api.start(*where)
        except OSError as err:
            log.warning("agent API cannot listen on the mesh address %s:%d: %s", *where, err.strerror)
            return
        self._mesh_api = where

    # ---------------------------------------------------------------- SSH callbacks

    def _ssh_identity(self) -> tuple[str, str] | None:
        """(node id, mesh address) for the SSH host certificate, None before the node has both."""
        config = self.dataplane.config if self.dataplane else None
        if self.identity is None or config is None:
            return None
        return self.identity.node_id, config.address

    def _session_context(self):
        """Where SSH sessions run: the workload's environment, account and directory."""
        from anex_agent.remote.ssh_access import SessionContext
        from anex_agent.host.childenv import workload_env

        workload = self.workload
        env = workload.env if workload is not None and workload.env is not None else workload_env(os.environ)
        account = workload.account if workload is not None else None
        return SessionContext(env=dict(env), account=account, cwd=os.getcwd())

    # ---------------------------------------------------------------- API callbacks

    def verify_token(self, token: str, now: float):
        """The claims of a valid access token for this node at ``now``, else None (logged)."""
        from anex_agent.wire import access_token

        config = self.dataplane.config if self.dataplane else None
        if config is None or not config.agent_api_verify_key:
            return None
        try:
            return access_token.verify(config.agent_api_verify_key, token, node_id=config.node_id, now=now)
        except Exception as err:  # InvalidAccessToken and malformed keys alike
            log.info("agent API: refused a mesh-side token: %s", err)
            return None

    async def status(self) -> dict[str, Any]:
        doc = await self.dataplane.status_doc() if self.dataplane else {}
        if self.dataplane is not None:
            self.last_transport = await self.dataplane.transport_status()
        doc.update(
            {
                "agent_version": __version__,
                "node_id": self.identity.node_id if self.identity else None,
                "name": self.settings.name,
                "workload": self.workload.state.model_dump(mode="json") if self.workload is not None else None,
                "ssh": self.ssh.status() if self.ssh is not None else None,
                "coordinator": {
                    "url": self.settings.coordinator_url,
                    "reachable": self.coordinator_reachable,
                    "last_error": self.last_coordinator_error,
                },
            }
        )
        return doc

    async def ready(self) -> tuple[bool, str]:
        if self.dataplane is None:
            return False, "the data plane is not up yet"
        return await self.dataplane.ready()

    # ---------------------------------------------------------------- main

    async def run(self, workload: Workload | None = None) -> int:
        """Bring everything up, run until the workload exits (or a stop signal), tear down."""
        check_ports_free(self.settings)
        keypair = self.state.keypair()
        self.link.keypair = keypair  # joins prove possession of it
        # probes may run their own event loop (pyroute2): keep them off ours
        report = await asyncio.to_thread(self._detect) if self._detect else {}
        self.dataplane = DataPlane(self.settings, keypair, report)
        engine_cls = await asyncio.to_thread(self.dataplane.choose_engine)  # ConfigError/EngineError before joining
        facts = NodeFacts(
            hostname=socket.gethostname(),
            capabilities=list(report.get("capabilities") or [engine_cls.name]),
            detect=report,
            agent_version=__version__,
            api_port=self.settings.api_listen.port,
            ssh_port=self.settings.ssh_port,
        )
        self.facts = facts
        loop = asyncio.get_running_loop()
        self.workload = workload
        if workload is not None:
            workload.tracker.listeners.append(self.heartbeat_wanted.set)  # e.g. a readiness probe's verdict
        if workload is not None and not become_subreaper():
            log.warning("cannot register as child subreaper: orphans of the workload are reaped only when the agent is PID 1")
        for signum in FORWARDED:
            loop.add_signal_handler(signum, self._on_signal, signum, workload)
        try:
            return await self._supervise(keypair.public_b64, facts, workload)
        except BaseExceptionGroup as group:
            # one line for the CLI: the first real error out of the TaskGroup, not the group
            raise _first_error(group) from None
        finally:
            self._begin_stop(self._exit_code, workload)  # already begun unless an error ended the group
            try:
                await self._teardown(workload)
            finally:  # ours until the end of the teardown: a second signal cuts it short
                for signum in FORWARDED:
                    loop.remove_signal_handler(signum)
                if self.exit_deadline.enabled:  # the process is on its way out (within the deadline):
                    for signum in TERMINATING:  # a late signal neither kills it nor raises KeyboardInterrupt
                        signal.signal(signum, signal.SIG_IGN)

    async def _start_up(self, pubkey: str, facts: NodeFacts, workload: Workload | None) -> None:
        """Join (or re-use), data plane, API, then the workload. Cancelled by a stop signal."""
        assert self.dataplane is not None
        self.notifier.status(f"joining {self.settings.coordinator_url}")
        config = await self._join_or_load(pubkey, facts)
        self.notifier.status("starting the data plane")
        assert self.tasks is not None
        await self.dataplane.start(config, self.tasks)
        self.state.save_config(config)
        # the API's and the telemetry's modules load in a thread: the proxy serves meanwhile
        api, actions, logs_api, metrics = await asyncio.to_thread(_api_modules)
        self.api = api.AgentApi(self.status, self.ready, self.verify_token)
        logs_api.add_routes(self.api.app, lambda: workload.logs if workload is not None else None)
        actions.add_routes(self.api, lambda: workload, push_dirs=self.push_dirs,
                           on_pushed=self.pod_files.pushed if self.pod_files is not None else None)
        self.api.registry.register(metrics.AgentCollector(self))
        self.last_transport = await self.dataplane.transport_status()
        self.telemetry = start_telemetry(str(self.settings.state_dir), self.api.registry,
                                         self.settings.gpu_metrics)
        if self.telemetry is not None and self.settings.provider.value == "onprem":
            self.telemetry.qualify = True  # on-prem: send telemetry["qualification"] (anex_agent.gpu.qualify)
        await self.api.start(self.settings.api_listen.host, self.settings.api_listen.port)
        await self._serve_api_on_mesh(config)
        if self.settings.ssh_port:
            from anex_agent.remote.ssh_access import SshAccess

            self.ssh = SshAccess(self.settings.state_dir, self.settings.ssh_port, self._session_context)
            await self.ssh.serve(self.dataplane, config.address)
        if await (self.dataplane.wait_handshake(self.wait_ready) if self.wait_ready is not None and workload
                  else self.dataplane.wait_handshake()):
            self._ready_now()
        else:
            log.warning("no WireGuard handshake with a gateway yet; starting anyway (WireGuard keeps trying)")
            self.tasks.spawn("ready-wait", self._when_ready)
        print(f"anex-agent: mesh up: {self.dataplane.summary()}", flush=True)
        if workload is not None:
            # the coordinator hears of the node before a short workload can end (heartbeat.first_heartbeat)
            self.tasks.create("first-heartbeat", first_heartbeat(self))
            if self.pod_files is None:
                await workload.start()  # else once the pod's files are in (_run_workload)

    async def _when_ready(self) -> None:
        """Task ``ready-wait``: once a gateway answers (it may register long after the agent started)."""
        assert self.dataplane is not None
        await self.dataplane.handshake()  # waits for a gateway first when none is registered yet
        self._ready_now()

    def _ready_now(self) -> None:
        log.info("tunnel ready: a gateway answered")
        summary = self.dataplane.summary() if self.dataplane is not None else ""
        self.notifier.notify(READY=1, STATUS=f"tunnel up: {summary}")
        if self.on_ready is not None:
            self.on_ready()

    async def _supervise(self, pubkey: str, facts: NodeFacts, workload: Workload | None) -> int:
        try:
            async with asyncio.TaskGroup() as tg:
                self.tasks = tasks = Tasks(tg, role="agent")
                stopper = tasks.create("stop-wait", self._stop.wait())
                tasks.create("loop-watchdog", LoopWatchdog().run())
                if self.notifier.watchdog_interval is not None:
                    tasks.create("watchdog", self.notifier.watchdog())
                startup = tasks.create("start-up", self._start_up(pubkey, facts, workload))
                await asyncio.wait({startup, stopper}, return_when=asyncio.FIRST_COMPLETED)
                if not startup.done():  # a signal before the workload ran: stop, with the shell's status
                    await self._wind_down(128 + (self._stop_signal or signal.SIGTERM), None)
                    raise _Done
                tasks.create("heartbeat", heartbeat_loop(self))
                tasks.create("watch", watch_loop(self))
                if self.ssh is not None:
                    tasks.create("ssh", self.ssh.run(self.link.client, self._ssh_identity))
                if self.telemetry is not None:
                    tasks.create("gpu-telemetry", self.telemetry.run())
                if workload is not None:
                    tasks.create("reaper", Reaper().run())
                    waiter = tasks.create("workload", self._run_workload(workload))
                    await asyncio.wait({waiter, stopper}, return_when=asyncio.FIRST_COMPLETED)
                    if waiter.done():
                        code = waiter.result()
                    else:  # stopped while it ran (its own end is its status), or before (the shell's status)
                        code = 1 if workload.proc is not None else 128 + (self._stop_signal or signal.SIGTERM)
                    await self._wind_down(code, workload)
                else:
                    await stopper
                    await self._wind_down(0, None)
                raise _Done  # every task has ended (or was logged and left to the exit deadline)
        except BaseExceptionGroup as group:
            if _first_error(group) is not None:
                raise
        return self._exit_code

    async def _run_workload(self, workload: Workload) -> int:
        """Task ``workload``: (start it once the pod's files are in, when the cluster pushes them) wait for its end."""
        if workload.proc is None and self.pod_files is not None:
            await self.pod_files.wait()
            self.pod_files.apply(workload)
            await workload.start()
        return await workload.wait()

    def _begin_stop(self, exit_code: int, workload: Workload | None) -> None:
        """The stop begins: from now on the process exits within :data:`STOP_MARGIN` s (plus the
        workload's stop when it still runs), whatever hangs."""
        if self._stopping:
            return
        self._stopping = True
        self._exit_code = exit_code
        running = workload is not None and workload.proc is not None and workload.proc.returncode is None
        self.exit_deadline.arm(STOP_MARGIN + (WORKLOAD_STOP if running else 0.0), exit_code)

    async def _wind_down(self, exit_code: int, workload: Workload | None) -> None:
        """End every task of ours (bounded), then, when a workload ran, the last heartbeat with its end."""
        self._begin_stop(exit_code, workload)
        assert self.tasks is not None
        me = asyncio.current_task()
        await cancel_and_wait([t for t in self.tasks.live() if t is not me])
        if workload is not None and workload.proc is not None and self.identity is not None \
                and not self._teardown_steps.hurried:
            await self._teardown_steps.step("the last heartbeat", lambda: last_heartbeat(self),
                                            timeout=last_heartbeat_timeout(self) + 1.0)

    def _on_signal(self, signum: int, workload: Workload | None) -> None:
        running = workload is not None and workload.proc is not None and workload.proc.returncode is None
        if signum in TERMINATING and (self._stopping or self._stop.is_set()):
            self._hurry(signum, workload if running else None)
        elif running:
            workload.forward(signum)
        elif signum not in TERMINATING:
            log.info("received %s: nothing to forward it to", signal.Signals(signum).name)
        else:
            log.info("received %s: stopping", signal.Signals(signum).name)
            self._stop_signal = self._stop_signal or signum
            self._stop.set()

    def _hurry(self, signum: int, workload: Workload | None) -> None:
        """A second stop signal while stopping: kill the workload, cut the teardown short."""
        log.warning("received %s while stopping: stopping at once", signal.Signals(signum).name)
        if workload is not None:
            workload.kill_group()
        self._teardown_steps.hurry()
        code = self._exit_code if self._stopping else 128 + (self._stop_signal or signum)
        self.exit_deadline.arm(HURRY_MARGIN, code)

    async def _teardown(self, workload: Workload | None) -> None:
        """Workload, API, SSH, telemetry, data plane, coordinator connection: each step bounded."""
        self.notifier.notify(STOPPING=1, STATUS="stopping")
        steps = self._teardown_steps
        if workload is not None:
            await steps.step("stopping the workload", lambda: _terminate(workload), timeout=WORKLOAD_STOP)
        if self.api is not None:
            await steps.step("closing the agent API", self.api.close)
        if self.ssh is not None:
            await steps.step("closing the SSH server", self.ssh.close)
        if self.telemetry is not None:
            self.telemetry.close()
        if self.dataplane is not None:
            await steps.step("stopping the data plane", self.dataplane.stop, timeout=DATAPLANE_STOP)
        await steps.step("closing the coordinator connection", self.link.close)
        log.info("agent stopped; interfaces, routes and listeners removed")


async def _terminate(workload: Workload) -> None:
    with contextlib.suppress(ProcessLookupError):
        await workload.terminate(TERMINATE_GRACE)


class _Done(Exception):
    """Leaves the TaskGroup: cancels the remaining tasks."""


def _api_modules() -> tuple[Any, Any, Any, Any]:
    """The agent API's modules (the HTTP server, prometheus_client, access tokens) and the GPU
    telemetry's, imported once the data plane is up, in a worker thread (see :meth:`Agent._start_up`):
    none of them is needed for the first proxied answer."""
    from anex_agent.agent import actions, api, logs_api, metrics

    try:  # start_telemetry() imports them (and says so when it cannot)
        import anex_agent.gpu.exposition  # noqa: F401
        import anex_agent.gpu.monitor  # noqa: F401
    except ImportError:
        pass
    return api, actions, logs_api, metrics


def _first_error(group: BaseExceptionGroup) -> BaseException | None:
    """The first exception in ``group`` (depth first) that is not :class:`_Done`, or None."""
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            found = _first_error(exc)
            if found is not None:
                return found
        elif not isinstance(exc, _Done):
            return exc
    return None
