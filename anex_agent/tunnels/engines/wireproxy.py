"""The external wireproxy engine: the engine contract around a supervised ``wireproxy`` process.

wireproxy (windtf/wireproxy v1.1, a Go program: wireguard-go + gVisor netstack) owns its
own HTTP proxy and TCP tunnels, so this engine serves the workload itself
(``frontends = "engine"``, ``dialer()`` is None): ``apply(desired, workload)`` renders
the tunnel and the :class:`~anex_agent.tunnels.engines.config.WorkloadConfig` into one config and,
as wireproxy has no live reconfiguration, restarts the process when the text changed.

By concern:

* :mod:`.wireproxy_config` -- options, validation, the config text (pure);
* :mod:`.wireproxy_metrics` -- ``/metrics`` (a UAPI dump) into peer status (pure);
* :mod:`.wireproxy_process` -- the child process, its 0600 config file, health checks
  over HTTP and restarts;
* this module -- the contract: readiness is wireproxy's ``/readyz``, status its
  ``/metrics``, a session reset is a restart, ``report()`` what the supervisor did.

Endpoint names: the agent gives IP literals and follows names itself
(:mod:`anex_agent.tunnels.engines.endpoints`); a name given here is rendered as it is and
wireproxy resolves it once, when it reads its config.
What this module cannot check without the real binary is listed in docs/userspace-wireguard.md.
"""

from __future__ import annotations

import asyncio
import logging
import shutil
import tempfile
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anex_agent.errors import ConfigError, EngineError
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, WorkloadConfig
from anex_agent.tunnels.engines.status import EngineStatus, Support
from anex_agent.tunnels.engines.wireproxy_config import (
    CHECK_ALIVE_INTERVAL,
    ClientTunnel,
    ServerTunnel,
    WireproxyOptions,
    render_config,
)
from anex_agent.tunnels.engines.wireproxy_metrics import parse_metrics
from anex_agent.tunnels.engines.wireproxy_process import Supervision, WireproxyProcess, free_loopback_port, write_config

if TYPE_CHECKING:
    from anex_agent.net.dialer import NameResolver
    from anex_agent.tasks import Tasks

__all__ = ["BINARY", "ClientTunnel", "ServerTunnel", "Supervision", "WireproxyEngine", "WireproxyOptions",
           "parse_metrics", "render_config", "write_config"]

log = logging.getLogger(__name__)

BINARY = "wireproxy"


