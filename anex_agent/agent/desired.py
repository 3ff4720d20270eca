"""NodeConfig (what the coordinator says) -> DesiredConfig (what an engine applies). Pure.

* the interface address is the node's mesh address with the mesh network's prefix
  length (``10.254.0.5/16``), so the kernel's connected route covers the whole mesh;
* one peer per gateway: its key, UDP endpoint, allowed IPs and keepalive
  (whitepaper §6.5, PersistentKeepalive keeps NAT mappings of rented hosts open); its
  allowed IPs also hold the gateway's own mesh address (a /32 or /128), so what the node
  sends to that gateway (DNS, keepalives) reaches it whichever gateway carries the mesh
  network (:func:`anex_agent.agent.liveness.assign` gives each network to one of them);
* extra routes: the networks a gateway offers outside the mesh network (the cluster's
  service and pod networks), routed into the WireGuard interface, but only those the
  node admits (:func:`admit_routes`); a refused network is neither routed nor in the
  gateway peer's allowed IPs;
* the node listens on a random UDP port (``listen_port=None``): it always initiates.

Which gateway networks are admitted: those inside the coordinator's list of networks
gateways may offer (``NodeConfig.gateway_routes``, see :mod:`anex_agent.wire.route_policy`),
and of those, none that is a default route or covers a *protected* address: the
coordinator's address (given by the caller, who resolves it) or a gateway's endpoint
(an IP literal in the config). Such a route would capture the node's own path to the
coordinator or to the gateway: a gateway could then read or cut the node's control
traffic, and the WireGuard datagrams would loop into the tunnel.

Tunnels: the node's forwards are those of ``GW_TUNNEL_*`` (local settings win on a port
clash) plus those the coordinator pushed.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

from anex_agent import parse
from anex_agent.wire import route_policy
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig
from anex_agent.wire.nodes import NodeConfig, TunnelSpec


@dataclass(frozen=True)
class RefusedRoute:
    """A network a gateway offers that the node does not install, and why (for the log)."""

    gateway: str
    network: str
    reason: str

    def __str__(self) -> str:
        return f"gateway {self.gateway}: route {self.network} refused: {self.reason}"


def _endpoint_ip(endpoint: str | None) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    if not endpoint:
        return None
    try:
        return ipaddress.ip_address(parse.host_port(endpoint)[0])
    except ValueError:
        return None  # a name: resolved by the engine, not checked here


def admit_routes(
    config: NodeConfig, protected: Iterable[str] = ()
) -> tuple[tuple[tuple[str, ...], ...], tuple[RefusedRoute, ...]]:
    """Per gateway (in ``config.gateways`` order): the allowed IPs the node accepts (mesh subnets
    kept); and what was refused.

    ``protected``: addresses no installed route may cover (the coordinator's, resolved
    by the caller). Gateway endpoints given as IP literals are protected too.
    """
    mesh = ipaddress.ip_network(config.network, strict=False)
    allowed = [route_policy.parse(c) for c in config.gateway_routes]
    guarded: list[tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, str]] = []
    for address in protected:
        guarded.append((ipaddress.ip_address(address), f"it covers the coordinator's address {address}"))
    for gw in config.gateways:
        ip = _endpoint_ip(gw.endpoint)
        if ip is not None:
            guarded.append((ip, f"it covers gateway {gw.id}'s endpoint {gw.endpoint}"))
    admitted: list[tuple[str, ...]] = []
    refused: list[RefusedRoute] = []
    for gw in config.gateways:
        keep: list[str] = []
        for cidr in gw.allowed_ips:
            net = ipaddress.ip_network(cidr, strict=False)
            reason = _refusal(net, mesh, allowed, guarded)
            if reason is None:
                keep.append(cidr)
            else:
                refused.append(RefusedRoute(gw.id, str(net), reason))
        admitted.append(tuple(keep))
    return tuple(admitted), tuple(refused)


def _refusal(net, mesh, allowed, guarded) -> str | None:
    if net.version == mesh.version and net.subnet_of(mesh):
        return None  # the mesh itself: covered by the interface address's connected route
    if net.prefixlen == 0:
        return "never a default route: it would capture the path to the gateway itself"
    if not route_policy.inside(net, allowed):
        listed = ", ".join(str(a) for a in allowed) or "none"
        return f"outside the networks gateways may offer ({listed})"
    for address, why in guarded:
        if address.version == net.version and address in net:
            return why
    return None


def desired_from_config(config: NodeConfig, private_key: bytes, protected: Iterable[str] = ()) -> DesiredConfig:
    """The engine's config for ``config``; gateway networks filtered by :func:`admit_routes`."""
    network = ipaddress.ip_network(config.network, strict=False)
    admitted, _ = admit_routes(config, protected)
    peers = []
    routes: dict[str, None] = {}
    for gw, allowed_ips in zip(config.gateways, admitted):
        if not gw.endpoint:
            continue  # a gateway reachable only over WebSocket: nodes have no WebSocket path yet, so it is skipped
        own = str(ipaddress.ip_network(gw.mesh_address))  # a host network: /32 or /128
        peers.append(
            PeerConfig(
                public_key=gw.public_key,
                endpoint=gw.endpoint,
                allowed_ips=allowed_ips if own in allowed_ips else (*allowed_ips, own),
                persistent_keepalive=gw.persistent_keepalive,
            )
        )
        for cidr in allowed_ips:
            net = ipaddress.ip_network(cidr, strict=False)
            if net.version == network.version and net.subnet_of(network):
                continue  # covered by the interface address's connected route
            routes[str(net)] = None
    return DesiredConfig(
        private_key=private_key,
        listen_port=None,
        address=f"{config.address}/{network.prefixlen}",
        mtu=config.mtu,
        peers=tuple(peers),
        routes=tuple(routes),
    )


def merge_tunnels(local: list[TunnelSpec], pushed: list[TunnelSpec]) -> list[TunnelSpec]:
    """Local (GW_TUNNEL_*) forwards plus pushed ones on other ports, sorted by port."""
    by_port = {t.listen_port: t for t in pushed}
    by_port.update({t.listen_port: t for t in local})
    return [by_port[p] for p in sorted(by_port)]
