"""Addresses, routes, MTU and link state of our interfaces, through rtnetlink (:mod:`.rtnl`).

Used by the kernel and wireguard-go engines (and by cleanup). Every function is
declarative: it makes the interface match what is asked, and doing it twice changes
nothing. Planning (what to add or remove) is pure (:func:`plan_set`); the netlink
calls run in a worker thread (:func:`run_blocking`) because they block (one small
netlink socket per call, no library: see :mod:`.rtnl` for why).

Routes we add carry ``proto`` :data:`RTPROT_ANEX` so that we only ever remove our own
routes (routes the kernel adds for the interface address are ``proto kernel``).
"""

from __future__ import annotations

import asyncio
import errno as errno_mod
import ipaddress
import socket
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from anex_agent import parse
from anex_agent.errors import EngineError
from anex_agent.tunnels.os.rtnl import IFF_UP, RT_TABLE_MAIN, NetlinkError, Rtnl

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


def _rtnl() -> Rtnl:
    try:
        return Rtnl()
    except OSError as err:
        raise EngineError(f"netlink is not usable: {err.strerror or err}") from None


def list_links(prefix: str, kind: str | None = None) -> list[str]:
    """Names of interfaces whose name starts with ``prefix`` (and, if given, of link ``kind``)."""
    with _rtnl() as nl:
        links = nl.links()
    return sorted(link.name for link in links
                  if link.name.startswith(prefix) and (kind is None or link.kind == kind))


def create_link(ifname: str, kind: str) -> None:
    """Create a link of ``kind`` (e.g. ``wireguard``); EngineError (with errno text) on failure."""
    with _rtnl() as nl:
        try:
            nl.link_add(ifname, kind)
        except NetlinkError as err:
            if err.errno == errno_mod.EEXIST:
                return
            raise EngineError(f"cannot create {kind} interface {ifname}: {err.strerror}") from None


def delete_link(ifname: str) -> bool:
    """Delete ``ifname`` if it exists; True when something was deleted."""
    with _rtnl() as nl:
        index = nl.link_index(ifname)
        if index is None:
            return False
        try:
            nl.link_del(index)
        except NetlinkError as err:
            if err.errno in (errno_mod.ENODEV, errno_mod.ENOENT):
                return False
            raise EngineError(f"cannot delete interface {ifname}: {err.strerror}") from None
    return True


def _our_routes(nl: Rtnl, index: int) -> list[str]:
    out = []
    for family in (socket.AF_INET, socket.AF_INET6):
        for route in nl.routes(family):
            if route.table == RT_TABLE_MAIN and route.oif == index and route.proto == RTPROT_ANEX:
                out.append(f"{route.dst}/{route.dst_len}")
    return out


def current_routes(ifname: str) -> list[str]:
    """Our routes (proto RTPROT_ANEX) through ``ifname``, as CIDR strings."""
    with _rtnl() as nl:
        return _our_routes(nl, _require(nl, ifname))


def _require(nl: Rtnl, ifname: str) -> int:
    index = nl.link_index(ifname)
    if index is None:
        raise EngineError(f"interface {ifname} does not exist")
    return index


def configure(ifname: str, address: str, mtu: int, routes: Iterable[str]) -> dict[str, SetPlan]:
    """Make ``ifname`` have exactly ``address``, ``mtu``, state up and exactly our ``routes``.

    Returns the plans that were carried out (for logging and tests); ``link`` lists the link
    settings changed (``mtu``, ``up``). EngineError on failure.
    """
    link_changes: list[str] = []
    with _rtnl() as nl:
        index = _require(nl, ifname)
        try:
            link = nl.link(index)
            if link.mtu != mtu:
                nl.link_set(index, mtu=mtu)
                link_changes.append("mtu")
            have = [f"{a}/{prefixlen}" for a, prefixlen in nl.addrs(index)]
            have = [a for a in have if not ipaddress.ip_interface(a).ip.is_link_local]
            addr_plan = plan_set(have, [address], kind="interface")
            for item in addr_plan.remove:
                nl.addr_del(index, item)
            for item in addr_plan.add:
                nl.addr_add(index, item)
            if not link.flags & IFF_UP:
                nl.link_set(index, up=True)
                link_changes.append("up")
        except NetlinkError as err:
            raise EngineError(f"cannot configure {ifname}: {err.strerror}") from None
    route_plan = set_routes(ifname, routes)
    return {"addresses": addr_plan, "routes": route_plan, "link": SetPlan(add=tuple(link_changes), remove=())}


def changed(plans: dict[str, SetPlan]) -> bool:
    """Whether :func:`configure` changed anything. Pure."""
    return any(plan.add or plan.remove for plan in plans.values())


def set_routes(ifname: str, routes: Iterable[str]) -> SetPlan:
    """Make our routes through ``ifname`` exactly ``routes`` (routes of others are left alone)."""
    with _rtnl() as nl:
        index = _require(nl, ifname)
        plan = plan_set(_our_routes(nl, index), routes)
        for cidr in plan.remove:
            try:
                nl.route_del(cidr, index, RTPROT_ANEX)
            except NetlinkError as err:
                if err.errno != errno_mod.ESRCH:
                    raise EngineError(f"cannot remove route {cidr} dev {ifname}: {err.strerror}") from None
        for cidr in plan.add:
            try:
                nl.route_replace(cidr, index, RTPROT_ANEX)
            except NetlinkError as err:
                raise EngineError(f"cannot add route {cidr} dev {ifname}: {err.strerror}") from None
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

