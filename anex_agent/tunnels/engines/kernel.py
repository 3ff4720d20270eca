"""The kernel WireGuard engine: a ``wireguard`` link configured over generic netlink (pyroute2).

* ``start()`` creates the link (rtnetlink, kind ``wireguard``).
* ``apply(desired)`` dumps the device (``WG_CMD_GET_DEVICE``), diffs it against
  ``desired`` with :func:`anex_agent.tunnels.engines.peer_plan.plan_peers` and sends
  ``WG_CMD_SET_DEVICE`` messages with only the changes (one per peer, as pyroute2's
  ``WireGuard.set`` builds them); addresses, MTU, routes and link state through
  :mod:`netconf`, exactly as the wireguard-go engine does.
* ``update_peers(upsert, remove)`` sends ``WG_CMD_SET_DEVICE`` for those peers only (no dump).
* ``send_keepalive(keys)`` turns those peers' persistent keepalive off and on again
  (:func:`keepalive_peers`): the kernel sends a keepalive when it is turned on.
* ``stop()`` deletes the link; its routes go with it.

Netlink attribute names and flags: include/uapi/linux/wireguard.h (WGPEER_F_REMOVE_ME,
WGPEER_F_REPLACE_ALLOWEDIPS). The device dump is converted to the same
:class:`anex_agent.tunnels.os.uapi.UapiDevice` the wireguard-go engine uses, so both share
the diff (:func:`anex_agent.tunnels.engines.wireguard_go.peers_from_device`).
"""

from __future__ import annotations

import asyncio
import base64
import errno as errno_mod
import logging
import secrets
from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from anex_agent.errors import EngineError
from anex_agent.wire.keys import encode_key
from anex_agent.tunnels.os import netconf
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.ifnames import IFNAME_PREFIX, check_ifname
from anex_agent.tunnels.engines.peer_plan import plan_peers
from anex_agent.tunnels.engines.status import EngineStatus, Support
from anex_agent.tunnels.engines.endpoints import resolve_once
from anex_agent.tunnels.os.caps import CAP_NET_ADMIN, call_off_loop, has_capability
from anex_agent.tunnels.os.uapi import UapiDevice, UapiPeer
from anex_agent.tunnels.engines.wireguard_go import keepalive_toggle, peers_from_device, status_from_device

if TYPE_CHECKING:
    from anex_agent.net.datagram import OSDatagramDialer
    from anex_agent.net.dialer import NameResolver, OSDialer
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

ZERO_KEY_B64 = base64.b64encode(bytes(32)).decode()


def _b64_bytes(attr: Any) -> bytes | None:
    """A pyroute2 key attribute as raw bytes: ``get_attr`` yields the base64 text (bytes or str)."""
    if attr is None:
        return None
    if isinstance(attr, (bytes, str)):
        raw = base64.b64decode(attr)
    elif hasattr(attr, "get"):
        raw = attr.get("key") or base64.b64decode(attr.get("value") or b"")
    else:
        return None
    return raw if len(raw) == 32 else None


def device_from_netlink(messages: Iterable[Any]) -> UapiDevice:
    """Merge the messages of a WG_CMD_GET_DEVICE dump into one UapiDevice.

    A large device arrives split across several messages (wireguard.h: "the kernel will
    then return several messages"); device attributes come in the first, peers in all.
    """
    private_key: bytes | None = None
    listen_port = fwmark = 0
    peers: dict[bytes, dict] = {}
    for msg in messages:
        private_key = private_key or _b64_bytes(msg.get_attr("WGDEVICE_A_PRIVATE_KEY"))
        listen_port = msg.get_attr("WGDEVICE_A_LISTEN_PORT") or listen_port
        fwmark = msg.get_attr("WGDEVICE_A_FWMARK") or fwmark
        for peer in msg.get_attr("WGDEVICE_A_PEERS") or ():
            key = _b64_bytes(peer.get_attr("WGPEER_A_PUBLIC_KEY"))
            if key is None:
                continue
            entry = peers.setdefault(key, {"public_key": key, "allowed_ips": []})
            psk = _b64_bytes(peer.get_attr("WGPEER_A_PRESHARED_KEY"))
            if psk is not None:
                entry["preshared_key"] = psk if any(psk) else None
            endpoint = peer.get_attr("WGPEER_A_ENDPOINT")
            if endpoint is not None and endpoint.get("port"):
                entry["endpoint"] = netconf.join_host_port(endpoint.get("addr"), endpoint.get("port"))
            keepalive = peer.get_attr("WGPEER_A_PERSISTENT_KEEPALIVE_INTERVAL")
            if keepalive is not None:
                entry["persistent_keepalive"] = keepalive
            handshake = peer.get_attr("WGPEER_A_LAST_HANDSHAKE_TIME")
            if handshake is not None:
                entry["last_handshake_sec"] = handshake.get("tv_sec") or 0
                entry["last_handshake_nsec"] = handshake.get("tv_nsec") or 0
            for attr, name in (("WGPEER_A_RX_BYTES", "rx_bytes"), ("WGPEER_A_TX_BYTES", "tx_bytes"),
                               ("WGPEER_A_PROTOCOL_VERSION", "protocol_version")):
                value = peer.get_attr(attr)
                if value is not None:
                    entry[name] = value
            for allowed in peer.get_attr("WGPEER_A_ALLOWEDIPS") or ():
                if allowed.get("addr"):
                    entry["allowed_ips"].append(allowed.get("addr"))
    return UapiDevice(
        private_key=private_key,
        listen_port=listen_port,
        fwmark=fwmark,
        peers=tuple(UapiPeer(**{**p, "allowed_ips": tuple(p["allowed_ips"])}) for p in peers.values()),
    )


