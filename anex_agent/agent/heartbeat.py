"""Heartbeats and the watch stream: the agent's two long-running coordinator tasks.

Both are fail static: a failure only marks the coordinator unreachable and backs off
(exponential, jittered, capped) before the next try; the data plane keeps running on the
last good config. Neither ever raises out of its loop except on cancellation.

* :func:`heartbeat_loop` sends status (engine, path, handshake age, byte counters) and
  the telemetry block of :mod:`anex_agent.gpu` (``TelemetryMonitor.telemetry()``, sent as
  the wire model :class:`anex_agent.telemetry.models.Telemetry`);
  it waits ``next_heartbeat_in`` from the ack, or less when the workload's state changes
  (:func:`pause`: a readiness verdict reaches the pod at once). When the ack says the coordinator holds
  a newer config than ours, it fetches and applies it (a watch event may have been lost).
* :func:`watch_loop` follows ``GET /v1/watch?since=<version>`` and applies every
  ``snapshot`` / ``config`` / ``gateway_changed`` event's config; ``ssh_revoked`` events go to
  the SSH server (:mod:`anex_agent.remote.ssh_access`), which also reloads its revoked serials after a snapshot.

:func:`first_heartbeat` is sent as the workload of ``run`` starts (a task of its own, holding
nothing), so that the coordinator hears of the node before a short workload can end: a
provision becomes ready on a node's first heartbeat, and one never heard of is rented again
once its deadline passes. :func:`last_heartbeat` sends one more when the workload ended, so
the coordinator's node view shows its terminated state: bounded by
:data:`LAST_HEARTBEAT_TIMEOUT`, or :data:`UNHEARD_LAST_HEARTBEAT_TIMEOUT` while no heartbeat of
this run was acknowledged (``agent.heartbeat_acked``), since then it is the only word the
coordinator gets of the whole run.

Credentials: an ack carrying a rotated credential is adopted and saved in the state dir
(0600, atomically) before anything else. A 401 is not an outage: the node expired or was
deleted (or its credential was rotated away). The heartbeat loop then joins again
(:func:`rejoin`, with the join token and a proof of the key) and carries on with the new
identity; when that is impossible (no token, or the token is refused: used, expired,
revoked) it logs so once, sets ``agent.credential_revoked`` and both loops stop: the data
plane keeps its last config, but the coordinator will not take this node back without a
new join token. The watch loop leaves re-joining to the heartbeat loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from typing import Any, Protocol

from anex_agent.client import join_token
from anex_agent.agent.settings import AgentSettings
from anex_agent.agent.state import NodeIdentity, StateDir
from anex_agent.backoff import Backoff
from anex_agent.client.link import CoordinatorLink
from anex_agent.errors import AnexError, CoordinatorError
from anex_agent.telemetry.models import Telemetry
from anex_agent.wire.heartbeat import Heartbeat, TransportStatus
from anex_agent.wire.nodes import NodeConfig, NodeFacts, NodeJoinRequest
from anex_agent.wire.telemetry import parse_telemetry

log = logging.getLogger(__name__)


class Agent(Protocol):
    """What the loops use of the agent that runs them (:class:`anex_agent.agent.supervisor.Agent`)."""

    settings: AgentSettings
    state: StateDir
    link: CoordinatorLink
    identity: NodeIdentity | None
    facts: NodeFacts | None
    dataplane: Any  # anex_agent.agent.dataplane.DataPlane once started
    telemetry: Any  # anex_agent.gpu.monitor.TelemetryMonitor, or None
    workload: Any  # anex_agent.agent.workload.Workload under `run`, None under `daemon`
    last_transport: TransportStatus | None
    coordinator_reachable: bool | None
    credential_revoked: str | None
    heartbeat_acked: bool  # a heartbeat of this run was acknowledged by the coordinator
    ssh: Any  # anex_agent.remote.ssh_access.SshAccess, or None

    def note_reachable(self, ok: bool, error: str | None = None) -> None: ...

    async def apply_config(self, config: NodeConfig, *, gateways_changed: bool = False) -> None: ...


DEFAULT_INTERVAL = 10.0  # seconds, until the coordinator says otherwise
MIN_INTERVAL = 1.0
FIRST_SAMPLE_WAIT = 5.0  # seconds the first heartbeat waits for the first telemetry sample
MAX_BACKOFF = 60.0
LAST_HEARTBEAT_TIMEOUT = 2.0  # seconds the last heartbeat (the workload's end) may hold the exit
#: ...while the coordinator has acknowledged no heartbeat of this run (well inside the exit
#: deadline's margin, anex_agent.agent.stopping.STOP_MARGIN)
UNHEARD_LAST_HEARTBEAT_TIMEOUT = 6.0
FIRST_HEARTBEAT_TIMEOUT = 10.0  # the heartbeat sent as the workload starts (a task: it holds nothing)


def start_telemetry(state_dir: str, registry, options: Any = None) -> Any | None:
    """The GPU telemetry monitor of :mod:`anex_agent.gpu` with its collectors on ``registry``.

    None when that package cannot be used here (its import failed); a machine without a GPU
    still gets a monitor, whose telemetry says so.
    """
    try:
        from anex_agent.gpu.exposition import register_collectors
        from anex_agent.gpu.monitor import TelemetryMonitor
    except ImportError as err:
        log.info("GPU telemetry not available: %s", err)
        return None
    monitor = TelemetryMonitor(state_dir=state_dir)
    register_collectors(registry, monitor, options)
    return monitor


def telemetry_block(monitor: Any | None) -> Telemetry | None:
    """The heartbeat's telemetry block (cached by the monitor; never calls NVML), or None.

    Read as the wire model :class:`anex_agent.telemetry.models.Telemetry`, with the coordinator's
    rules (:func:`anex_agent.wire.telemetry.parse_telemetry`): a block the coordinator would refuse
    (NaN, a negative counter, a NUL or an over-long string, more than 64 GPUs, a value of
    the wrong type) is left out with a warning, so that the heartbeat itself still goes through."""
    if monitor is None:
        return None
    try:
        return parse_telemetry(monitor.telemetry())
    except Exception as err:  # telemetry must never stop heartbeats
        log.warning("GPU telemetry failed: %s", err)
        return None


def adopt_credential(agent: Agent, credential: str) -> None:
    """Use and keep a rotated credential (the previous one works only for a short grace)."""
    assert agent.identity is not None
    agent.identity = dataclasses.replace(agent.identity, credential=credential)
    agent.link.set_credential(credential)
    try:
        agent.state.save_identity(agent.identity)
    except OSError as err:  # keep going on the new credential; a restart then joins again
        log.error("cannot save the rotated node credential in %s: %s", agent.state.path, err)
        return
    log.info("node credential rotated")


async def rejoin(agent: Agent, refused: CoordinatorError) -> bool | None:
    """Join again after the coordinator refused our credential.

    True when joined (new identity saved, its config applied); None when the coordinator
    could not be reached (try again later); False when it is over: no join token, or the
    token was refused. Then ``agent.credential_revoked`` says why (and it was logged).
    """
    old = agent.identity.node_id if agent.identity else "?"
    token = agent.settings.join_token
    if not token:
        return _revoked(agent, f"the coordinator refused the credential of node {old} ({refused}) and no join token "
                               "is set to join again")
    assert agent.link.keypair is not None
    log.warning("the coordinator refused the credential of node %s (%s): the node expired or was removed; "
                "joining again", old, refused)
    request = NodeJoinRequest(token=token, public_key=agent.link.keypair.public_b64, name=agent.settings.name,
                              provider=agent.settings.provider, facts=agent.facts or NodeFacts())
    try:
        joined = await agent.link.join(request)
    except CoordinatorError as err:
        if err.retryable:
            log.warning("joining again failed (%s); will retry", err)
            return None
        refused = join_token.refusal(agent.settings.join_token_source, err)
        why = f"{refused}" if refused is not None else f"{err}; a new join token is needed"
        return _revoked(agent, f"the coordinator refused the credential of node {old} and joining again was "
                               f"refused too: {why}")
    agent.identity = NodeIdentity(agent.settings.coordinator_url, joined.node_id, joined.credential)
    agent.state.save_identity(agent.identity)
    agent.link.set_credential(joined.credential)
    log.info("joined again as node %s, mesh address %s", joined.node_id, joined.config.address)
    await agent.apply_config(joined.config)
    return True


def _revoked(agent: Agent, why: str) -> bool:
    agent.credential_revoked = why
    agent.note_reachable(False, why)
    log.error("%s; heartbeats and config updates stop (the data plane keeps its last config)", why)
    return False


async def heartbeat_of(agent: Agent) -> Heartbeat:
    """The heartbeat to send now: transport status, the workload's state, telemetry."""
    status = await agent.dataplane.transport_status()
    agent.last_transport = status
    if agent.workload is not None:
        status = status.model_copy(update={"workload": agent.workload.state})
    version = agent.dataplane.config.version if agent.dataplane.config else 0
    return Heartbeat(status=status, config_version=version, telemetry=telemetry_block(agent.telemetry))


