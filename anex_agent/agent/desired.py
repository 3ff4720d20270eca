"""NodeConfig (what the coordinator says) -> DesiredConfig (what an engine applies). Pure.

* the interface address is the node's mesh address with the mesh network's prefix
  length (``10.254.0.5/16``), so the kernel's connected route covers the whole mesh;
* one peer per gateway: its key, UDP endpoint, allowed IPs and keepalive
  (whitepaper §6.5, PersistentKeepalive keeps NAT mappings of rented hosts open);
* extra routes: every allowed network of a gateway outside the mesh network (the
  cluster's service and pod networks), routed into the WireGuard interface; a default
  route (``0.0.0.0/0``) is never installed: the node's own traffic, including the
  WireGuard datagrams to the gateway, keeps its normal route;
* the node listens on a random UDP port (``listen_port=None``): it always initiates.

Tunnels: the node's forwards are those of ``GW_TUNNEL_*`` (local settings win on a port
clash) plus those the coordinator pushed.
"""

from __future__ import annotations

import ipaddress

from anex_agent.tunnels.base import DesiredConfig, PeerConfig
from anex_agent.wire import NodeConfig, TunnelSpec


def desired_from_config(config: NodeConfig, private_key: bytes) -> DesiredConfig:
    network = ipaddress.ip_network(config.network, strict=False)
    peers = []
    routes: dict[str, None] = {}
    for gw in config.gateways:
        if not gw.endpoint:
            continue  # a WebSocket-only gateway needs the WebSocket path (a later issue)
        peers.append(
            PeerConfig(
                public_key=gw.public_key,
                endpoint=gw.endpoint,
                allowed_ips=tuple(gw.allowed_ips),
                persistent_keepalive=gw.persistent_keepalive,
            )
        )
        for cidr in gw.allowed_ips:
            net = ipaddress.ip_network(cidr, strict=False)
            if net.version == network.version and net.subnet_of(network):
                continue  # covered by the interface address's connected route
            if net.prefixlen == 0:
                continue  # never a default route: it would capture the path to the gateway itself
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
