"""The built-in user-space WireGuard engine: the sans-I/O core (:mod:`anex_agent.wg`) over a Bind.

Two layers:

* :class:`UserspaceTunnel` -- the driver. It feeds datagrams from a :class:`Bind` into
  :class:`anex_agent.wg.device.Device`, sends what the device returns, keeps one
  ``loop.call_at`` timer armed at the device's ``next_deadline``, and exposes the packet
  interface an IP layer uses: :meth:`UserspaceTunnel.send_packet` and
  :meth:`UserspaceTunnel.send_packets` (IPv4/IPv6 packets into the tunnel) and either an
  ``on_packet`` callback (or ``on_packets``, all that one batch decrypted at once) or
  :meth:`receive_packet` (decrypted packets out of it). ``now`` is
  the event loop's monotonic clock. Work goes in batches: a Bind that pushes (``set_receiver``)
  hands over all that one wake-up read, which is decrypted and delivered in one pass with one
  deadline computation and one timer; the datagrams the device returns go out with one
  ``send_batch``.
* :class:`UserspaceEngine` -- the :class:`anex_agent.tunnels.engines.base.Engine` contract
  around it: ``apply(desired)`` creates the device and a :class:`UdpBind` on the desired
  port and diffs peers into the device. It creates no OS interface and needs no
  privileges. Its receive loop is a task of the owning role (``start(tasks)``).
  The user-space TCP/IP stack (:mod:`anex_agent.netstack`) sits on the tunnel's packets
  once the workload needs it: :meth:`UserspaceEngine.dialer` gives a
  :class:`~anex_agent.netstack.dialer.NetstackDialer` (the proxy and the ``GW_TUNNEL``
  forwards), cluster DNS goes over the stack's UDP, and ``apply(desired, workload)``
  listens on the workload's inbound ports at the mesh address and relays each connection
  (TCP) or each mesh peer's datagrams (UDP) to ``127.0.0.1:<port>``
  (:mod:`anex_agent.frontends.inbound`). Until then (a bare
  tunnel) packets go to ``on_packet`` or :meth:`UserspaceTunnel.receive_packet`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import re
import time
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import TYPE_CHECKING

from anex_agent.errors import ConfigError, EngineError, LocalProtocolError
from anex_agent.wire.keys import decode_key, encode_key
from anex_agent.tunnels.os import netconf
from anex_agent.tunnels.engines.base import Engine
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.peer_plan import plan_peers
from anex_agent.tunnels.engines.status import EngineStatus, PeerStatus, Support
from anex_agent.tunnels.binds.base import send_all, set_receiver
from anex_agent.tunnels.engines.endpoints import resolve_once
from anex_agent.tunnels.binds.udp import Bind, BindClosed, UdpBind
from anex_agent.wg.device import Device, Output, ReceivedPacket
from anex_agent.wg.peer import PeerConfig as WgPeerConfig

if TYPE_CHECKING:
    from anex_agent.net.dialer import NameResolver
    from anex_agent.netstack.aio import NetstackRuntime
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

#: Decrypted packets waiting for a reader of receive_packet() before we drop (like a full TUN queue).
PACKET_QUEUE = 4096
PacketHandler = Callable[[bytes, bytes], None]
_DIGITS = re.compile(r"\d+")


class UserspaceTunnel:
    """Runs a :class:`Device` over a :class:`Bind`. Call :meth:`run` in a task; :meth:`close` ends it."""

    def __init__(self, device: Device, bind: Bind, *, on_packet: PacketHandler | None = None) -> None:
        self.device = device
        self.bind = bind
        self.on_packet = on_packet
        #: When set, takes all packets one device call decrypted (ReceivedPacket list) instead of on_packet.
        self.on_packets: Callable[[list[ReceivedPacket]], None] | None = None
        self.events: collections.Counter[str] = collections.Counter()
        self.drop_reasons: collections.Counter[str] = collections.Counter()
        self._packets: asyncio.Queue[bytes] = asyncio.Queue(PACKET_QUEUE)
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._closed = False

    def now(self) -> float:
        return self._loop.time()

    async def run(self) -> None:
        """Receive datagrams until the Bind closes: pushed in batches where the Bind can, else one by one."""
        pushed = set_receiver(self.bind, self.receive_batch)
        receive, process = self.bind.receive, self.device.receive_datagram
        try:
            while True:
                data, endpoint = await receive()  # with a receiver set, only the close comes here
                self.handle(process(data, endpoint, self._loop.time()))
        except BindClosed:
            pass
        finally:
            if pushed:
                set_receiver(self.bind, None)
            self._cancel_timer()

    def receive_batch(self, batch: list) -> None:
        """Datagrams ``(data, endpoint)`` from the Bind, all processed before anything is sent or armed."""
        if not self._closed:
            self.handle(self.device.receive_datagrams(batch, self._loop.time()))

    def send_packet(self, packet: bytes) -> None:
        """Send an IP packet into the tunnel (routed by allowed IPs). Non-IP input raises LocalProtocolError."""
        self.handle(self.device.send_packet(packet, self._loop.time()))

    def send_packets(self, packets: list[bytes]) -> None:
        """Send IP packets into the tunnel in one pass (a packet that is not IP is dropped and counted)."""
        self.handle(self.device.send_packets(packets, self._loop.time()))

    async def receive_packet(self) -> bytes:
        """The next decrypted IP packet (only when no ``on_packet`` callback is set)."""
        return await self._packets.get()

    def call(self, operation: Callable[[float], Output]) -> None:
        """Run a device operation taking ``now`` (e.g. ``initiate_handshake``) and act on its output."""
        self.handle(operation(self._loop.time()))

    def handle(self, out: Output) -> None:
        """Act on a device output: send datagrams, deliver packets, count events, re-arm the timer."""
        if out.datagrams:
            send_all(self.bind, out.datagrams)
        if out.packets and self.on_packets is not None:
            try:
                self.on_packets(out.packets)
            except Exception:  # the IP layer's bug must not stop the tunnel
                log.exception("userspace wg: packet handler failed")
                self.drop_reasons["packet handler failed"] += len(out.packets)
            out.packets = []
        for received in out.packets:
            if self.on_packet is not None:
                try:
                    self.on_packet(received.packet, received.peer)
                except Exception:  # the IP layer's bug must not stop the tunnel
                    log.exception("userspace wg: packet handler failed")
                    self.drop_reasons["packet handler failed"] += 1
            else:
                try:
                    self._packets.put_nowait(received.packet)
                except asyncio.QueueFull:
                    self.drop_reasons["packet queue full"] += 1
        for event in out.events:
            self.events[event.kind] += 1
            if event.kind == "dropped":  # digits folded so attacker-chosen numbers cannot grow the table
                self.drop_reasons[_DIGITS.sub("N", event.detail)] += 1
            log.debug("wg %s %s %s", event.kind, event.peer.hex()[:8] if event.peer else "-", event.detail)
        self._arm(out.next_deadline)

    def close(self) -> None:
        self._closed = True
        self._cancel_timer()
        self.bind.close()

    def _arm(self, deadline: float | None) -> None:
        if deadline == self._timer_at or self._closed:
            return
        self._cancel_timer()
        if deadline is not None:
            self._timer_at = deadline
            self._timer = self._loop.call_at(deadline, self._fire)

    def _fire(self) -> None:
        self._timer = self._timer_at = None
        self.handle(self.device.update_timers(self._loop.time()))

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer = self._timer_at = None


def _endpoint_tuple(endpoint: str | None) -> tuple[str, int] | None:
    if endpoint is None:
        return None
    return netconf.split_host_port(endpoint)


def _wg_peer(peer: PeerConfig) -> WgPeerConfig:
    return WgPeerConfig(
        public_key=decode_key(peer.public_key, what="peer public_key"),
        allowed_ips=peer.allowed_ips,
        endpoint=_endpoint_tuple(peer.endpoint),
        preshared_key=decode_key(peer.preshared_key, what="peer preshared_key") if peer.preshared_key else None,
        persistent_keepalive=peer.persistent_keepalive or None,
    )


class UserspaceEngine(Engine):
    """WireGuard in this Python process over a UDP socket; no interface, no privileges."""

    name = "userspace"
    host_address = False  # no OS interface: the mesh address is not an address of this host
    takes_bind = True  # bind_factory: the agent's path (UDP or WebSocket) is its datagram transport

    def __init__(self, *, ifname: str | None = None, state_dir: Path | None = None, listen_host: str = "0.0.0.0",
                 on_packet: PacketHandler | None = None,
                 bind_factory: Callable[[int | None], Awaitable[Bind]] | None = None) -> None:
        """``bind_factory(listen_port)`` makes the datagram path (default: a :class:`UdpBind` on
        ``listen_host``); the WebSocket relay path passes its own Bind factory here."""
        self.ifname = ifname  # accepted and ignored: there is no OS interface (nor files: state_dir)
        self.listen_host = listen_host
        self.on_packet = on_packet
        self.bind_factory = bind_factory or (lambda port: UdpBind.open(port or 0, self.listen_host))
        self.tunnel: UserspaceTunnel | None = None
        self.address: str | None = None
        self._tasks: Tasks | None = None
        self._task: asyncio.Task | None = None
        self._private_key: bytes | None = None
        self._listen_port: int | None = None
        self._peers: tuple[PeerConfig, ...] = ()  # as applied (endpoints resolved)
        self._mtu = 1420
        self._netstack_wanted = False  # a dialer was asked for, or inbound ports: run the TCP/IP stack
        self.runtime: NetstackRuntime | None = None
        self._runtime_for: tuple[str, int] | None = None  # (address, mtu) the stack was built for
        self._inbound = None  # anex_agent.frontends.inbound.InboundServer
        self._inbound_task: asyncio.Task | None = None
        self._inbound_ports: tuple[int, ...] = ()
        self._inbound_udp_ports: tuple[int, ...] = ()

    def __repr__(self) -> str:
        return f"UserspaceEngine(running={self.tunnel is not None})"

    @classmethod
    def is_supported(cls) -> Support:
        return Support(True, "built-in user-space WireGuard (Python): needs only a UDP socket, no TUN or NET_ADMIN")

    @classmethod
    def workload_support(cls) -> Support:
        """Yes: its user-space TCP/IP stack serves the proxy, forwards and inbound ports."""
        return Support(True, "the built-in user-space TCP/IP stack serves the proxy, GW_TUNNEL forwards and "
                             "inbound ports (no capability, TUN device or binary needed)")

    async def start(self, tasks: Tasks) -> None:
        """Remember the role's ``tasks`` (the receive loop runs there); the device comes with the first apply()."""
        self._tasks = tasks

    async def apply(self, desired: DesiredConfig, workload: WorkloadConfig | None = None) -> bool:
        """Create the device/socket when needed and diff peers in; True when anything changed.
        Endpoint names are resolved once (the agent gives literals and follows names itself)."""
        if self._tasks is None:
            raise EngineError("the userspace engine was not started: call start(tasks) first")
        resolved = (await resolve_once(desired)).peers
        changed = False
        try:
            if (self.tunnel is None or desired.private_key != self._private_key
                    or desired.listen_port != self._listen_port or desired.mtu != self._mtu):
                await self._restart(desired)
                changed = True
            changed |= self.address != desired.address
            self.address = desired.address
            changed |= self._apply_peers(resolved)
        except LocalProtocolError as err:
            raise EngineError(f"userspace engine refused the config: {err}") from None
        if workload is not None and (tuple(workload.inbound_ports), tuple(workload.inbound_udp_ports)) != (
                self._inbound_ports, self._inbound_udp_ports):
            self._inbound_ports = tuple(workload.inbound_ports)
            self._inbound_udp_ports = tuple(workload.inbound_udp_ports)
            self._netstack_wanted |= bool(self._inbound_ports or self._inbound_udp_ports)
            changed = True
        if self._netstack_wanted:
            self._ensure_runtime()
        return changed

    # ---------------------------------------------------------------- the TCP/IP stack

    def _ensure_runtime(self) -> None:
        """Build the stack for the current address and MTU (again when they changed), listen on the inbound ports."""
        from anex_agent.netstack.aio import NetstackRuntime
        from anex_agent.netstack.stack import Stack

        if self.tunnel is None or self.address is None:
            return
        want = (self.address.split("/")[0], self._mtu)
        if self.runtime is None or self._runtime_for != want:
            if self.runtime is not None:
                self.runtime.close()  # the address moved: connections of the old address cannot live on
            # WireGuard authenticated every packet the stack gets: no second checksum check
            self.runtime = NetstackRuntime(Stack(want[0], mtu=want[1], verify_checksums=False), self._send_packet,
                                           send_packets=self._send_packets)
            self._runtime_for = want
        self.tunnel.on_packet = self._deliver
        self.tunnel.on_packets = self._deliver_all
        self._sync_inbound()

    def _deliver(self, packet: bytes, peer: bytes) -> None:
        if self.runtime is not None:
            self.runtime.deliver(packet)

    def _deliver_all(self, received: list[ReceivedPacket]) -> None:
        if self.runtime is not None:
            self.runtime.deliver_packets([r.packet for r in received])

    def _send_packet(self, packet: bytes) -> None:
        if self.tunnel is not None:
            self.tunnel.send_packet(packet)

    def _send_packets(self, packets: list[bytes]) -> None:
        if self.tunnel is not None:
            self.tunnel.send_packets(packets)

    def _covers(self, address: str) -> bool:
        """Whether the tunnel carries ``address`` (some peer's allowed IPs hold it)."""
        import ipaddress

        if self.tunnel is None:
            return False
        try:
            packed = ipaddress.ip_address(address).packed
        except ValueError:
            return False
        return self.tunnel.device.peer_for(packed) is not None

    async def serve_on_mesh(self, port: int, protocol_factory) -> bool:
        """Serve ``port`` at the mesh address from the stack (the agent API's mesh side)."""
        from anex_agent.frontends.inbound import InboundServer

        if self._tasks is None:
            return False
        if self._inbound is None:
            self._inbound = InboundServer()
            self._inbound_task = self._tasks.spawn("userspace-inbound", self._inbound.run)
        self._inbound.serve_protocol(port, protocol_factory)
        self._netstack_wanted = True
        self._ensure_runtime()
        return True

    def _sync_inbound(self) -> None:
        from anex_agent.frontends.inbound import InboundServer

        assert self.runtime is not None and self._tasks is not None
        if self._inbound is None:
            self._inbound = InboundServer()
            self._inbound_task = self._tasks.spawn("userspace-inbound", self._inbound.run)
        self._inbound.sync(self.runtime, self._inbound_ports, self._inbound_udp_ports)

    def _apply_peers(self, resolved: tuple[PeerConfig, ...]) -> bool:
        assert self.tunnel is not None
        plan = plan_peers(self._peers, resolved)
        device = self.tunnel.device
        for key in plan.remove:
            device.remove_peer(decode_key(key))
        for peer in plan.add + plan.update:
            device.set_peer(_wg_peer(peer))
        self._peers = resolved
        for peer in plan.add + plan.update:  # like wg(8): a keepalive peer handshakes at once
            key = decode_key(peer.public_key)
            wg_peer = device.peer(key)
            if peer.endpoint is not None and peer.persistent_keepalive and wg_peer.keypairs.current is None:
                self.tunnel.call(lambda now, key=key: device.initiate_handshake(key, now))
        return not plan.empty

    async def _restart(self, desired: DesiredConfig) -> None:
        assert self._tasks is not None
        await self._close()
        bind = await self.bind_factory(desired.listen_port)
        device = Device(desired.private_key, wall_time=time.time, mtu=desired.mtu)
        self.tunnel = tunnel = UserspaceTunnel(device, bind, on_packet=self.on_packet)
        self._task = self._tasks.spawn("userspace-wg-receive", tunnel.run)
        if self._netstack_wanted:
            tunnel.on_packet = self._deliver
            tunnel.on_packets = self._deliver_all
        self._private_key, self._listen_port, self._mtu = desired.private_key, desired.listen_port, desired.mtu
        self._peers = ()

    async def status(self) -> EngineStatus:
        if self.tunnel is None:
            return EngineStatus(self.name, None, 0, False)
        loop_now, wall_now = self.tunnel.now(), time.time()
        peers = []
        for peer in self.tunnel.device.peers():
            ep = peer.endpoint
            last = peer.stats.last_handshake
            peers.append(PeerStatus(
                public_key=encode_key(peer.public_key),
                endpoint=netconf.join_host_port(ep[0], ep[1]) if isinstance(ep, tuple) else None,
                last_handshake=None if last is None else wall_now - (loop_now - last),
                rx_bytes=peer.stats.rx_bytes,
                tx_bytes=peer.stats.tx_bytes,
                allowed_ips=tuple(str(n) for n in self.tunnel.device.allowed_ips(peer.public_key)),
            ))
        return EngineStatus(self.name, None, self.tunnel.bind.local_port, self._task is not None and not self._task.done(),
                            tuple(peers))

    async def send_keepalive(self, gateways: Collection[str]) -> bool:
        """A WireGuard keepalive to each of ``gateways`` (public keys) now, from the core
        (:meth:`anex_agent.wg.device.Device.send_keepalive`), through the engine's Bind."""
        tunnel = self.tunnel
        if tunnel is None:
            return False
        sent = False
        for key in gateways:
            try:
                public_key = decode_key(key, what="gateway public_key")
            except ConfigError:
                continue
            if tunnel.device.peer(public_key) is None:
                continue
            tunnel.call(lambda now, public_key=public_key: tunnel.device.send_keepalive(public_key, now))
            sent = True
        log.debug("userspace wg: keepalive to %s", "the gateways" if sent else "no gateway (not peers)")
        return sent

    async def handshake_now(self, desired: DesiredConfig, keys: Collection[str]) -> bool:
        """A new initiation to each of ``keys`` without a session, from the core
        (:meth:`Device.initiate_again`): the peers, their staged packets and timers stay."""
        tunnel = self.tunnel
        if tunnel is None:
            return False
        asked = False
        for key in keys:
            try:
                public_key = decode_key(key, what="peer public_key")
            except ConfigError:
                continue
            if tunnel.device.peer(public_key) is not None:
                tunnel.call(lambda now, public_key=public_key: tunnel.device.initiate_again(public_key, now))
                asked = True
        return asked

    def dialer(self, resolver: NameResolver | None = None):
        """A :class:`~anex_agent.netstack.dialer.NetstackDialer`; cluster DNS goes over the stack too
        (when ``resolver`` takes a DNS transport: :class:`anex_agent.net.resolver.ResolverSlot`)."""
        from anex_agent.netstack.dialer import NetstackDialer, NetstackDnsTransport
        from anex_agent.net.resolver import Resolver

        self._netstack_wanted = True
        self._ensure_runtime()
        if resolver is None:
            resolver = Resolver()
        use_transport = getattr(resolver, "use_transport", None)
        if use_transport is not None:
            use_transport(NetstackDnsTransport(lambda: self.runtime))
        return NetstackDialer(lambda: self.runtime, self._covers, resolver)

    def datagram_dialer(self, resolver: NameResolver | None = None):
        """A :class:`~anex_agent.netstack.dialer.NetstackDatagramDialer`: the tunnel's destinations
        through UDP ports of the stack, others through the OS; names through ``resolver`` (give
        the one :meth:`dialer` got, which carries cluster DNS over the stack)."""
        from anex_agent.netstack.dialer import NetstackDatagramDialer
        from anex_agent.net.resolver import Resolver

        self._netstack_wanted = True
        self._ensure_runtime()
        return NetstackDatagramDialer(lambda: self.runtime, self._covers, resolver if resolver is not None else Resolver())

    def report(self) -> dict:
        if self.runtime is None:
            return {}
        inbound_udp = self._inbound.report() if self._inbound is not None else {}
        return {"netstack": self.runtime.report(), **({"inbound_udp": inbound_udp} if inbound_udp else {})}

    async def stop(self) -> None:
        """The stack (every connection reset), the inbound server, then the tunnel."""
        if self.runtime is not None:
            self.runtime.close()
            self.runtime = None
            self._runtime_for = None
        inbound, task = self._inbound, self._inbound_task
        self._inbound = self._inbound_task = None
        if inbound is not None:
            inbound.stop()
        await _cancelled(task)
        await self._close()

    async def _close(self) -> None:
        tunnel, task = self.tunnel, self._task
        self.tunnel = self._task = None
        self._private_key = None
        if tunnel is not None:
            tunnel.close()
        await _cancelled(task)


async def _cancelled(task: asyncio.Task | None) -> None:
    """Cancel ``task`` (if any) and wait until it has ended.

    ``asyncio.wait``, not ``await task`` in ``try/except CancelledError``: that would also
    swallow a cancellation of the caller itself (its stop, a TaskGroup leaving), which then
    carries on as if never cancelled."""
    if task is None:
        return
    task.cancel()
    await asyncio.wait({task})
