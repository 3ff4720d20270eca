"""The node's guard on gateway routes: the coordinator's address is never routed into the mesh.

:class:`RouteGuard` sits between a :class:`~anex_agent.wire.nodes.NodeConfig` and the engine:
:meth:`RouteGuard.desired` resolves the coordinator's host (the addresses this node
reaches it at), hands them to the pure :func:`~anex_agent.agent.desired.desired_from_config`
as protected addresses, and logs each refused route once (again only when the set of
refusals changes), so the rest of the config is applied and the operator sees why a
route is missing.

Resolution failures keep the addresses resolved before (fail static); with none ever
resolved, only the coordinator-address check is skipped, with a warning, and the other
checks (allowed networks, gateway endpoints, default route) still apply.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
from urllib.parse import urlsplit

from anex_agent.agent.desired import RefusedRoute, admit_routes, desired_from_config
from anex_agent.tunnels.engines.config import DesiredConfig
from anex_agent.wire.nodes import NodeConfig

log = logging.getLogger(__name__)

RESOLVE_TIMEOUT = 3.0


class RouteGuard:
    def __init__(self, coordinator_url: str, *, resolve_timeout: float = RESOLVE_TIMEOUT) -> None:
        parts = urlsplit(coordinator_url or "")
        self.host = parts.hostname or ""
        try:
            self.port = parts.port or (443 if parts.scheme == "https" else 80)
        except ValueError:
            self.port = 80
        self.resolve_timeout = resolve_timeout
        self.protected: tuple[str, ...] = ()
        self._logged: tuple[RefusedRoute, ...] = ()

    async def refresh(self) -> tuple[str, ...]:
        """Resolve the coordinator's host into :attr:`protected`; keep the old set on failure."""
        if not self.host:
            return self.protected
        try:
            self.protected = (str(ipaddress.ip_address(self.host)),)
            return self.protected
        except ValueError:
            pass
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.resolve_timeout):
                infos = await loop.getaddrinfo(self.host, self.port, type=socket.SOCK_STREAM)
        except (OSError, TimeoutError) as err:
            if not self.protected:
                log.warning("cannot resolve the coordinator host %s (%s): routes covering its address cannot be "
                            "refused until it resolves", self.host, err or "no answer in time")
            return self.protected
        addresses = {str(ipaddress.ip_address(info[4][0].split("%")[0])) for info in infos}
        self.protected = tuple(sorted(addresses))
        return self.protected

    async def desired(self, config: NodeConfig, private_key: bytes) -> DesiredConfig:
        """The engine config for ``config``, with refused gateway routes left out (and logged)."""
        await self.refresh()
        _, refused = admit_routes(config, self.protected)
        if refused != self._logged:
            for item in refused:
                log.warning("%s; the rest of the config is applied", item)
            self._logged = refused
        return desired_from_config(config, private_key, self.protected)
