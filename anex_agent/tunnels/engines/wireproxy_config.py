"""wireproxy's configuration (windtf/wireproxy v1.1): validated options and the config text. Pure.

:class:`WireproxyOptions` is what wireproxy needs beyond the WireGuard config (its HTTP
proxy, client and server tunnels, health address, DNS, CheckAlive), built from the
engine contract's :class:`~anex_agent.tunnels.engines.config.WorkloadConfig` by
:meth:`WireproxyOptions.from_workload`; :func:`render_config` turns a
:class:`~anex_agent.tunnels.engines.config.DesiredConfig` and options into the file's text.
Every value is validated (ConfigError naming the field) before it is rendered, so
nothing the coordinator or the environment sends can add a section or an ``$ENV``
reference to the file. No I/O here.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from anex_agent import parse
from anex_agent.errors import ConfigError, config_value
from anex_agent.wire.keys import decode_key, encode_key
from anex_agent.tunnels.engines.config import DesiredConfig, WorkloadConfig

#: wireproxy's default CheckAliveInterval (seconds); /readyz says 503 once the last pong is older than this + 2 s.
CHECK_ALIVE_INTERVAL = 5



# ---------------------------------------------------------------- options and validation


def _check_host_port(value: str, what: str, *, literal: bool = False) -> str:
    """``HOST:PORT`` (``[v6]:PORT``; with ``literal`` an IP address, no name); ConfigError naming ``what`` otherwise."""
    config_value(what, parse.ip_port if literal else parse.host_port, value)
    return value


@dataclass(frozen=True)
class ClientTunnel:
    """``[TCPClientTunnel]``: wireproxy listens on ``bind_address`` (local) and connects to ``target`` over the mesh."""

    bind_address: str
    target: str

    def __post_init__(self) -> None:
        _check_host_port(self.bind_address, "client tunnel bind_address", literal=True)
        _check_host_port(self.target, "client tunnel target")


@dataclass(frozen=True)
class ServerTunnel:
    """``[TCPServerTunnel]``: wireproxy listens on mesh port ``listen_port`` and connects to local ``target``."""

    listen_port: int
    target: str

    def __post_init__(self) -> None:
        if not isinstance(self.listen_port, int) or not 1 <= self.listen_port <= 65535:
            raise ConfigError("server tunnel listen_port", f"{self.listen_port!r} is not a port from 1 to 65535")
        _check_host_port(self.target, "server tunnel target")


@dataclass(frozen=True)
class WireproxyOptions:
    """What wireproxy needs beyond the WireGuard config.

    ``proxy_address``: where its HTTP proxy listens (e.g. ``127.0.0.1:3128``);
    ``socks_address``: where its SOCKS5 proxy listens (``""``: none);
    ``health_address``: where ``-i`` serves ``/readyz`` and ``/metrics`` (loopback only:
    ``/metrics`` reveals peers and endpoints); ``check_alive``: mesh addresses pinged for
    ``/readyz`` (the gateway's); ``dns``: resolvers inside the mesh.
    """

    proxy_address: str = "127.0.0.1:3128"
    socks_address: str = ""
    health_address: str = "127.0.0.1:9080"
    dns: tuple[str, ...] = ()
    check_alive: tuple[str, ...] = ()
    check_alive_interval: int = CHECK_ALIVE_INTERVAL
    client_tunnels: tuple[ClientTunnel, ...] = ()
    server_tunnels: tuple[ServerTunnel, ...] = ()

    def __post_init__(self) -> None:
        _check_host_port(self.proxy_address, "proxy_address", literal=True)
        _check_host_port(self.health_address, "health_address", literal=True)
        if self.socks_address:
            _check_host_port(self.socks_address, "socks_address", literal=True)
        host, _ = parse.ip_port(self.health_address)
        if not ipaddress.ip_address(host).is_loopback:
            raise ConfigError("health_address", f"{self.health_address!r}: must be a loopback address "
                              "(wireproxy's /metrics lists peers and endpoints to whoever connects)")
        for what, values in (("dns", self.dns), ("check_alive", self.check_alive)):
            for value in values:
                try:
                    ipaddress.ip_address(value)
                except ValueError:
                    raise ConfigError(what, f"{value!r} is not an IP address") from None
        if not 1 <= self.check_alive_interval <= 3600:
            raise ConfigError("check_alive_interval", f"{self.check_alive_interval} is not 1..3600 seconds")
        binds = [t.bind_address for t in self.client_tunnels] + [self.proxy_address, self.health_address]
        binds += [self.socks_address] if self.socks_address else []
        if len(binds) != len(set(binds)):
            raise ConfigError("client_tunnels", "two listeners (tunnels, proxies, health) share one address")
        ports = [t.listen_port for t in self.server_tunnels]
        if len(ports) != len(set(ports)):
            raise ConfigError("server_tunnels", "the same listen_port appears twice")

    @classmethod
    def from_workload(cls, workload: WorkloadConfig, *, health_address: str = "127.0.0.1:9080") -> WireproxyOptions:
        """Options serving ``workload``: the proxy (and the SOCKS5 proxy, when on) on its address, a client tunnel
        ``127.0.0.1:<listen_port> -> target`` per forward, a server tunnel ``<port> -> 127.0.0.1:<port>``
        per inbound port, its DNS, and CheckAlive on every gateway's mesh address."""
        return cls(
            proxy_address=workload.proxy_address,
            socks_address=workload.socks_address,
            health_address=health_address,
            dns=tuple(workload.dns),
            check_alive=tuple(workload.gateways),
            client_tunnels=tuple(ClientTunnel(f"127.0.0.1:{f.listen_port}", f.target) for f in workload.forwards),
            server_tunnels=tuple(ServerTunnel(p, f"127.0.0.1:{p}") for p in workload.inbound_ports),
        )


# ---------------------------------------------------------------- rendering


def render_config(desired: DesiredConfig, options: WireproxyOptions) -> str:
    """The wireproxy config text for ``desired`` + ``options``. Pure; raises ConfigError naming the bad field.

    wireproxy reads values starting with ``$`` as environment references; nothing we render
    can start with one (keys are base64, the rest is validated addresses).
    """
    if not desired.peers:
        raise ConfigError("peers", "wireproxy needs at least one peer (the gateway)")
    lines = ["# Written by anex-agent for wireproxy; holds a private key (mode 0600). Do not edit.",
             "[Interface]",
             f"Address = {desired.address}",
             f"PrivateKey = {encode_key(desired.private_key)}"]
    if desired.listen_port:
        lines.append(f"ListenPort = {desired.listen_port}")
    if options.dns:
        lines.append(f"DNS = {', '.join(options.dns)}")
    lines.append(f"MTU = {desired.mtu}")
    if options.check_alive:
        lines.append(f"CheckAlive = {', '.join(options.check_alive)}")
        if options.check_alive_interval != CHECK_ALIVE_INTERVAL:
            lines.append(f"CheckAliveInterval = {options.check_alive_interval}")
    for peer in desired.peers:
        decode_key(peer.public_key, what="peer public_key")
        lines += ["", "[Peer]", f"PublicKey = {peer.public_key}"]
        if peer.preshared_key:
            decode_key(peer.preshared_key, what="peer preshared_key")
            lines.append(f"PresharedKey = {peer.preshared_key}")
        if peer.endpoint:
            lines.append(f"Endpoint = {_check_host_port(peer.endpoint, 'peer endpoint')}")
        if peer.allowed_ips:
            lines.append(f"AllowedIPs = {', '.join(peer.allowed_ips)}")
        if peer.persistent_keepalive:
            lines.append(f"PersistentKeepalive = {peer.persistent_keepalive}")
    lines += ["", "[http]", f"BindAddress = {options.proxy_address}"]
    if options.socks_address:
        lines += ["", "[Socks5]", f"BindAddress = {options.socks_address}"]
    for tunnel in options.client_tunnels:
        lines += ["", "[TCPClientTunnel]", f"BindAddress = {tunnel.bind_address}", f"Target = {tunnel.target}"]
    for server in options.server_tunnels:
        lines += ["", "[TCPServerTunnel]", f"ListenPort = {server.listen_port}", f"Target = {server.target}"]
    return "\n".join(lines) + "\n"