def last_heartbeat_timeout(agent: Agent) -> float:
    """How long the last heartbeat may hold the exit (see the module docstring)."""
    return LAST_HEARTBEAT_TIMEOUT if agent.heartbeat_acked else UNHEARD_LAST_HEARTBEAT_TIMEOUT


async def last_heartbeat(agent: Agent, timeout: float | None = None) -> bool:
    """One more heartbeat before the agent exits, so that the coordinator learns the workload's
    end (terminated, exit code, finished_at); ``timeout`` s at most (default
    :func:`last_heartbeat_timeout`), so that a coordinator that is down or slow never holds the
    exit for long. True when it was acknowledged."""
    return await _one_heartbeat(agent, last_heartbeat_timeout(agent) if timeout is None else timeout, "last",
                                "exiting without it", "the coordinator knows the workload's end")


async def first_heartbeat(agent: Agent, timeout: float = FIRST_HEARTBEAT_TIMEOUT) -> bool:
    """One heartbeat as the workload starts, without waiting for telemetry (the heartbeat loop's
    first one waits for the first sample); True when it was acknowledged."""
    return await _one_heartbeat(agent, timeout, "first", "the heartbeat loop goes on",
                                "the coordinator knows the node is up")


async def _one_heartbeat(agent: Agent, timeout: float, which: str, otherwise: str, done: str) -> bool:
    if agent.identity is None or agent.dataplane is None or agent.credential_revoked:
        return False
    try:
        async with asyncio.timeout(timeout):
            await agent.link.heartbeat(agent.identity.node_id, await heartbeat_of(agent))
    except TimeoutError:
        log.warning("%s heartbeat: no answer from the coordinator within %g s; %s", which, timeout, otherwise)
        return False
    except AnexError as err:
        log.warning("%s heartbeat failed (%s); %s", which, err, otherwise)
        return False
    agent.heartbeat_acked = True
    log.info("%s heartbeat sent: %s", which, done)
    return True