def netlink_changes(device: UapiDevice, desired: DesiredConfig) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Device-level kwargs and per-peer dicts for pyroute2 ``WireGuard.set`` taking ``device`` to ``desired``. Pure.

    Empty results mean nothing to do. Endpoints must already be IP literals.
    """
    device_kwargs: dict[str, Any] = {}
    if device.private_key != desired.private_key:
        device_kwargs["private_key"] = encode_key(desired.private_key)
    if desired.listen_port is not None and desired.listen_port != device.listen_port:
        device_kwargs["listen_port"] = desired.listen_port
    current = peers_from_device(device)
    have = {p.public_key: p for p in current}
    plan = plan_peers(current, desired.peers)
    peers: list[dict[str, Any]] = [{"public_key": key, "remove": True} for key in plan.remove]
    for peer in plan.add + plan.update:
        peers.append(netlink_peer(peer, had_psk=peer.public_key in have and bool(have[peer.public_key].preshared_key)))
    return device_kwargs, peers


def netlink_peer(peer: PeerConfig, *, had_psk: bool) -> dict[str, Any]:
    """The pyroute2 ``WireGuard.set`` peer dict creating or replacing ``peer`` (allowed IPs replaced). Pure."""
    item: dict[str, Any] = {
        "public_key": peer.public_key,
        "persistent_keepalive": peer.persistent_keepalive,
        "replace_allowed_ips": True,
        "allowed_ips": list(peer.allowed_ips),
    }
    if peer.endpoint is not None:
        host, port = netconf.split_host_port(peer.endpoint)
        item["endpoint_addr"], item["endpoint_port"] = host, port
    if peer.preshared_key:
        item["preshared_key"] = peer.preshared_key
    elif had_psk:
        item["preshared_key"] = ZERO_KEY_B64
    return item


def keepalive_peers(device: UapiDevice, keys: Collection[str]) -> list[dict[str, Any]]:
    """The pyroute2 ``WireGuard.set`` peer dicts, in order, that make the kernel send a keepalive
    to each peer of ``device`` named in ``keys`` and leave its interval as it was
    (:func:`~anex_agent.tunnels.engines.wireguard_go.keepalive_toggle`; ``update_only``: a peer
    removed meanwhile is not created again). Empty when no key is a peer. Pure."""
    peers: list[dict[str, Any]] = []
    for peer in device.peers:
        key = encode_key(peer.public_key)
        if key in keys:
            peers += [{"public_key": key, "update_only": True, "persistent_keepalive": interval}
                      for interval in keepalive_toggle(peer.persistent_keepalive)]
    return peers


# ---------------------------------------------------------------- blocking netlink (run in a thread)


def _wg_info(ifname: str) -> UapiDevice:
    from pyroute2 import NetlinkError, WireGuard

    try:
        with WireGuard() as wg:
            return device_from_netlink(wg.info(ifname))
    except (NetlinkError, OSError) as err:
        raise EngineError(f"cannot read WireGuard device {ifname}: {err}") from None


def _wg_set(ifname: str, device_kwargs: dict[str, Any], peers: list[dict[str, Any]]) -> None:
    from pyroute2 import NetlinkError, WireGuard

    try:
        with WireGuard() as wg:
            if device_kwargs:
                wg.set(ifname, **device_kwargs)
            for peer in peers:
                wg.set(ifname, peer=peer)
    except (NetlinkError, OSError) as err:
        raise EngineError(f"cannot configure WireGuard device {ifname}: {err}") from None


def probe_link_kind(kind: str = "wireguard") -> Support:
    """Try to create (and delete) a throwaway link of ``kind``; says why not when it fails."""
    from anex_agent.tunnels.os.rtnl import NetlinkError, Rtnl

    name = f"{IFNAME_PREFIX}p{secrets.token_hex(4)}"
    try:
        with Rtnl() as nl:
            try:
                nl.link_add(name, kind)
            except NetlinkError as err:
                if err.errno == errno_mod.EOPNOTSUPP:
                    return Support(False, f"the kernel has no {kind} module (creating a {kind} link: not supported)")
                if err.errno == errno_mod.EPERM:
                    return Support(False, f"creating a {kind} link is not permitted (no CAP_NET_ADMIN here)")
                return Support(False, f"creating a {kind} link failed: {err.strerror}")
            index = nl.link_index(name)
            if index is not None:
                nl.link_del(index)
    except OSError as err:
        return Support(False, f"netlink is not usable: {err}")
    return Support(True, f"a {kind} link can be created (kernel module present)")


def _keepalive_blocking(ifname: str, gateways: Collection[str]) -> bool:
    """:meth:`KernelEngine.send_keepalive`'s netlink work, in one thread job; never raises."""
    peers: list[dict[str, Any]] = []
    try:
        peers = keepalive_peers(_wg_info(ifname), gateways)
        if not peers:
            return False
        _wg_set(ifname, {}, peers)
        return True
    except EngineError as err:
        log.debug("kernel WireGuard: no keepalive sent: %s", err)
    if not peers:
        return False
    try:
        _wg_set(ifname, {}, peers[1::2])  # each peer's own interval
    except EngineError as err:
        log.warning("kernel WireGuard: a peer's persistent keepalive may be off until the next apply: %s", err)
    return False


