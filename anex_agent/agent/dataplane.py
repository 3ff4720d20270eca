"""The node's data plane: engine + resolver + dialer + front-ends, driven by NodeConfig.

Owns, in start order: the WireGuard engine (chosen by ``ANEX_ENGINE`` or the auto
order), the resolver built from the config's DNS servers, the dialer the engine
gives, the ``GW_TUNNEL`` forwards (local + pushed) and the HTTP proxy. ``apply(config)``
is declarative and may be called on every config from the coordinator; ``stop()``
tears down in reverse order and leaves nothing of ours (the engine removes its
interface, routes and process).

Front-ends never see the engine: they hold the dialer, whose resolver is swapped when
the DNS config changes.

Engines that serve the front-ends themselves (``Engine.frontends == "engine"``: wireproxy)
get no proxy or forwards from us: their options (proxy address, a client tunnel per
``GW_TUNNEL_*`` and pushed tunnel, a server tunnel per ``ANEX_INBOUND_PORTS`` port, a
loopback health address) are rendered from the config by :mod:`.engine_frontends`, and a
changed config re-renders and restarts the engine; readiness is the engine's own verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
from typing import Any

from anex_agent.agent import engine_frontends
from anex_agent.agent.desired import desired_from_config, merge_tunnels
from anex_agent.agent.settings import AgentSettings
from anex_agent.errors import ConfigError, EngineError
from anex_agent.keys import KeyPair
from anex_agent.tunnels.base import Engine, EngineStatus, choose_engine, new_ifname
from anex_agent.wire import NodeConfig, TransportStatus

log = logging.getLogger(__name__)

#: A handshake older than this means the session is gone (whitepaper §6.1: REJECT_AFTER_TIME = 180 s).
READY_HANDSHAKE_AGE = 180.0
#: After a gateway change: re-add the gateway peers every RESET_RETRY s until a handshake, for up to RESET_WINDOW s.
RESET_RETRY = 1.0
#: At start-up, how long the workload waits for the first gateway handshake before it starts anyway.
FIRST_HANDSHAKE_WAIT = 20.0
RESET_WINDOW = 10.0


class DataPlane:
    def __init__(self, settings: AgentSettings, keypair: KeyPair, detect_report: dict[str, Any]) -> None:
        self.settings = settings
        self.keypair = keypair
        self.detect_report = detect_report
        self.engine_cls: type[Engine] | None = None
        self.engine: Engine | None = None
        self.config: NodeConfig | None = None
        self.path = "udp"
        self.dialer = None
        self.forwards = None
        self.proxy = None
        self._stack = contextlib.AsyncExitStack()

    def choose_engine(self) -> type[Engine]:
        if self.settings.path == "websocket":
            raise ConfigError("ANEX_PATH", "the websocket path is not available in this build yet; expected auto or udp")
        cls, tried = choose_engine(self.settings.engine, for_workload=True, source=self.settings.engine_source)
        self.detect_report.setdefault("engines", {n: s.to_dict() for n, s in tried.items()})
        if cls.frontends == "engine":
            engine_frontends.check_settings(self.settings)
        self.engine_cls = cls
        log.info("engine: %s (%s)", cls.name, tried[cls.name].reason)
        return cls

    @property
    def engine_serves_frontends(self) -> bool:
        """True when the engine runs the proxy and tunnels itself (wireproxy)."""
        return self.engine_cls is not None and self.engine_cls.frontends == "engine"

    @property
    def host_address(self) -> bool:
        """Whether the mesh address is an address of this host (an OS interface)."""
        return self.engine_cls is None or self.engine_cls.host_address

    # ---------------------------------------------------------------- lifecycle

    async def start(self, config: NodeConfig) -> None:
        """Engine up with ``config``, then resolver/dialer, then forwards and proxy."""
        from anex_agent.resolver import Resolver

        assert self.engine_cls is not None, "choose_engine() first"
        if self.engine_serves_frontends:
            health = f"127.0.0.1:{engine_frontends.free_loopback_port()}"
            self.engine = self.engine_cls(ifname=new_ifname("n"), state_dir=self.settings.state_dir,
                                          options=engine_frontends.wireproxy_options(config, self.settings, health))
        else:
            self.engine = self.engine_cls(ifname=new_ifname("n"))
        self._stack.push_async_callback(self.engine.stop)
        await self.engine.start()
        await self.engine.apply(desired_from_config(config, self.keypair.private))
        if self.engine_serves_frontends:
            self.config = config  # the engine serves the proxy, tunnels and inbound ports
            return
        self.dialer = self.engine.dialer(Resolver.from_node_config(config))
        if self.dialer is None:
            raise EngineError(f"engine {self.engine_cls.name} gives no dialer; it cannot serve the proxy and forwards")
        self.forwards = await self._stack.enter_async_context(_forward_manager(self.dialer))
        await self.forwards.apply(merge_tunnels(self.settings.tunnel_specs, config.tunnels))
        self.proxy = await self._stack.enter_async_context(_proxy(self.dialer, self.settings))
        self.config = config

    async def apply(self, config: NodeConfig) -> None:
        """Re-apply a newer config: engine (gateways, address, routes), DNS, pushed tunnels."""
        from anex_agent.resolver import Resolver

        assert self.engine is not None
        if self.engine_serves_frontends:
            # wireproxy has no live reconfiguration: new options -> new config text -> restart
            self.engine.set_options(engine_frontends.wireproxy_options(config, self.settings, self.engine.options.health_address))
            await self.engine.apply(desired_from_config(config, self.keypair.private))
            self.config = config
            log.info("applied config version %d (%d gateway(s), %d tunnel(s)) to %s", config.version,
                     len(config.gateways), len(self.tunnels()), self.engine_cls.name)
            return
        assert self.forwards is not None
        old = self.config
        await self.engine.apply(desired_from_config(config, self.keypair.private))
        if old is None or (old.dns, old.search_domains) != (config.dns, config.search_domains):
            self.dialer.resolver = Resolver.from_node_config(config)
        await self.forwards.apply(merge_tunnels(self.settings.tunnel_specs, config.tunnels))
        self.config = config
        log.info("applied config version %d (%d gateway(s), %d tunnel(s))", config.version, len(config.gateways), len(self.forwards.active))

    async def reset_gateway_sessions(self, *, within: float = RESET_WINDOW, every: float = RESET_RETRY) -> bool:
        """Drop and re-add the gateway peers until a fresh handshake completes (or ``within`` s pass).

        A gateway that restarted lost its sessions; our engine would keep sending on the
        old one until WireGuard's own timers give up (REKEY_TIMEOUT + KEEPALIVE_TIMEOUT,
        whitepaper §6.1/§6.5: about 15 s). Re-adding a peer (with its persistent
        keepalive) makes the engine send a handshake initiation at once; while the
        gateway's interface is still coming up that initiation may be lost, so it is
        repeated every ``every`` seconds instead of waiting REKEY_TIMEOUT (5 s) each time.
        Returns True when a handshake newer than the reset was seen.
        """
        assert self.engine is not None and self.config is not None
        desired = desired_from_config(self.config, self.keypair.private)
        if not desired.peers:
            return False
        if self.engine_serves_frontends:  # no peer-level control: a fresh process handshakes at once
            await self.engine.restart("a gateway changed (re-registered)")
            return False
        started = time.time()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await self.engine.apply(dataclasses.replace(desired, peers=()))
            await self.engine.apply(desired)
            retry_at = time.monotonic() + every
            while time.monotonic() < min(retry_at, deadline):
                await asyncio.sleep(0.1)
                status = await self.engine_status()
                if status and any(p.last_handshake and p.last_handshake >= started for p in status.peers):
                    log.info("gateway sessions reset: handshake after %.1f s", time.time() - started)
                    return True
        log.warning("gateway sessions reset, but no handshake within %.0f s; WireGuard keeps retrying", within)
        return False

    async def wait_handshake(self, timeout: float = FIRST_HANDSHAKE_WAIT) -> bool:
        """Wait until some gateway handshake completed (True), or ``timeout`` s passed (False).

        Used before starting the workload, so that its first request does not race the
        first handshake. The engines initiate at once (persistent keepalive), so on a healthy
        mesh this takes milliseconds; a gateway that is down costs at most ``timeout``.
        """
        deadline = time.monotonic() + timeout
        while True:
            transport = await self.transport_status()
            if transport.last_handshake_age is not None:
                return True
            if time.monotonic() >= deadline or not (self.config and self.config.gateways):
                return False
            await asyncio.sleep(0.05)

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
            last_handshake_age=max(0.0, round(min(ages), 3)) if ages else None,  # never negative (clock steps)
            rx_bytes=sum(p.rx_bytes for p in status.peers) if status else 0,
            tx_bytes=sum(p.tx_bytes for p in status.peers) if status else 0,
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
            "inbound_ports": list(self.settings.inbound_ports),
            **({"wireproxy": self._wireproxy_doc()} if self.engine_serves_frontends and self.engine else {}),
        }

    def tunnels(self) -> dict[int, str]:
        """Active forwards, local port -> target, whoever serves them (our forwards or the engine)."""
        if self.engine_serves_frontends and self.engine is not None:
            return {int(t.bind_address.rpartition(":")[2]): t.target for t in self.engine.options.client_tunnels}
        return dict(self.forwards.active) if self.forwards else {}

    def _wireproxy_doc(self) -> dict[str, Any]:
        engine = self.engine
        sup = engine.supervision
        return {"config": str(engine.config_path), "health_address": engine.options.health_address,
                "running": engine.running, "starts": sup.starts, "restarts": list(sup.restarts),
                "last_health": sup.last_health,
                "server_tunnels": [{"listen_port": t.listen_port, "target": t.target} for t in engine.options.server_tunnels]}

    def summary(self) -> str:
        config = self.config
        tunnels = ", ".join(f"127.0.0.1:{p}->{t}" for p, t in self.tunnels().items())
        return (
            f"engine={self.engine_cls.name if self.engine_cls else '?'} path={self.path} "
            f"address={config.address if config else '?'} proxy={self.settings.proxy_listen}"
            + (f" tunnels=[{tunnels}]" if tunnels else "")
        )


def _forward_manager(dialer):
    from anex_agent.frontends.forward import ForwardManager

    return ForwardManager(dialer)


def _proxy(dialer, settings: AgentSettings):
    """The HTTP proxy front-end (an async context manager that binds on entry)."""
    from anex_agent.frontends.proxy import ProxyServer

    return ProxyServer(dialer, host=settings.proxy_listen.host, port=settings.proxy_listen.port, auth=settings.proxy_auth)
