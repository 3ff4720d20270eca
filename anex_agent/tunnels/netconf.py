"""Addresses, routes, MTU and link state of our interfaces, through pyroute2 (netlink).

Used by the kernel and wireguard-go engines (and by cleanup). Every function is
declarative: it makes the interface match what is asked, and doing it twice changes
nothing. Planning (what to add or remove) is pure (:func:`plan_set`); the netlink
calls run in a worker thread (:func:`run_blocking`) because pyroute2's sync IPRoute
blocks. pyroute2 is imported lazily so that importing this module is cheap.

Routes we add carry ``proto`` :data:`RTPROT_ANEX` so that we only ever remove our own
routes (routes the kernel adds for the interface address are ``proto kernel``).
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import ipaddress
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from anex_agent import parse
from anex_agent.errors import EngineError

#: Routing protocol id marking our routes (rtnetlink.h: values above RTPROT_STATIC (4)
#: are free for daemons; 0x61 is unassigned in /etc/iproute2/rt_protos).
RTPROT_ANEX = 0x61

T = TypeVar("T")


async def run_blocking(func: Callable[..., T], *args: Any) -> T:
    """Run a blocking netlink call in a thread."""
    return await asyncio.to_thread(func, *args)


@dataclass(frozen=True)
class SetPlan:
    add: tuple[str, ...]
    remove: tuple[str, ...]


def plan_set(current: Iterable[str], desired: Iterable[str], *, kind: str = "network") -> SetPlan:
    """Diff two sets of addresses (``kind="interface"``, e.g. 10.0.0.1/24) or networks (CIDR). Pure."""
    norm = (lambda v: str(ipaddress.ip_interface(v))) if kind == "interface" else (
        lambda v: str(ipaddress.ip_network(v, strict=False)))
    have = {norm(v) for v in current}
    want = [norm(v) for v in desired]
    return SetPlan(add=tuple(dict.fromkeys(w for w in want if w not in have)),
                   remove=tuple(sorted(h for h in have if h not in set(want))))


# ---------------------------------------------------------------- blocking netlink helpers (run in a thread)


def _ipr() -> Any:
    from pyroute2 import IPRoute

    return IPRoute()


def list_links(prefix: str, kind: str | None = None) -> list[str]:
    """Names of interfaces whose name starts with ``prefix`` (and, if given, of link ``kind``)."""
    with _ipr() as ipr:
        links = ipr.get_links()
    names = []
    for link in links:
        name = link.get("IFLA_IFNAME")
        if not name or not name.startswith(prefix):
            continue
        if kind is not None:
            info = link.get("IFLA_LINKINFO")
            if info is None or info.get("IFLA_INFO_KIND") != kind:
                continue
        names.append(name)
    return sorted(names)


def create_link(ifname: str, kind: str) -> None:
    """Create a link of ``kind`` (e.g. ``wireguard``); EngineError (with errno text) on failure."""
    from pyroute2 import NetlinkError

    with _ipr() as ipr:
        try:
            ipr.link("add", ifname=ifname, kind=kind)
        except NetlinkError as err:
            if err.code == errno_mod.EEXIST:
                return
            raise EngineError(f"cannot create {kind} interface {ifname}: {err.args[-1] if err.args else err}") from None


def delete_link(ifname: str) -> bool:
    """Delete ``ifname`` if it exists; True when something was deleted."""
    from pyroute2 import NetlinkError

    with _ipr() as ipr:
        found = ipr.link_lookup(ifname=ifname)
        if not found:
            return False
        try:
            ipr.link("del", index=found[0])
        except NetlinkError as err:
            if err.code in (errno_mod.ENODEV, errno_mod.ENOENT):
                return False
            raise EngineError(f"cannot delete interface {ifname}: {err}") from None
    return True


def current_routes(ifname: str) -> list[str]:
    """Our routes (proto RTPROT_ANEX) through ``ifname``, as CIDR strings."""
    with _ipr() as ipr:
        index = _require(ipr, ifname)
        out = []
        for family in (2, 10):  # AF_INET, AF_INET6
            for route in ipr.get_routes(family=family, oif=index, table=254):
                if route.get("proto") != RTPROT_ANEX:
                    continue
                dst = route.get("RTA_DST") or ("0.0.0.0" if family == 2 else "::")
                out.append(f"{dst}/{route['dst_len']}")
        return out


def _require(ipr: Any, ifname: str) -> int:
    found = ipr.link_lookup(ifname=ifname)
    if not found:
        raise EngineError(f"interface {ifname} does not exist")
    return found[0]


def configure(ifname: str, address: str, mtu: int, routes: Iterable[str]) -> dict[str, SetPlan]:
    """Make ``ifname`` have exactly ``address``, ``mtu``, state up and exactly our ``routes``.

    Returns the plans that were carried out (for logging and tests); ``link`` lists the link
    settings changed (``mtu``, ``up``). EngineError on failure.
    """
    from pyroute2 import NetlinkError

    link_changes: list[str] = []
    with _ipr() as ipr:
        index = _require(ipr, ifname)
        try:
            link = ipr.get_links(index)[0]
            if link.get("IFLA_MTU") != mtu:
                ipr.link("set", index=index, mtu=mtu)
                link_changes.append("mtu")
            have = [f"{a.get('IFA_ADDRESS')}/{a['prefixlen']}" for a in ipr.get_addr(index=index)]
            have = [a for a in have if not ipaddress.ip_interface(a).ip.is_link_local]
            addr_plan = plan_set(have, [address], kind="interface")
            for item in addr_plan.remove:
                iface = ipaddress.ip_interface(item)
                ipr.addr("del", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen)
            for item in addr_plan.add:
                iface = ipaddress.ip_interface(item)
                ipr.addr("add", index=index, address=str(iface.ip), prefixlen=iface.network.prefixlen)
            if not link["flags"] & 1:  # IFF_UP
                ipr.link("set", index=index, state="up")
                link_changes.append("up")
        except NetlinkError as err:
            raise EngineError(f"cannot configure {ifname}: {err}") from None
    route_plan = set_routes(ifname, routes)
    return {"addresses": addr_plan, "routes": route_plan, "link": SetPlan(add=tuple(link_changes), remove=())}


def changed(plans: dict[str, SetPlan]) -> bool:
    """Whether :func:`configure` changed anything. Pure."""
    return any(plan.add or plan.remove for plan in plans.values())


def set_routes(ifname: str, routes: Iterable[str]) -> SetPlan:
    """Make our routes through ``ifname`` exactly ``routes`` (routes of others are left alone)."""
    from pyroute2 import NetlinkError

    plan = plan_set(current_routes(ifname), routes)
    with _ipr() as ipr:
        index = _require(ipr, ifname)
        for cidr in plan.remove:
            try:
                ipr.route("del", dst=cidr, oif=index, proto=RTPROT_ANEX)
            except NetlinkError as err:
                if err.code != errno_mod.ESRCH:
                    raise EngineError(f"cannot remove route {cidr} dev {ifname}: {err}") from None
        for cidr in plan.add:
            try:
                ipr.route("replace", dst=cidr, oif=index, proto=RTPROT_ANEX)
            except NetlinkError as err:
                raise EngineError(f"cannot add route {cidr} dev {ifname}: {err}") from None
    return plan


# ---------------------------------------------------------------- endpoints


def split_host_port(endpoint: str) -> tuple[str, int]:
    """``HOST:PORT`` / ``[V6]:PORT`` -> (host, port): :func:`anex_agent.parse.host_port` with the
    endpoint named in its ValueError. Pure."""
    try:
        return parse.host_port(endpoint)
    except ValueError as err:
        raise ValueError(f"endpoint {endpoint!r} {err}") from None


def join_host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def resolve_endpoint(endpoint: str) -> str:
    """An endpoint with its host resolved to an IP literal, by the one policy of
    :mod:`anex_agent.tunnels.endpoints` (first address, IPv4 first). EngineError when it fails."""
    from anex_agent.tunnels.endpoints import EndpointPolicy

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
