"""The wireguard-go engine: a supervised ``wireguard-go -f <ifname>`` child, configured over UAPI.

Lifecycle:

* ``start()`` runs ``wireguard-go -f IFNAME`` in the current network namespace with
  :func:`anex_agent.tunnels.os.process.spawn` (the child gets SIGTERM if we die, via
  PR_SET_PDEATHSIG, so a crashed agent does not leave it behind), then waits until its
  UAPI socket answers ``get=1``.
* ``apply(desired)`` reads the device over UAPI, diffs it against ``desired``
  (:func:`anex_agent.tunnels.engines.peer_plan.plan_peers`) and sends ``set=1`` requests with only the
  changes, at most :data:`SET_CHUNK` peers each (a fresh hub of 10,000 peers: 5 writes);
  then addresses, MTU, link state and routes through :mod:`netconf`.
* ``update_peers(upsert, remove)`` sends one ``set=1`` naming only those peers: no
  ``get=1``, no other peer read or rewritten, never ``replace_peers`` (a gateway's
  watch events).
* ``send_keepalive(keys)`` turns those peers' persistent keepalive off and on again in one
  ``set=1`` (:func:`keepalive_request`): wireguard-go sends a keepalive when it is turned on.
* ``stop()`` sends SIGTERM (SIGKILL after a grace period), then makes sure the
  interface and the UAPI socket are gone. Routes die with the interface.

The interface, the process and the socket are all named after ``ifname``; UAPI
sockets live in one directory for the whole machine (not per namespace), so names
must be unique machine-wide (see :func:`anex_agent.tunnels.engines.ifnames.new_ifname`).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import shutil
import signal
import tempfile
import time
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING

from anex_agent import parse
from anex_agent.host.childenv import engine_env
from anex_agent.errors import EngineError, ProtocolError
from anex_agent.wire.keys import decode_key, encode_key
from anex_agent.tunnels.os import netconf, process, uapi
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.ifnames import check_ifname
from anex_agent.tunnels.engines.peer_plan import plan_peers
from anex_agent.tunnels.engines.status import EngineStatus, PeerStatus, Support
from anex_agent.tunnels.os.caps import CAP_NET_ADMIN, has_capability, tun_usable
from anex_agent.tunnels.engines.endpoints import resolve_once

if TYPE_CHECKING:
    from anex_agent.net.datagram import OSDatagramDialer
    from anex_agent.net.dialer import NameResolver, OSDialer
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

BINARY = "wireguard-go"
#: Debian's wireguard-go refuses to run on Linux unless this is set (it prefers the kernel module).
ENV_PREFER_USERSPACE = "WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD"
START_TIMEOUT = 10.0
#: How often the start looks for the UAPI socket (a stat; wireguard-go opens it within tens of ms).
SOCKET_POLL = 0.005
STOP_GRACE = 5.0


def peers_from_device(device: uapi.UapiDevice) -> tuple[PeerConfig, ...]:
    """The peers of a UAPI dump as PeerConfig (for diffing)."""
    return tuple(
        PeerConfig(
            public_key=encode_key(p.public_key),
            endpoint=p.endpoint,
            allowed_ips=p.allowed_ips,
            persistent_keepalive=p.persistent_keepalive,
            preshared_key=encode_key(p.preshared_key) if p.preshared_key else None,
        )
        for p in device.peers
    )


#: Peers per ``set=1`` request when many change at once (a snapshot of thousands): large
#: writes, a bounded number of them (10,000 peers: 5 writes), none of unbounded size.
SET_CHUNK = 2000


def peer_change(peer: PeerConfig, *, had_psk: bool = False) -> uapi.PeerChange:
    """The UAPI section that creates ``peer`` or replaces an existing one (allowed IPs replaced).

    ``had_psk``: the existing peer has a preshared key that ``peer`` does not (it is cleared)."""
    if peer.preshared_key:
        psk: bytes | None = decode_key(peer.preshared_key, what="preshared_key")
    else:
        psk = b"" if had_psk else None
    return uapi.PeerChange(
        public_key=decode_key(peer.public_key, what="peer public_key"),
        preshared_key=psk,
        endpoint=peer.endpoint,
        persistent_keepalive=peer.persistent_keepalive,
        replace_allowed_ips=True,
        allowed_ips=peer.allowed_ips,
    )


def chunked(changes: list[uapi.PeerChange], size: int = SET_CHUNK, **device: object) -> list[bytes]:
    """``set=1`` requests carrying ``changes`` in order, at most ``size`` peers each; ``device``
    keys (``private_key``, ``listen_port``) go in the first. No change at all: no request."""
    requests: list[bytes] = []
    device_keys = {k: v for k, v in device.items() if v is not None}
    for start in range(0, len(changes), size):
        requests.append(uapi.encode_set(peers=changes[start:start + size], **(device_keys if not start else {})))
    if not requests and device_keys:
        requests.append(uapi.encode_set(**device_keys))
    return requests


def apply_requests(device: uapi.UapiDevice, desired: DesiredConfig, size: int = SET_CHUNK) -> list[bytes]:
    """The ``set=1`` requests that take ``device`` to ``desired``, removals first; ``[]`` when
    nothing differs. Pure. Peer endpoints in ``desired`` must already be IP literals
    (see :mod:`anex_agent.tunnels.engines.endpoints`)."""
    current = peers_from_device(device)
    plan = plan_peers(current, desired.peers)
    have = {p.public_key: p for p in current}
    changes: list[uapi.PeerChange] = [uapi.PeerChange(public_key=decode_key(k), remove=True) for k in plan.remove]
    for peer in plan.add + plan.update:
        old = have.get(peer.public_key)
        changes.append(peer_change(peer, had_psk=old is not None and bool(old.preshared_key)))
    return chunked(
        changes, size,
        private_key=desired.private_key if device.private_key != desired.private_key else None,
        listen_port=desired.listen_port
        if desired.listen_port is not None and desired.listen_port != device.listen_port
        else None,
    )


def encode_apply(device: uapi.UapiDevice, desired: DesiredConfig) -> bytes:
    """The whole change from ``device`` to ``desired`` as one ``set=1`` request
    (``b"set=1\\n\\n"`` when nothing differs). Pure; :func:`apply_requests` splits it."""
    requests = apply_requests(device, desired, size=max(1, len(device.peers) + len(desired.peers)))
    return requests[0] if requests else uapi.encode_set()


def endpoint_is_literal(endpoint: str | None) -> bool:
    """Whether ``endpoint`` is None or an ``IP:PORT`` literal (nothing to resolve)."""
    if endpoint is None:
        return True
    try:
        parse.ip_port(endpoint)
    except ValueError:
        return False
    return True


def update_request(upsert: Sequence[PeerConfig], remove: Sequence[str]) -> bytes:
    """One ``set=1`` request changing only the peers named (removals first). Pure.

    An upserted peer's preshared key is set as given (none: the all-zero key), so a
    replaced peer never keeps a key it should not have."""
    changes = [uapi.PeerChange(public_key=decode_key(k), remove=True) for k in remove]
    for peer in upsert:
        change = peer_change(peer)
        if change.preshared_key is None:
            change = dataclasses.replace(change, preshared_key=b"")
        changes.append(change)
    return uapi.encode_set(peers=changes)


def keepalive_toggle(interval: int) -> tuple[int, int]:
    """The two persistent keepalive intervals to set, in order, so that WireGuard sends one
    keepalive now and the peer is left with ``interval``. Pure.

    wireguard-go (device/uapi.go, ``pkaOn``) and the kernel (netlink.c, ``set_peer``) send a
    keepalive at once when a peer's interval goes from 0 to another value, and only then: so
    off then on again, or, for a peer with none, on (1 s) then off. The peer's keepalive
    timer reads the interval when it fires, so neither the moment at 0 nor the one at 1 s
    sends anything else."""
    return (0, interval) if interval else (1, 0)


def keepalive_request(device: uapi.UapiDevice, keys: Collection[str]) -> bytes | None:
    """One ``set=1`` making wireguard-go send a keepalive to each peer of ``device`` named in
    ``keys`` (base64 public keys), leaving every interval as it was (:func:`keepalive_toggle`:
    two sections of the same peer, applied under the device's lock, ``update_only`` so that a
    peer removed meanwhile is not created again); None when no key is a peer. Pure."""
    changes: list[uapi.PeerChange] = []
    for peer in device.peers:
        if encode_key(peer.public_key) in keys:
            changes += [uapi.PeerChange(public_key=peer.public_key, update_only=True, persistent_keepalive=interval)
                        for interval in keepalive_toggle(peer.persistent_keepalive)]
    return uapi.encode_set(peers=changes) if changes else None


def status_from_device(name: str, ifname: str, device: uapi.UapiDevice, running: bool) -> EngineStatus:
    return EngineStatus(
        engine=name,
        interface=ifname,
        listen_port=device.listen_port,
        running=running,
        peers=tuple(
            PeerStatus(
                public_key=encode_key(p.public_key),
                endpoint=p.endpoint,
                last_handshake=p.last_handshake,
                rx_bytes=p.rx_bytes,
                tx_bytes=p.tx_bytes,
                allowed_ips=p.allowed_ips,
            )
            for p in device.peers
        ),
    )


class WireguardGoEngine(Engine):
    """WireGuard through a wireguard-go child process (needs CAP_NET_ADMIN and /dev/net/tun)."""

    name = "wireguard-go"

    def __init__(self, *, ifname: str, state_dir: Path | None = None, binary: str = BINARY,
                 socket_dir: str = uapi.SOCKET_DIR) -> None:
        self.ifname = check_ifname(ifname)  # state_dir: accepted and ignored (no files of ours)
        self.binary = binary
        self.socket_path = uapi.socket_path(ifname, socket_dir)
        self._proc: asyncio.subprocess.Process | None = None
        self._stderr: IO[bytes] | None = None
        self._lock = asyncio.Lock()

    @classmethod
    def is_supported(cls, binary: str = BINARY) -> Support:
        path = shutil.which(binary)
        if path is None:
            return Support(False, f"{binary} not found on PATH (install the wireguard-go package)")
        if not has_capability(CAP_NET_ADMIN):
            return Support(False, "no CAP_NET_ADMIN (needed to create a TUN interface and set routes)")
        ok, why = tun_usable()
        if not ok:
            return Support(False, why)
        return Support(True, f"{path} present, /dev/net/tun usable, CAP_NET_ADMIN held")

    # ------------------------------------------------------------ lifecycle

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    async def start(self, tasks: Tasks | None = None) -> None:
        """Run the child and wait for its UAPI socket. No task of ours: ``tasks`` is not needed."""
        async with self._lock:
            if self.running:
                return
            await self._clear_stale_socket()
            env = dict(os.environ)
            env[ENV_PREFER_USERSPACE] = "1"
            env.setdefault("LOG_LEVEL", "error")
            # Its stderr (a banner, then errors) goes to a private temporary file that we
            # quote when it fails to start; no reader task needed.
            self._stderr = tempfile.TemporaryFile()
            try:
                self._proc = await process.spawn(
                    self.binary, "-f", self.ifname,
                    stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=self._stderr,
                    env=engine_env(env),
                )
            except OSError as err:
                raise EngineError(f"cannot run {self.binary}: {err}") from None
            deadline = time.monotonic() + START_TIMEOUT
            while True:
                if self._proc.returncode is not None:
                    raise EngineError(f"{self.binary} -f {self.ifname} exited with status {self._proc.returncode} "
                                      f"before its UAPI socket was ready: {self._stderr_tail()}")
                if os.path.exists(self.socket_path):
                    try:
                        await uapi.get_device(self.socket_path)
                        break
                    except EngineError:
                        pass
                if time.monotonic() > deadline:
                    await self._terminate()
                    raise EngineError(f"{self.binary} did not open {self.socket_path} within {START_TIMEOUT:.0f} s")
                await asyncio.sleep(SOCKET_POLL)
            log.info("wireguard-go running for %s (pid %s)", self.ifname, self._proc.pid)

    def _stderr_tail(self, limit: int = 2000) -> str:
        if self._stderr is None:
            return ""
        self._stderr.seek(0)
        text = self._stderr.read().decode("utf-8", "replace")
        lines = [ln for ln in text.splitlines() if ln.strip() and not set(ln.strip()) <= set("│┌┐└┘─ ")]
        lines = [ln for ln in lines if "│" not in ln]  # drop the "use the kernel module" banner
        return " / ".join(lines)[-limit:] or "no message"

    async def _clear_stale_socket(self) -> None:
        if not os.path.exists(self.socket_path):
            return
        try:
            await uapi.get_device(self.socket_path)
        except EngineError:
            os.unlink(self.socket_path)  # nobody listens: a leftover from a crash
            return
        raise EngineError(f"another WireGuard process already serves {self.socket_path}; choose another interface name")

    async def apply(self, desired: DesiredConfig, workload: WorkloadConfig | None = None) -> bool:
        """Diff the device over UAPI and the interface settings into ``desired``; True when anything
        changed. ``workload`` is not needed: the OS routes serve it."""
        if not self.running:
            await self.start()
        async with self._lock:
            resolved = await resolve_once(desired)
            device = await uapi.get_device(self.socket_path)
            requests = apply_requests(device, resolved)
            # the interface settings (netlink, in a thread) while wireguard-go takes the peers
            async with asyncio.TaskGroup() as tg:
                configured = tg.create_task(netconf.run_blocking(
                    netconf.configure, self.ifname, desired.address, desired.mtu, desired.routes),
                    name=f"wireguard-go-netconf-{self.ifname}")
                for request in requests:
                    await uapi.set_device(self.socket_path, request)
            return bool(requests) or netconf.changed(configured.result())

    async def update_peers(self, upsert: Sequence[PeerConfig], remove: Sequence[str]) -> bool:
        """One ``set=1`` with only these peers (no ``get=1``, no other peer touched); large
        changes go in :data:`SET_CHUNK`-peer writes. False when the child is not running
        (the caller's ``apply()`` starts it and sets everything)."""
        if not self.running or not all(endpoint_is_literal(p.endpoint) for p in upsert):
            return False  # a name to resolve: apply() has the endpoint policy
        upsert, remove = tuple(upsert), tuple(remove)
        async with self._lock:
            for start in range(0, max(len(upsert), len(remove)), SET_CHUNK):
                await uapi.set_device(self.socket_path, update_request(upsert[start:start + SET_CHUNK],
                                                                        remove[start:start + SET_CHUNK]))
        return True

    async def send_keepalive(self, gateways: Collection[str]) -> bool:
        """A WireGuard keepalive to each of ``gateways`` now: their interval read and, in one
        ``set=1``, turned off and on again (:func:`keepalive_request`); no data packet."""
        if not self.running:
            return False
        try:
            async with self._lock:  # no apply() between the read and the write
                request = keepalive_request(await uapi.get_device(self.socket_path), gateways)
                if request is None:
                    return False
                await uapi.set_device(self.socket_path, request)
        except (EngineError, ProtocolError) as err:
            log.debug("wireguard-go: no keepalive sent: %s", err)
            return False
        return True

    async def status(self) -> EngineStatus:
        if not self.running:
            return EngineStatus(engine=self.name, interface=self.ifname, listen_port=0, running=False)
        device = await uapi.get_device(self.socket_path)
        return status_from_device(self.name, self.ifname, device, True)

    async def dump(self) -> uapi.UapiDevice:
        """The raw UAPI view (tests compare two dumps to check that apply() changed nothing)."""
        return await uapi.get_device(self.socket_path)

    async def _terminate(self) -> None:
        proc = self._proc
        if proc is None or proc.returncode is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(STOP_GRACE):
                await proc.wait()
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()

    async def stop(self) -> None:
        async with self._lock:
            await self._terminate()
            self._proc = None
            if self._stderr is not None:
                self._stderr.close()
                self._stderr = None
            await netconf.run_blocking(netconf.delete_link, self.ifname)
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass

    def dialer(self, resolver: NameResolver | None = None) -> OSDialer:
        """An OS dialer: the routes through the interface carry the traffic."""
        from anex_agent.net.dialer import OSDialer

        return OSDialer(resolver)

    def datagram_dialer(self, resolver: NameResolver | None = None) -> OSDatagramDialer:
        """Kernel UDP sockets: the routes through the interface carry the datagrams."""
        from anex_agent.net.datagram import OSDatagramDialer

        return OSDatagramDialer(resolver)