class KernelEngine(Engine):
    """WireGuard in the Linux kernel, configured over netlink."""

    name = "kernel"

    def __init__(self, *, ifname: str, state_dir: Path | None = None) -> None:
        self.ifname = check_ifname(ifname)  # state_dir: accepted and ignored (no files)
        self._started = False
        self._lock = asyncio.Lock()

    @classmethod
    def is_supported(cls) -> Support:
        if not has_capability(CAP_NET_ADMIN):
            return Support(False, "no CAP_NET_ADMIN (needed to create a wireguard link)")
        try:  # a blocking netlink probe: off the running loop, if any (see call_off_loop)
            return call_off_loop(probe_link_kind, "wireguard")
        except Exception as err:  # a probe never raises
            return Support(False, f"probe failed: {type(err).__name__}: {err}")

    async def start(self, tasks: Tasks | None = None) -> None:
        """Create the link. The kernel runs the tunnel: no task of ours (``tasks`` is not needed)."""
        async with self._lock:
            if self._started:
                return
            await netconf.run_blocking(netconf.create_link, self.ifname, "wireguard")
            self._started = True

    async def apply(self, desired: DesiredConfig, workload: WorkloadConfig | None = None) -> bool:
        """Diff the device and the interface settings into ``desired``; True when anything changed.
        ``workload`` is not needed: the OS routes serve it."""
        await self.start()
        async with self._lock:
            resolved = await resolve_once(desired)
            device = await netconf.run_blocking(_wg_info, self.ifname)
            device_kwargs, peers = netlink_changes(device, resolved)
            if device_kwargs or peers:
                await netconf.run_blocking(_wg_set, self.ifname, device_kwargs, peers)
            plans = await netconf.run_blocking(netconf.configure, self.ifname, desired.address, desired.mtu, desired.routes)
            return bool(device_kwargs or peers) or netconf.changed(plans)

    async def update_peers(self, upsert: Sequence[PeerConfig], remove: Sequence[str]) -> bool:
        """``WG_CMD_SET_DEVICE`` for these peers only (no device dump, no other peer touched).
        False before start() or for an endpoint name (``apply()`` resolves names)."""
        from anex_agent.tunnels.engines.wireguard_go import endpoint_is_literal

        if not self._started or not all(endpoint_is_literal(p.endpoint) for p in upsert):
            return False
        peers: list[dict[str, Any]] = [{"public_key": key, "remove": True} for key in remove]
        peers += [netlink_peer(p, had_psk=True) for p in upsert]  # no key given: cleared, never kept
        if peers:
            async with self._lock:
                await netconf.run_blocking(_wg_set, self.ifname, {}, peers)
        return True

    async def send_keepalive(self, gateways: Collection[str]) -> bool:
        """A WireGuard keepalive to each of ``gateways`` now: their interval read and set off and on
        again (:func:`keepalive_peers`; pyroute2 sends one message per peer setting, so should a
        write fail, each peer's own interval is set once more); no data packet."""
        if not self._started:
            return False
        async with self._lock:  # no apply() between the read and the writes
            # one thread job, awaited to its end even if the caller is cancelled meanwhile: the lock
            # is held until the last write, so an apply() never comes between (and is undone)
            job = asyncio.ensure_future(netconf.run_blocking(_keepalive_blocking, self.ifname, gateways))
            try:
                return await asyncio.shield(job)
            except asyncio.CancelledError:
                await job
                raise

    async def dump(self) -> UapiDevice:
        return await netconf.run_blocking(_wg_info, self.ifname)

    async def status(self) -> EngineStatus:
        if not self._started:
            return EngineStatus(engine=self.name, interface=self.ifname, listen_port=0, running=False)
        return status_from_device(self.name, self.ifname, await self.dump(), True)

    async def stop(self) -> None:
        async with self._lock:
            await netconf.run_blocking(netconf.delete_link, self.ifname)
            self._started = False

    def dialer(self, resolver: NameResolver | None = None) -> OSDialer:
        """An OS dialer: the routes through the interface carry the traffic."""
        from anex_agent.net.dialer import OSDialer

        return OSDialer(resolver)

    def datagram_dialer(self, resolver: NameResolver | None = None) -> OSDatagramDialer:
        """Kernel UDP sockets: the routes through the interface carry the datagrams."""
        from anex_agent.net.datagram import OSDatagramDialer

        return OSDatagramDialer(resolver)
