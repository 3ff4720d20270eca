"""The node's data plane: engine + endpoint policy + resolver + front-ends, driven by NodeConfig.

Owns, in start order: the WireGuard engine (chosen by ``ANEX_ENGINE`` or the auto
order; it starts while the datagram path is chosen, :mod:`.path`), the endpoint policy (peer endpoint names resolved to addresses, followed when
they move), the resolver built from the config's DNS servers, and what the engine asks
for to serve the workload: when it gives a dialer, the ``GW_TUNNEL`` forwards (local +
pushed), the HTTP proxy and, when ``ANEX_SOCKS_LISTEN`` is set, the SOCKS5 proxy over it; when it serves the workload itself (its dialer is
None), nothing more. ``apply(config)`` is declarative and may be called on every config
from the coordinator; it says whether anything changed. ``stop()`` tears down in reverse
order and leaves nothing of ours (the engine removes its interface, routes and process).

Every engine is treated the same, through the contract of
:class:`anex_agent.tunnels.engines.base.Engine` only: each ``apply()`` gives it the tunnel
(:class:`DesiredConfig`, endpoints as addresses) and what the workload is offered
(:class:`WorkloadConfig`, from :mod:`.engine_frontends`); status, readiness, session
resets and engine-specific report facts all come from the contract's methods.

Front-ends never see the engine: they hold the dialer, whose resolver is a
:class:`~anex_agent.net.resolver.ResolverSlot` that gets a new resolver when the DNS config changes.
The engine's dialer is wrapped in a :class:`~anex_agent.net.dialer.RedialDialer`: when a gateway
network moves to another peer (a failover, a gateway gone from the config), connection
attempts in flight start again at once instead of after their SYN's retransmission timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from anex_agent.agent import engine_frontends
from anex_agent.agent.desired import merge_tunnels
from anex_agent.agent.first_contact import FirstContact
from anex_agent.agent.liveness import DeadPeerWatch, assign
from anex_agent.agent.path import Counters, PathManager, path_settings
from anex_agent.agent.route_guard import RouteGuard
from anex_agent.agent.settings import AgentSettings
from anex_agent.net.datagram import DatagramDialer
from anex_agent.net.dialer import Dialer, RedialDialer, RouteChanges
from anex_agent.errors import EngineError
from anex_agent.wire.keys import KeyPair
from anex_agent.net.resolver import Resolver, ResolverSlot
from anex_agent.tasks import Tasks
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, WorkloadConfig
from anex_agent.tunnels.engines.ifnames import new_ifname
from anex_agent.tunnels.engines.registry import choose_engine
from anex_agent.tunnels.engines.status import EngineStatus
from anex_agent.tunnels.engines.endpoints import RESOLVE_INTERVAL, EndpointPolicy, Resolve, system_resolve
from anex_agent.wire.base import PATH_REASON_MAX
from anex_agent.wire.heartbeat import TransportStatus
from anex_agent.wire.nodes import NodeConfig

log = logging.getLogger(__name__)

#: A handshake older than this means the session is gone (whitepaper §6.1: REJECT_AFTER_TIME = 180 s).
READY_HANDSHAKE_AGE = 180.0
#: After a gateway change: re-add the gateway peers every RESET_RETRY s until a handshake, for up to RESET_WINDOW s.
RESET_RETRY = 1.0
#: At start-up, how long the workload waits for the first gateway handshake before it starts anyway.
FIRST_HANDSHAKE_WAIT = 20.0
RESET_WINDOW = 10.0
#: How often a wait for the first handshake looks at the engine's status (seconds).
HANDSHAKE_POLL = 0.05


class DataPlane:
    def __init__(self, settings: AgentSettings, keypair: KeyPair, detect_report: dict[str, Any], *,
                 endpoint_resolve: Resolve = system_resolve, resolve_interval: float = RESOLVE_INTERVAL) -> None:
        self.settings = settings
        self.keypair = keypair
        self.detect_report = detect_report
        self.engine_cls: type[Engine] | None = None
        self.engine: Engine | None = None
        self.config: NodeConfig | None = None
        self.paths = PathManager(path_settings(settings), keypair)
        self.liveness = DeadPeerWatch(after=settings.dead_peer_after)
        self.first_contact = FirstContact()  # gateways just named: extra initiations until they answer
        self._tasks: Tasks | None = None
        self._first_contact_task: asyncio.Task | None = None
        self.endpoints = EndpointPolicy(endpoint_resolve)
        self.resolve_interval = resolve_interval
        self.resolver = ResolverSlot()
        self.dialer: Dialer | None = None
        self.route_changes = RouteChanges()  # a gateway network moved: dials in flight start again
        self.forwards = None
        self.proxy = None
        self.socks = None  # the SOCKS5 proxy, when ANEX_SOCKS_LISTEN turned it on
        self._desired: DesiredConfig | None = None  # as last applied (endpoints resolved)
        self._workload: WorkloadConfig | None = None
        self._demoted: frozenset[str] = frozenset()  # gateways whose traffic the others carry (dead-peer watch)
        self._lock = asyncio.Lock()  # one engine apply at a time (config changes, endpoint moves, resets)
        self._has_gateway = asyncio.Event()  # set while the config names a gateway (start() and apply())
        self._stack = contextlib.AsyncExitStack()
        self.route_guard = RouteGuard(settings.coordinator_url)  # gateway routes never cover the coordinator

    @property
    def path(self) -> str:
        """The datagram path in use: ``udp``, ``websocket`` or ``none`` (see :mod:`anex_agent.agent.path`)."""
        return self.paths.current()

    def choose_engine(self) -> type[Engine]:
        cls, tried = choose_engine(self.settings.engine, for_workload=True, source=self.settings.engine_source)
        self.detect_report.setdefault("engines", {n: s.to_dict() for n, s in tried.items()})
        engine_frontends.check_settings(self.settings, cls)
        self.engine_cls = cls
        log.info("engine: %s (%s)", cls.name, tried[cls.name].reason)
        return cls

    @property
    def host_address(self) -> bool:
        """Whether the mesh address is an address of this host (an OS interface)."""
        return self.engine_cls is None or self.engine_cls.host_address

    # ---------------------------------------------------------------- lifecycle

    async def start(self, config: NodeConfig, tasks: Tasks) -> None:
        """Engine up with ``config``, then the front-ends it asks for; the endpoint follower in ``tasks``."""
        assert self.engine_cls is not None, "choose_engine() first"
        self._tasks = tasks
        # an engine that takes a Bind gets the path's (UDP and the relays, switched inside); the
        # others own their UDP socket and are steered through their peer endpoints
        extra = {"bind_factory": self.paths.bind_factory(tasks)} if self.engine_cls.takes_bind else {}
        self.engine = self.engine_cls(ifname=new_ifname("n"), state_dir=self.settings.state_dir, **extra)
        self._stack.push_async_callback(self.engine.stop)
        self._stack.push_async_callback(self.paths.close)
        self.resolver.use(Resolver.from_node_config(config))
        desired = await self._resolved(config)
        # The engine starting (a process, a device; no peer yet, so nothing sent) and the
        # path probe (its own socket) do not depend on each other: side by side.
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self.engine.start(tasks), name="engine-start")
                group.create_task(self.paths.choose_initial(desired, config, tasks), name="path-choice")
        except BaseExceptionGroup as failed:
            raise failed.exceptions[0] from None  # the engine's (or the path's) own error, as before
        await self._apply_engine(config)
        dialer = self.engine.dialer(self.resolver)
        self.dialer = RedialDialer(dialer, self.route_changes) if dialer is not None else None
        if self.dialer is not None:  # the engine gives a dialer: our proxy and forwards serve the workload
            self.forwards = await self._stack.enter_async_context(_forward_manager(self.dialer, self.settings))
            await self.forwards.apply(merge_tunnels(self.settings.tunnel_specs, config.tunnels))
            self.proxy = await self._stack.enter_async_context(_proxy(self.dialer, self.settings))
            if self.settings.socks_listen is not None:
                datagrams = self.engine.datagram_dialer(self.resolver)  # UDP ASSOCIATE, when the engine carries UDP
                self.socks = await self._stack.enter_async_context(_socks(self.dialer, datagrams, self.settings))
        self._set_config(config)
        tasks.spawn("endpoint-follow", lambda: self.endpoints.follow(self._reapply, self.resolve_interval))
        tasks.spawn("path-watch", lambda: self.paths.watch(self._counters, self._reapply, self.reset_gateway_sessions,
                                                            self._nudge))
        tasks.spawn("dead-peer-watch", lambda: self.liveness.run(
            self._gateway_counters, lambda within: self.reset_gateway_sessions(within=within, every=within),
            self._steer))

    async def apply(self, config: NodeConfig) -> bool:
        """Re-apply a newer config: engine (gateways, address, routes, workload), DNS, forwards.

        Returns True when anything changed (False: all of it already matched)."""
        assert self.engine is not None
        old = self.config
        changed = await self._apply_engine(config)
        if old is None or (old.dns, old.search_domains) != (config.dns, config.search_domains):
            self.resolver.use(self._resolver_for(config))
            changed = True
        if self.forwards is not None:
            before = dict(self.forwards.active)
            await self.forwards.apply(merge_tunnels(self.settings.tunnel_specs, config.tunnels))
            changed |= dict(self.forwards.active) != before
        self._set_config(config)
        log.info("applied config version %d (%d gateway(s), %d tunnel(s)) to %s%s", config.version,
                 len(config.gateways), len(self.tunnels()), self.engine.name, "" if changed else ": nothing changed")
        return changed

    async def _apply_engine(self, config: NodeConfig) -> bool:
        """The engine's part of ``config``: the tunnel with endpoint names resolved, and the workload."""
        assert self.engine is not None
        async with self._lock:
            desired = assign(await self.paths.route(await self._resolved(config), config), self._demoted)
            workload = engine_frontends.workload_config(config, self.settings)
            changed = await self.engine.apply(desired, workload)
            before, self._desired, self._workload = self._desired, desired, workload
            if before is not None and _routes(before) != _routes(desired):
                self.route_changes.moved()
        had = {p.public_key for p in before.peers} if before is not None else set()
        self._first_handshakes([p.public_key for p in desired.peers if p.public_key not in had])
        return changed

    def _first_handshakes(self, keys: list[str]) -> None:
        """Gateways just named: extra initiations until each answers (:mod:`.first_contact`)."""
        if not self.first_contact.add(keys) or self._tasks is None:
            return
        if self._first_contact_task is None or self._first_contact_task.done():
            self._first_contact_task = self._tasks.spawn("first-handshake", lambda: self.first_contact.run(
                self._handshaken, self._handshake_now, asyncio.sleep, self.route_changes.moved))

    async def _handshaken(self) -> set[str]:
        status = await self.engine_status()
        return {p.public_key for p in (status.peers if status else ()) if p.last_handshake}

    async def _handshake_now(self, keys: frozenset[str]) -> None:
        if self.engine is None or self._desired is None:
            return
        async with self._lock:
            try:
                await self.engine.handshake_now(self._desired, keys)
            except EngineError as err:
                log.warning("could not ask the engine for a new handshake: %s", err)

    async def _resolved(self, config: NodeConfig) -> DesiredConfig:
        """The tunnel of ``config``: refused routes left out, endpoint names resolved (UDP endpoints)."""
        return await self.endpoints.resolve(await self.route_guard.desired(config, self.keypair.private))

    async def _counters(self) -> Counters:
        transport = await self.transport_status()
        return Counters(transport.rx_bytes, transport.tx_bytes, transport.last_handshake_age)

    async def _gateway_counters(self) -> dict[str, Counters]:
        """Each gateway peer's counters (the dead-peer watch's signal)."""
        status = await self.engine_status()
        now = time.time()
        return {p.public_key: Counters(p.rx_bytes, p.tx_bytes,
                                       None if not p.last_handshake else max(0.0, now - p.last_handshake))
                for p in (status.peers if status else ())}

    async def _steer(self, demoted: frozenset[str]) -> bool:
        """Move the traffic of the ``demoted`` gateways to the others (see :func:`liveness.assign`).

        The other gateways keep their sessions (one handshook lately; WireGuard rekeys by itself
        when a session is old): re-adding them would drop what is queued for them and cost a
        handshake. The demoted ones are re-added (dropped, then added again with their own
        address only), so they start handshaking at once, and keep at it, until they answer:
        the dead-peer watch then gives their traffic back. True when a gateway that takes
        traffic has a session (a handshake within READY_HANDSHAKE_AGE s)."""
        if self.engine is None or self.config is None:
            return False
        async with self._lock:
            self._demoted = demoted
            self.resolver.use(self._resolver_for(self.config))
            desired = assign(await self.paths.route(await self._resolved(self.config), self.config), demoted)
            if demoted:
                others = tuple(p for p in desired.peers if p.public_key not in demoted)
                await self.engine.apply(dataclasses.replace(desired, peers=others), self._workload)
            await self.engine.apply(desired, self._workload)
            self._desired = desired
        self.route_changes.moved()  # SYNs lost to the silent gateway go again now, not after their RTO
        ages = await self._gateway_counters()
        return any(c.handshake_age is not None and c.handshake_age <= READY_HANDSHAKE_AGE
                   for key, c in ages.items() if key not in demoted)

    def _resolver_for(self, config: NodeConfig) -> Resolver:
        """The config's resolver, the DNS servers of the gateways whose traffic others carry asked
        last (a query to a silent one costs a whole attempt, 1.7 s, before the next server)."""
        silent = {gw.mesh_address for gw in config.gateways if gw.public_key in self._demoted}
        dns = sorted(config.dns, key=lambda server: server in silent)  # stable: the config's order otherwise
        return Resolver.from_node_config(config.model_copy(update={"dns": dns}) if dns != config.dns else config)

    async def _nudge(self) -> None:
        """Make the engine send a keepalive to each gateway now (:meth:`Engine.send_keepalive`): after
        a UDP probe the hub answers the probe's socket until the engine's next datagram reaches it."""
        if self.engine is None or self.config is None:
            return
        await self.engine.send_keepalive([gw.public_key for gw in self.config.gateways])

    async def _reapply(self) -> None:
        """Apply the current config again (an endpoint name moved: the policy resolves it anew)."""
        if self.config is not None:
            await self._apply_engine(self.config)

    async def serve_on_mesh(self, port: int, protocol_factory) -> bool:
        """Have the engine serve ``port`` of the mesh address (see :meth:`Engine.serve_on_mesh`)."""
        return self.engine is not None and await self.engine.serve_on_mesh(port, protocol_factory)

    async def reset_gateway_sessions(self, *, within: float = RESET_WINDOW, every: float = RESET_RETRY) -> bool:
        """Fresh handshakes with the gateways now (see :meth:`Engine.reset_sessions`).

        A gateway that restarted lost its sessions; our engine would keep sending on the
        old one until WireGuard's own timers give up (REKEY_TIMEOUT + KEEPALIVE_TIMEOUT,
        whitepaper §6.1/§6.5: about 15 s). Returns True when a handshake newer than the
        reset was seen.
        """
        assert self.engine is not None and self._desired is not None
        async with self._lock:
            return await self.engine.reset_sessions(self._desired, within=within, every=every)

    def _set_config(self, config: NodeConfig) -> None:
        self.config = config
        if config.gateways:
            self._has_gateway.set()
        else:
            self._has_gateway.clear()

    async def wait_handshake(self, timeout: float = FIRST_HANDSHAKE_WAIT) -> bool:
        """Wait until some gateway handshake completed (True), or ``timeout`` s passed (False).

        Used before starting the workload, so that its first request does not race the
        first handshake. The engines initiate at once (persistent keepalive), so on a healthy
        mesh this takes milliseconds; a gateway that is down costs at most ``timeout``. With
        no gateway in the config it returns False at once (nothing to wait for yet).
        """
        if not (self.config and self.config.gateways):
            return False
        try:
            async with asyncio.timeout(timeout):
                await self.handshake()
        except TimeoutError:
            return False
        return True

    async def handshake(self) -> None:
        """Return once some gateway handshake completed, however long that takes.

        Never busy: while the config names no gateway it waits for a config that does (set by
        :meth:`start` / :meth:`apply`), and between looks at the engine's status it sleeps
        :data:`HANDSHAKE_POLL` s, so the event loop (heartbeats, the watch, the API, signals)
        runs meanwhile whatever the engine's ``status()`` does."""
        while True:
            await self._has_gateway.wait()
            if (await self.transport_status()).last_handshake_age is not None:
                return
            await asyncio.sleep(HANDSHAKE_POLL)

    async def stop(self) -> None:
        await self._stack.aclose()

    # ---------------------------------------------------------------- reports

    async def engine_status(self) -> EngineStatus | None:
        if self.engine is None:
            return None
        try:
            return await self.engine.status()
        except EngineError as err:
            log.warning("engine status failed: %s", err)
            return None

    async def transport_status(self) -> TransportStatus:
        status = await self.engine_status()
        ages = [time.time() - p.last_handshake for p in (status.peers if status else ()) if p.last_handshake]
        return TransportStatus(
            engine=self.engine_cls.name if self.engine_cls else "",
            path=self.path,
            path_reason=self.paths.current_reason()[:PATH_REASON_MAX],
            last_handshake_age=max(0.0, round(min(ages), 3)) if ages else None,  # never negative (clock steps)
            rx_bytes=sum(p.rx_bytes for p in status.peers) if status else 0,
            tx_bytes=sum(p.tx_bytes for p in status.peers) if status else 0,
            dead_peer=self.liveness.last()[:PATH_REASON_MAX],
        )

    async def ready(self) -> tuple[bool, str]:
        if self.engine is not None:
            verdict = await self.engine.readiness()
            if verdict is not None:
                return verdict
        transport = await self.transport_status()
        age = transport.last_handshake_age
        if age is None:
            return False, "no WireGuard handshake with a gateway yet"
        if age > READY_HANDSHAKE_AGE:
            return False, f"last handshake {age:.0f} s ago (older than {READY_HANDSHAKE_AGE:.0f} s)"
        return True, f"handshake {age:.0f} s ago"

    async def status_doc(self) -> dict[str, Any]:
        status = await self.engine_status()
        transport = await self.transport_status()
        config = self.config
        return {
            "engine": transport.engine,
            "path": transport.path,
            "path_choice": self.paths.report(),
            "dead_peer": self.liveness.report(),
            "interface": status.interface if status else None,
            "detect": self.detect_report,
            "address": config.address if config else None,
            "config_version": config.version if config else None,
            "last_handshake_age": transport.last_handshake_age,
            "rx_bytes": transport.rx_bytes,
            "tx_bytes": transport.tx_bytes,
            "peers": [p.to_dict() for p in status.peers] if status else [],
            "gateways": [g.model_dump() for g in config.gateways] if config else [],
            "tunnels": [{"listen_port": p, "target": t} for p, t in self.tunnels().items()],
            "proxy": str(self.settings.proxy_listen),
            "socks": str(self.settings.socks_listen) if self.settings.socks_listen is not None else None,
            "inbound_ports": list(self.settings.inbound_ports),
            "inbound_udp_ports": list(self.settings.inbound_udp_ports),
            "endpoints": self.endpoints.current,
            **self._engine_report(),
        }

    def _engine_report(self) -> dict[str, Any]:
        details = self.engine.report() if self.engine is not None else {}
        return {self.engine.name: details} if details else {}

    def tunnels(self) -> dict[int, str]:
        """Active forwards, local port -> target, whoever serves them (our forwards or the engine)."""
        if self.forwards is not None:
            return dict(self.forwards.active)
        return self._workload.tunnels() if self._workload is not None else {}

    def summary(self) -> str:
        config = self.config
        tunnels = ", ".join(f"127.0.0.1:{p}->{t}" for p, t in self.tunnels().items())
        return (
            f"engine={self.engine_cls.name if self.engine_cls else '?'} path={self.path} "
            f"address={config.address if config else '?'} proxy={self.settings.proxy_listen}"
            + (f" socks={self.settings.socks_listen}" if self.settings.socks_listen is not None else "")
            + (f" tunnels=[{tunnels}]" if tunnels else "")
        )