class WireproxyEngine(Engine):
    """wireproxy as a supervised child process."""

    name = "wireproxy"
    frontends = "engine"  # wireproxy owns the HTTP proxy, the client and the server tunnels
    host_address = False  # no OS interface: the mesh address lives inside wireproxy

    def __init__(self, *, ifname: str | None = None, state_dir: Path | None = None, binary: str = BINARY,
                 health_address: str | None = None, health_interval: float = 5.0,
                 failures_before_restart: int = 3, start_grace: float | None = None) -> None:
        """``health_address``: where wireproxy serves ``/readyz`` and ``/metrics`` (loopback;
        default: a free port on 127.0.0.1, chosen at the first apply and kept)."""
        self.ifname = ifname  # no OS interface: accepted and ignored
        self.binary = binary
        self.state_dir = Path(state_dir) if state_dir else None
        self.health_interval = health_interval
        self.failures_before_restart = failures_before_restart
        # /readyz is 503 until the first pong: failures of a fresh process count only after
        # its first 200 or after start_grace seconds.
        self.start_grace = start_grace if start_grace is not None else 2 * CHECK_ALIVE_INTERVAL + 10
        self._health_address = health_address
        self._workload = WorkloadConfig()
        self._tasks: Tasks | None = None
        self._supervisor = None
        self._process: WireproxyProcess | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None

    def __repr__(self) -> str:
        return f"WireproxyEngine(binary={self.binary!r}, running={self.running})"

    @classmethod
    def is_supported(cls, binary: str = BINARY) -> Support:
        path = shutil.which(binary)
        if path is None:
            return Support(False, f"no {binary!r} on PATH (external engine: install windtf/wireproxy v1.1 to use it)")
        return Support(True, f"{path} (external wireproxy: owns its own proxy and tunnels)")

    @classmethod
    def workload_support(cls) -> Support:
        return Support(True, "wireproxy serves the HTTP proxy, the GW_TUNNEL tunnels and inbound ports itself")

    @classmethod
    def check_workload(cls, workload: WorkloadConfig) -> None:
        if workload.proxy_auth:
            raise ConfigError("proxy_auth", "is not supported with the wireproxy engine (its proxy is served by "
                                            "wireproxy, without credentials); unset it or use another engine")
        if workload.socks_auth:
            raise ConfigError("socks_auth", "is not supported with the wireproxy engine (its SOCKS5 proxy is served "
                                            "by wireproxy, without credentials); unset it or use another engine")

    # ---------------------------------------------------------------- views (reports and tests)

    @property
    def options(self) -> WireproxyOptions:
        """The options the next config is rendered with."""
        return WireproxyOptions.from_workload(self._workload, health_address=self._health())

    @property
    def config_path(self) -> Path:
        if self.state_dir is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="anex-wireproxy-")
            self.state_dir = Path(self._tmpdir.name)
        return self.state_dir / "wireproxy.conf"

    @property
    def supervision(self) -> Supervision:
        return self._proc().supervision

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.running

    # ---------------------------------------------------------------- the contract

    async def start(self, tasks: Tasks) -> None:
        """Nothing runs before the first apply() (the config carries the key); the supervisor will run in ``tasks``."""
        self._tasks = tasks

    async def apply(self, desired: DesiredConfig, workload: WorkloadConfig | None = None) -> bool:
        """Render ``desired`` + ``workload`` and (re)start wireproxy when the text changed; True when it did.

        With no peer (no gateway registered yet) nothing runs; the first config with one starts it."""
        if self._tasks is None:
            raise EngineError("the wireproxy engine was not started: call start(tasks) first")
        if workload is not None:
            self.check_workload(workload)
            if workload.inbound_udp_ports and workload.inbound_udp_ports != self._workload.inbound_udp_ports:
                log.warning("inbound UDP ports %s are not served: wireproxy relays inbound TCP only; use the "
                            "built-in userspace engine (ANEX_ENGINE=userspace) for UDP",
                            ",".join(f"{p}/udp" for p in workload.inbound_udp_ports))
            self._workload = workload
        if not desired.peers:  # no gateway registered yet (or none left): wireproxy cannot run without one
            if self._process is None or not self._process.wanted:
                return False
            await self._process.stop()
            log.info("wireproxy stopped: no gateway in the config; it starts again once one registers")
            return True
        text = render_config(desired, self.options)
        changed = await self._proc().ensure(text)
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = self._tasks.spawn("wireproxy-supervisor", self._proc().supervise)
        return changed

    async def handshake_now(self, desired: DesiredConfig, keys: Collection[str]) -> bool:
        """No peer-level control, and a restart per ask would cost more than it saves: False
        (wireproxy retries on its own, every REKEY_TIMEOUT)."""
        return False

    async def reset_sessions(self, desired: DesiredConfig, *, within: float = 10.0, every: float = 1.0) -> bool:
        """No peer-level control: restart the process (a fresh one handshakes at once). Returns False (not awaited)."""
        await self._proc().restart("a gateway changed (re-registered)")
        return False

    async def readiness(self) -> tuple[bool, str]:
        """wireproxy's own verdict: ``/readyz`` on the health address (200 once CheckAlive got a pong)."""
        if not self.running:
            return False, "wireproxy is not running"
        answer = await self._proc().get("/readyz", timeout=2.0)
        if answer is None:
            return False, "wireproxy /readyz did not answer"
        if answer[0] == 200:
            return True, "wireproxy /readyz: 200"
        return False, f"wireproxy /readyz: HTTP {answer[0]} (no recent pong from the gateway)"

    async def status(self) -> EngineStatus:
        if not self.running:
            return EngineStatus(self.name, None, 0, False)
        answer = await self._proc().get("/metrics", timeout=5.0)
        if answer is None or answer[0] != 200:
            return EngineStatus(self.name, None, 0, True)
        port, peers = parse_metrics(answer[1])
        return EngineStatus(self.name, None, port, True, peers)

    def report(self) -> dict[str, Any]:
        sup = self.supervision
        options = self.options
        return {"config": str(self.config_path), "health_address": options.health_address,
                "running": self.running, "starts": sup.starts, "restarts": list(sup.restarts),
                "last_health": sup.last_health,
                "server_tunnels": [{"listen_port": t.listen_port, "target": t.target} for t in options.server_tunnels]}

    def dialer(self, resolver: NameResolver | None = None) -> None:
        """None: wireproxy serves the proxy and the tunnels itself; the agent's front-ends stay off."""
        return None

    async def stop(self) -> None:
        task, self._supervisor = self._supervisor, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=10.0)  # never hang a shutdown on it
        if self._process is not None:
            await self._process.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self.state_dir = None

    # ---------------------------------------------------------------- internals

    def _health(self) -> str:
        if self._health_address is None:
            self._health_address = f"127.0.0.1:{free_loopback_port()}"
        return self._health_address

    def _proc(self) -> WireproxyProcess:
        if self._process is None:
            self._process = WireproxyProcess(
                binary=self.binary, config_path=self.config_path, health_address=self._health(),
                health_interval=self.health_interval, failures_before_restart=self.failures_before_restart,
                start_grace=self.start_grace)
        return self._process
