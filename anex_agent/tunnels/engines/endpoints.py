"""Peer endpoints given as host names: one resolution policy for every engine.

A gateway's endpoint may be a name (``gw.example.com:51820``). The engines take IP
literals: the data plane resolves names with :meth:`EndpointPolicy.resolve` before every
``apply()``, and :meth:`EndpointPolicy.follow` (one loop, above the engines) looks the
names up again every ``interval`` seconds and re-applies the declarative config when one
resolves differently, so a gateway that moves is followed whatever the engine.

The policy:

* a name resolves to the address it had as long as that address is still among the
  answers (round-robin DNS does not make the peer hop); otherwise to the first answer,
  IPv4 first;
* the first resolution of a name that fails raises :class:`EngineError` (the config
  cannot be applied); a later failure keeps the last good address (DNS trouble is no
  reason to drop a working tunnel);
* IP literals are used as they are.

Engines used on their own (tests, the interop drivers) may still be given names; they
resolve them once with :func:`resolve_once`.

One resolver signature everywhere: :data:`Resolve` ``(host, port) -> [address, ...]``,
raising ``OSError`` when the name does not resolve.
"""

from __future__ import annotations

import asyncio
import dataclasses
import ipaddress
import logging
import socket
from collections.abc import Awaitable, Callable

from anex_agent.errors import EngineError
from anex_agent.tunnels.engines.config import DesiredConfig
from anex_agent.tunnels.os.netconf import join_host_port, split_host_port

log = logging.getLogger(__name__)

#: How often the data plane looks the endpoint names up again (seconds).
RESOLVE_INTERVAL = 30.0

Resolve = Callable[[str, int], Awaitable[list[str]]]


async def system_resolve(host: str, port: int) -> list[str]:
    """Addresses of ``host`` from the system resolver (getaddrinfo), IPv4 first; OSError when it fails."""
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    addresses = list(dict.fromkeys(info[4][0] for info in infos))
    addresses.sort(key=lambda a: ":" in a)
    return addresses


def _literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def _split(endpoint: str) -> tuple[str, int]:
    try:
        return split_host_port(endpoint)
    except ValueError as err:
        raise EngineError(f"peer endpoint {endpoint!r} is not HOST:PORT") from err


async def resolve_once(desired: DesiredConfig, resolve: Resolve = system_resolve) -> DesiredConfig:
    """``desired`` with every endpoint name replaced by its first address (EngineError when one fails)."""
    return await EndpointPolicy(resolve).resolve(desired)


class EndpointPolicy:
    """Resolves endpoint names for the engines and notices when one moves. See the module docstring."""

    def __init__(self, resolve: Resolve = system_resolve) -> None:
        self._resolve = resolve
        self._current: dict[str, str] = {}  # endpoint as given -> address it resolved to
        self._names: tuple[str, ...] = ()  # endpoint names of the last resolved config

    @property
    def current(self) -> dict[str, str]:
        """Endpoint name -> the address in use (for reports)."""
        return {name: self._current[name] for name in self._names if name in self._current}

    async def resolve(self, desired: DesiredConfig) -> DesiredConfig:
        """``desired`` with endpoint names replaced by IP literals, by the policy above."""
        peers = []
        names = []
        for peer in desired.peers:
            if peer.endpoint is None:
                peers.append(peer)
                continue
            host, port = _split(peer.endpoint)
            if _literal(host):
                peers.append(peer)
                continue
            names.append(peer.endpoint)
            address = await self._lookup(peer.endpoint, host, port)
            if address is None:
                address = self._current.get(peer.endpoint)
                if address is None:
                    raise EngineError(f"cannot resolve peer endpoint {peer.endpoint!r}")
                log.info("peer endpoint %s: keeping %s (the name does not resolve now)", peer.endpoint, address)
            self._current[peer.endpoint] = address
            peers.append(dataclasses.replace(peer, endpoint=join_host_port(address, port)))
        self._names = tuple(names)
        return dataclasses.replace(desired, peers=tuple(peers))

    async def moved(self) -> list[str]:
        """Look the names of the last resolved config up again; a line per name that now resolves elsewhere."""
        lines = []
        for endpoint in self._names:
            host, port = _split(endpoint)
            address = await self._lookup(endpoint, host, port)
            before = self._current.get(endpoint)
            if address is not None and address != before:
                lines.append(f"peer endpoint {endpoint} now resolves to {address} (was {before or 'nothing'})")
        return lines

    async def follow(self, reapply: Callable[[], Awaitable[object]], interval: float = RESOLVE_INTERVAL) -> None:
        """Forever: every ``interval`` s, when a name resolves differently, log it and ``await reapply()``.

        ``reapply`` resolves the config again through :meth:`resolve` and applies it (a declarative
        ``apply()``: what did not change stays as it is).
        """
        while True:
            await asyncio.sleep(interval)
            lines = await self.moved()
            if lines:
                for line in lines:
                    log.warning("%s; applying the config again", line)
                await reapply()

    async def lookup(self, endpoint: str) -> str | None:
        """The address to use for ``endpoint`` (``HOST:PORT``) now, or None when it does not resolve."""
        host, port = _split(endpoint)
        return await self._lookup(endpoint, host, port)

    async def _lookup(self, endpoint: str, host: str, port: int) -> str | None:
        """The address to use for ``endpoint`` now, or None when the name does not resolve."""
        try:
            addresses = await self._resolve(host, port)
        except (OSError, EngineError) as err:
            log.debug("resolving %s failed: %s", endpoint, err)
            return None
        if not addresses:
            return None
        current = self._current.get(endpoint)
        return current if current in addresses else addresses[0]


async def resolve_endpoint(endpoint: str) -> str:
    """An endpoint with its host resolved to an IP literal, by the one policy of this module
    (first address, IPv4 first). EngineError when it fails."""
    host, port = split_host_port(endpoint)
    try:
        ipaddress.ip_address(host)
        return join_host_port(host, port)
    except ValueError:
        pass
    policy = EndpointPolicy()
    address = await policy.lookup(endpoint)
    if address is None:
        raise EngineError(f"cannot resolve peer endpoint {endpoint!r}")
    return join_host_port(address, port)