def _routes(desired: DesiredConfig) -> dict[str, frozenset[str]]:
    """Which gateway peer holds which networks."""
    return {p.public_key: p.allowed_set() for p in desired.peers}


def _forward_manager(dialer: Dialer, settings: AgentSettings):
    from anex_agent.frontends.forward import ForwardManager

    return ForwardManager(dialer, max_connections=settings.forward_max_connections)


def _proxy(dialer: Dialer, settings: AgentSettings):
    """The HTTP proxy front-end (an async context manager that binds on entry)."""
    from anex_agent.frontends.proxy import ProxyServer

    return ProxyServer(dialer, host=settings.proxy_listen.host, port=settings.proxy_listen.port, auth=settings.proxy_auth,
                       max_connections=settings.proxy_max_connections)


def _socks(dialer: Dialer, datagrams: DatagramDialer | None, settings: AgentSettings):
    """The SOCKS5 proxy front-end (an async context manager that binds on entry); UDP ASSOCIATE through ``datagrams``."""
    from anex_agent.frontends.socks5 import Socks5Server

    assert settings.socks_listen is not None
    return Socks5Server(dialer, host=settings.socks_listen.host, port=settings.socks_listen.port, auth=settings.socks_auth,
                        max_connections=settings.proxy_max_connections, datagrams=datagrams)
