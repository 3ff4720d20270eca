"""What an engine is given: the tunnel (:class:`DesiredConfig` and its :class:`PeerConfig` peers) and
what the workload is offered besides it (:class:`WorkloadConfig`, with its :class:`Forward` list).

Frozen values, validated when built: a bad field raises :class:`anex_agent.errors.ConfigError`
naming it, so no engine ever sees an invalid config. The private key and a peer's preshared key
are left out of ``repr()``. Every engine takes these through ``Engine.apply(desired, workload)``
(:mod:`anex_agent.tunnels.engines.base`).
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field

from anex_agent import parse
from anex_agent.errors import ConfigError, config_value


@dataclass(frozen=True)
class PeerConfig:
    """One WireGuard peer as we want it. ``public_key`` is base64 (44 characters).

    ``endpoint`` is ``HOST:PORT`` (IPv6 host in brackets) or ``None`` for a peer that
    only ever connects to us. ``allowed_ips`` are CIDR strings, kept in the given
    order but compared as a set. ``persistent_keepalive`` 0 disables it
    (whitepaper §6.5, "Passive keepalive" / wg(8) PersistentKeepalive).
    """

    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    persistent_keepalive: int = 0
    preshared_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.persistent_keepalive <= 65535:
            raise ConfigError("persistent_keepalive", f"{self.persistent_keepalive} is outside 0..65535")
        for cidr in self.allowed_ips:
            config_value("allowed_ips", parse.cidr_text, cidr)

    def allowed_set(self) -> frozenset[str]:
        """Allowed IPs normalised (host bits cleared) as a set, for comparisons."""
        return frozenset(str(ipaddress.ip_network(c, strict=False)) for c in self.allowed_ips)


@dataclass(frozen=True)
class DesiredConfig:
    """The whole tunnel as we want it.

    ``private_key`` is 32 raw bytes; it is excluded from ``repr`` and never serialised.
    ``listen_port`` ``None`` lets the engine pick a random port (nodes); gateways set it.
    ``address`` is the interface address in CIDR form (``10.254.0.5/16`` or ``/32``).
    ``routes`` are extra networks routed into the interface (besides the address's own
    network); engines add them with the interface as the device.
    """

    private_key: bytes = field(repr=False)
    listen_port: int | None
    address: str
    mtu: int
    peers: tuple[PeerConfig, ...] = ()
    routes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.private_key) != 32:
            raise ConfigError("private_key", "must be 32 raw bytes (an X25519 private key)")
        if self.listen_port is not None and not 0 <= self.listen_port <= 65535:
            raise ConfigError("listen_port", f"{self.listen_port} is outside 0..65535")
        try:
            ipaddress.ip_interface(self.address)
        except ValueError:
            raise ConfigError("address", f"{self.address!r} is not an address in CIDR form (e.g. 10.254.0.5/16)") from None
        if not 1280 <= self.mtu <= 9000:
            raise ConfigError("mtu", f"{self.mtu} is outside 1280..9000")
        keys = [p.public_key for p in self.peers]
        if len(keys) != len(set(keys)):
            raise ConfigError("peers", "the same public key appears twice")
        for cidr in self.routes:
            config_value("routes", parse.cidr, cidr)



@dataclass(frozen=True)
class Forward:
    """A TCP forward offered to the workload: ``127.0.0.1:listen_port`` -> ``target`` (``HOST:PORT``) over the mesh."""

    listen_port: int
    target: str


@dataclass(frozen=True)
class WorkloadConfig:
    """What the workload is offered, besides the tunnel: given to every engine with ``apply()``.

    ``proxy_address``: where the HTTP proxy listens (``HOST:PORT``); ``proxy_auth``:
    whether it must ask for credentials; ``socks_address``: where the SOCKS5 proxy listens
    (``""``: no SOCKS5 proxy), ``socks_auth``: whether it must ask for credentials; ``forwards``: ``GW_TUNNEL`` and pushed forwards;
    ``inbound_ports``: the workload's TCP ports reachable from the mesh, ``inbound_udp_ports``
    its UDP ones; ``dns``: cluster DNS
    servers; ``gateways``: the gateways' mesh addresses (for liveness checks).
    Engines that give a dialer ignore it (the agent serves the proxy and forwards);
    engines with front-ends of their own render it.
    """

    proxy_address: str = "127.0.0.1:3128"
    proxy_auth: bool = False
    socks_address: str = ""
    socks_auth: bool = False
    forwards: tuple[Forward, ...] = ()
    inbound_ports: tuple[int, ...] = ()
    inbound_udp_ports: tuple[int, ...] = ()
    dns: tuple[str, ...] = ()
    gateways: tuple[str, ...] = ()

    def tunnels(self) -> dict[int, str]:
        """Forwards as local port -> target."""
        return {f.listen_port: f.target for f in self.forwards}
