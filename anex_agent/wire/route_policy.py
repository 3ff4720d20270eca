"""Which networks a gateway may offer to nodes. Pure; shared by the coordinator and the node.

The admin sets the list on the coordinator (``--gateway-route CIDR``, repeatable). It
is enforced twice:

* the coordinator refuses a gateway registration that offers a network outside the
  list (or inside the mesh network, or a default route): :func:`offer_problem`;
* the node gets the list in its config (``NodeConfig.gateway_routes``) and installs a
  gateway's network only when it lies inside the list (:func:`inside`), so a gateway
  registered before the list was narrowed, or a coordinator that does not check,
  cannot widen what the node sends into the mesh.

Default (:data:`DEFAULT_GATEWAY_ROUTES`): private address space, where clusters' node,
service and pod networks live (RFC 1918, the shared space of RFC 6598 that some
clusters use, and IPv6 unique local addresses of RFC 4193). Nothing public: a gateway
cannot make itself a node's path to the internet (``0.0.0.0/1`` + ``128.0.0.0/1`` and
the like are refused). ``10.0.0.0/8`` covers ``10.96.0.0/12`` (Kubernetes' default
service network) and ``10.244.0.0/16`` (flannel's default pod network).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable

from anex_agent.parse import cidr as parse_cidr

Network = ipaddress.IPv4Network | ipaddress.IPv6Network

DEFAULT_GATEWAY_ROUTES: tuple[str, ...] = (
    "10.0.0.0/8",      # RFC 1918 §3
    "172.16.0.0/12",   # RFC 1918 §3
    "192.168.0.0/16",  # RFC 1918 §3
    "100.64.0.0/10",   # RFC 6598 §7, shared address space
    "fc00::/7",        # RFC 4193 §3.1, unique local addresses
)


def parse(cidr: str) -> Network:
    """A network in CIDR form (host bits allowed: ``10.96.0.1/12`` is ``10.96.0.0/12``). ValueError otherwise."""
    return parse_cidr(cidr.strip())


def inside(network: Network, allowed: Iterable[Network]) -> bool:
    """True when ``network`` lies entirely inside one of ``allowed`` (same address family)."""
    return any(network.version == a.version and network.subnet_of(a) for a in allowed)  # type: ignore[arg-type]


def offer_problem(route: str, allowed: Iterable[str], mesh_network: str) -> str | None:
    """Why a gateway may not offer ``route`` (None when it may).

    Refused: a default route; a network inside the mesh network (nodes do not reach
    each other through a gateway); a network not inside one of ``allowed``.
    """
    network = parse(route)
    mesh = parse(mesh_network)
    if network.prefixlen == 0:
        return f"{network} is a default route; a gateway is not a way to the internet"
    if network.version == mesh.version and network.subnet_of(mesh):  # type: ignore[arg-type]
        return f"{network} is inside the mesh network {mesh}; nodes do not reach each other through a gateway"
    allowed_networks = [parse(a) for a in allowed]
    if not inside(network, allowed_networks):
        listed = ", ".join(str(a) for a in allowed_networks) or "none"
        return (f"{network} is outside the networks gateways may offer ({listed}); "
                "the coordinator's --gateway-route sets them")
    return None