async def pause(agent: Agent, interval: float) -> None:
    """Wait ``interval`` seconds before the next heartbeat, or less: until the workload's state
    changes (``agent.heartbeat_wanted``, set by its state tracker), but not sooner than
    :data:`MIN_INTERVAL` after the last one."""
    wanted = getattr(agent, "heartbeat_wanted", None)
    if wanted is None:
        await asyncio.sleep(interval)
        return
    await asyncio.sleep(min(MIN_INTERVAL, interval))
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.0, interval - MIN_INTERVAL)):
            await wanted.wait()
    wanted.clear()


async def heartbeat_loop(agent: Agent) -> None:
    backoff = Backoff(base=1.0, cap=MAX_BACKOFF)
    interval = DEFAULT_INTERVAL
    if agent.telemetry is not None:  # so that the first heartbeat already carries telemetry
        await agent.telemetry.wait_first_sample(FIRST_SAMPLE_WAIT)
    while True:
        assert agent.identity is not None and agent.dataplane is not None
        try:
            beat = await heartbeat_of(agent)
            version = beat.config_version
            ack = await agent.link.heartbeat(agent.identity.node_id, beat)
            agent.heartbeat_acked = True
            if ack.credential:
                adopt_credential(agent, ack.credential)
            if not agent.coordinator_reachable:
                log.info("coordinator reachable again")
            agent.note_reachable(True)
            backoff.reset()
            interval = max(MIN_INTERVAL, ack.next_heartbeat_in)
            if ack.config_version > version:
                config = await agent.link.get_config(agent.identity.node_id)
                await agent.apply_config(config)
            await pause(agent, interval)
        except CoordinatorError as err:
            if err.status == 401:
                joined = await rejoin(agent, err)
                if joined is False:
                    return
                if joined:
                    backoff.reset()
                    continue
            agent.note_reachable(False, str(err))
            delay = min(backoff.next_delay(), max(interval, MAX_BACKOFF))
            log.warning("heartbeat failed (%s); keeping the last good config, next try in %.1f s", err, delay)
            await asyncio.sleep(delay)
        except AnexError as err:  # applying a config failed: keep running, try again later
            log.error("applying the coordinator's config failed: %s", err)
            await asyncio.sleep(backoff.next_delay())


async def ssh_event(agent: Agent, event) -> None:
    """A revoked SSH certificate is refused at once; after a snapshot (revocations may have been
    missed) the full list is fetched again."""
    if event.type == "ssh_revoked" and event.ssh_revoked is not None:
        agent.ssh.revoke(event.ssh_revoked.serial, event.ssh_revoked.valid_before)
    elif event.type == "snapshot" and agent.ssh.node_id:
        try:
            await agent.ssh.refresh_revocations(agent.link.client)
        except CoordinatorError as err:
            log.warning("SSH: fetching revoked certificates failed (%s); the host certificate renewal fetches them", err)


async def watch_loop(agent: Agent) -> None:
    backoff = Backoff(base=1.0, cap=MAX_BACKOFF)
    while True:
        assert agent.dataplane is not None
        since = agent.dataplane.config.version if agent.dataplane.config else 0
        try:
            async with contextlib.aclosing(agent.link.watch(since)) as events:  # its connection closes with us
                async for event in events:
                    backoff.reset()
                    agent.note_reachable(True)
                    if event.config is not None and event.type in ("snapshot", "config", "gateway_changed"):
                        log.info("watch: %s event, config version %d", event.type, event.version)
                        await agent.apply_config(event.config, gateways_changed=event.type == "gateway_changed")
                    if getattr(agent, "ssh", None) is not None:
                        await ssh_event(agent, event)
            delay = backoff.next_delay()
            log.info("watch stream closed; reconnecting in %.1f s", delay)
        except CoordinatorError as err:
            if agent.credential_revoked:
                log.error("watch stream stops: %s", agent.credential_revoked)
                return
            delay = backoff.next_delay()
            if err.status == 401:  # the heartbeat loop joins again (or gives up); then we follow
                log.info("watch stream: credential refused; reconnecting in %.1f s", delay)
            else:
                agent.note_reachable(False, str(err))
                log.warning("watch stream failed (%s); reconnecting in %.1f s", err, delay)
        except AnexError as err:
            delay = backoff.next_delay()
            log.error("applying a watched config failed: %s; resyncing in %.1f s", err, delay)
        await asyncio.sleep(delay)
