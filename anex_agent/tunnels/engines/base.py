"""The engine contract: what every WireGuard engine (kernel, wireguard-go, userspace, wireproxy) provides.

An *engine* turns a :class:`~anex_agent.tunnels.engines.config.DesiredConfig` into a working WireGuard tunnel and gives the
workload what it needs to use it: either a *dialer* (the agent's own front-ends, the HTTP
proxy and the forwards, open connections through it) or front-ends of its own
(wireproxy). The agent and the gateway drive every engine the same way::

    support = EngineClass.is_supported()         # Support(ok, reason); never raises
    EngineClass.check_workload(workload)         # ConfigError naming a WorkloadConfig field it cannot serve
    engine = EngineClass(ifname=new_ifname(), state_dir=path)   # keyword-only; constructors do no I/O
    await engine.start(tasks)                    # the role's anex_agent.tasks.Tasks owns every task it starts
    changed = await engine.apply(desired, workload)   # declarative; True when anything changed
    done = await engine.update_peers(upsert, remove)  # only these peers, one small write (False: use apply)
    dialer = engine.dialer(resolver)             # a Dialer, or None: the engine serves the workload itself
    datagrams = engine.datagram_dialer(resolver) # a DatagramDialer (UDP for the SOCKS5 proxy), or None
    status = await engine.status()               # handshakes, bytes, endpoints
    verdict = await engine.readiness()           # its own verdict, or None: judge by the last handshake
    await engine.reset_sessions(desired)         # fresh handshakes now (a gateway restarted)
    await engine.send_keepalive(keys)            # a WireGuard keepalive to these peers now (pull a hub back)
    await engine.handshake_now(desired, keys)    # a new initiation to these session-less peers now
    details = engine.report()                    # engine-specific facts for /status ({} for most)
    await engine.stop()                          # nothing of ours is left afterwards

Contracts every engine keeps:

* ``apply(desired, workload)`` is declarative and idempotent: the same config twice
  changes nothing on the second call and returns False (tailscale's ``Reconfig``
  answering ``ErrNoChanges``); peers are added, removed and updated by diff (see
  :func:`anex_agent.tunnels.engines.peer_plan.plan_peers`), so a peer whose config did
  not change keeps its session. ``workload``
  (:class:`~anex_agent.tunnels.engines.config.WorkloadConfig`) is what the workload is
  offered; engines that serve it themselves render it, the others ignore it; ``None``
  keeps the last one.
* Peer endpoints arrive as IP literals from the agent, which resolves names with one
  policy for every engine and re-applies when a name moves
  (:mod:`anex_agent.tunnels.engines.endpoints`); an engine given a name resolves it once.
* Every task an engine runs is spawned through the ``tasks`` given to ``start()``
  (named, owned by the role's TaskGroup; a failure is logged and the task restarted, or
  the role stops). Every child process is started with
  :func:`anex_agent.tunnels.os.process.spawn` (it dies with us).
* ``stop()`` leaves no interface, route, process, task or socket of ours; calling it
  twice, or before ``start()``, is fine. Errors raise :class:`anex_agent.errors.EngineError`.
* Constructors take keyword-only ``ifname`` and ``state_dir`` (engines with no OS
  interface or no files accept and ignore them) and do no I/O.
* The private key is never logged, never part of ``repr()``, never serialised.

Names of our interfaces start with :data:`anex_agent.tunnels.engines.ifnames.IFNAME_PREFIX`
so that ``anex-agent cleanup`` can find leftovers after a crash.

Beside the contract: what an engine is given (:mod:`.config`) and reports (:mod:`.status`), the
peer diff engines apply by (:mod:`.peer_plan`), interface names (:mod:`.ifnames`), and the
engine choice behind ``--engine`` (:mod:`.registry`).
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import logging
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from anex_agent.net.datagram import DatagramDialer
from anex_agent.net.dialer import Dialer, NameResolver
from anex_agent.errors import EngineError
from anex_agent.tunnels.engines.config import DesiredConfig, PeerConfig, WorkloadConfig
from anex_agent.tunnels.engines.status import EngineStatus, Support

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)


class Engine(abc.ABC):
    """Base class of the engines. See the module docstring for the contracts."""

    #: The name used by ``--engine`` / ``ANEX_ENGINE`` and in reports.
    name: ClassVar[str]
    #: Who serves the workload's proxy, ``GW_TUNNEL`` ports and inbound ports: ``"dialer"``
    #: (the agent's front-ends over :meth:`dialer`) or ``"engine"`` (the engine runs its own,
    #: like wireproxy: :meth:`dialer` returns None and ``apply()`` renders the WorkloadConfig).
    #: ``choose_engine`` reads it so that a bare tunnel (the gateway) never gets such an engine.
    frontends: ClassVar[str] = "dialer"
    #: Whether the mesh address becomes an address of this host (an OS interface), so that
    #: local sockets (the agent API, the workload's ports) can listen on it.
    host_address: ClassVar[bool] = True
    #: Whether the constructor takes ``bind_factory`` (an async ``(listen_port) -> Bind``,
    #: :mod:`anex_agent.tunnels.binds.base`): the engine then sends its datagrams through the Bind it
    #: is given (the agent's WebSocket path plugs in there, no local UDP hop). False: the engine
    #: owns its UDP socket, and the WebSocket path is a local relay its peer endpoint points at.
    takes_bind: ClassVar[bool] = False

    @classmethod
    def workload_support(cls) -> Support:
        """Whether this engine, once running, can serve a node's workload: the HTTP proxy,
        ``GW_TUNNEL`` forwards and inbound ports (through a dialer, or by itself). A class-level
        answer (no probe): the agent's ``auto`` skips engines that say no. Default: an OS dialer."""
        return Support(True, "the OS routes through its interface serve the proxy, forwards and inbound ports")

    @classmethod
    def check_workload(cls, workload: WorkloadConfig) -> None:
        """Raise ConfigError naming the :class:`WorkloadConfig` field this engine cannot serve.

        Called before the engine is built, so a setting it cannot honour stops the agent early.
        Default: everything (the agent's own front-ends serve it over the dialer)."""

    @classmethod
    @abc.abstractmethod
    def is_supported(cls) -> Support:
        """Probe whether this engine can run here. Never raises; cheap enough for ``detect``."""

    @abc.abstractmethod
    async def start(self, tasks: Tasks) -> None:
        """Create the interface/process with no peers. Idempotent. Raises EngineError.

        ``tasks`` belongs to the role that owns the engine: every task the engine runs, now
        or later, is spawned through it."""

    @abc.abstractmethod
    async def apply(self, desired: DesiredConfig, workload: WorkloadConfig | None = None) -> bool:
        """Make the tunnel (and, for engines serving the workload, its front-ends) match by diff.

        Idempotent: returns True when anything changed, False when all already matched.
        ``workload`` None keeps the last one given. Raises EngineError."""

    @abc.abstractmethod
    async def status(self) -> EngineStatus:
        """Current state as seen by the engine (handshakes, bytes)."""

    @abc.abstractmethod
    async def stop(self) -> None:
        """Tear everything down; leaves nothing of ours. Idempotent, safe before start()."""

    @abc.abstractmethod
    def dialer(self, resolver: NameResolver) -> Dialer | None:
        """What the workload's front-ends dial through, or None when the engine serves them itself.

        Kernel and wireguard-go return ``anex_agent.net.dialer.OSDialer(resolver)``: routes do
        the work. ``resolver`` resolves mesh/cluster names; the caller may change what it
        answers later (see :class:`anex_agent.net.resolver.ResolverSlot`), the dialer keeps it.
        """

    def datagram_dialer(self, resolver: NameResolver) -> DatagramDialer | None:
        """What the workload's UDP goes through (the SOCKS5 proxy's UDP ASSOCIATE), beside
        :meth:`dialer` and with the same ``resolver``; None (the default): the engine carries
        no datagrams for the agent's front-ends. Kernel and wireguard-go return
        ``anex_agent.net.datagram.OSDatagramDialer(resolver)``; call it after :meth:`dialer`."""
        return None

    async def serve_on_mesh(self, port: int, protocol_factory) -> bool:
        """Serve ``port`` of the mesh address with an asyncio protocol per connection
        (``protocol_factory()``), where the engine itself holds the mesh address (no OS
        interface: :attr:`host_address` False). The protocol's transport reports the mesh
        peer as ``peername``. False (the default): the engine cannot; an engine with an OS
        interface never needs to (listen on the address with a socket)."""
        return False

    async def send_keepalive(self, gateways: Collection[str]) -> bool:
        """Make the engine send a WireGuard keepalive to each of ``gateways`` (peer public keys) now.

        What for: after a UDP probe (a handshake from another socket) the hub answers that
        socket until this engine's next datagram reaches it; this pulls the hub back at once.
        A keepalive, never a data packet: WireGuard starts a new handshake when data it sent
        got no answer within 15 s (KEEPALIVE_TIMEOUT + REKEY_TIMEOUT, whitepaper §6.5), and
        nothing answers a datagram sent only to pull the hub back, so each such nudge of an
        idle node would cost a handshake. A keepalive starts no timer. A peer without a
        session gets a handshake initiation first (the keepalive follows it), as WireGuard
        does for any send. Keys that are not peers are skipped. Returns whether anything
        was sent; never raises. Default: False (the engine cannot); every built-in engine
        with a tunnel of its own overrides it."""
        return False

    async def readiness(self) -> tuple[bool, str] | None:
        """The engine's own readiness verdict, or None to judge by the last handshake (default)."""
        return None

    def report(self) -> dict[str, Any]:
        """Engine-specific facts for the agent's ``/status`` (under the engine's name); ``{}`` for none."""
        return {}

    async def update_peers(self, upsert: Sequence[PeerConfig], remove: Sequence[str]) -> bool:
        """Change only the peers named, without reading or rewriting the others.

        Each of ``upsert`` is created or, when its key exists, replaced (allowed IPs replaced,
        keepalive and preshared key as given, an endpoint of None keeps the learned one); each
        public key of ``remove`` is deleted (absent keys are no error). One small engine write
        for a small change, whatever the size of the peer set: what a hub with thousands of
        peers needs per watch event. Returns False when this engine cannot change peers one by
        one; the caller then applies the whole config with :meth:`apply`. Raises EngineError.
        Default: False."""
        return False

    async def handshake_now(self, desired: DesiredConfig, keys: Collection[str]) -> bool:
        """A new handshake initiation to each peer of ``desired`` named in ``keys`` now, also within
        WireGuard's REKEY_TIMEOUT (5 s, whitepaper §6.4) of the last one. For peers that have no
        session yet: a gateway that did not know this node when its first initiation came (the
        coordinator told it a moment later) answers the next one; the caller asks with a back-off.

        Default: drop those peers and add them again (:meth:`update_peers`, else :meth:`apply`
        without them, then with them): a new peer has no last initiation, and one with a persistent
        keepalive initiates at once (kernel, wireguard-go). What was queued for them is dropped;
        they had no session. Returns whether anything was asked; raises EngineError."""
        peers = tuple(p for p in desired.peers if p.public_key in keys)
        if not peers:
            return False
        if await self.update_peers((), tuple(p.public_key for p in peers)):
            return await self.update_peers(peers, ())
        await self.apply(dataclasses.replace(desired, peers=tuple(p for p in desired.peers if p.public_key not in keys)))
        await self.apply(desired)
        return True

    async def reset_sessions(self, desired: DesiredConfig, *, within: float = 10.0, every: float = 1.0) -> bool:
        """Start fresh handshakes with ``desired``'s peers now (a gateway restarted and lost its sessions).

        Default: drop and re-add the peers (a keepalive peer initiates at once), repeated every
        ``every`` s until a handshake newer than the reset is seen or ``within`` s pass (the
        gateway's interface may still be coming up and lose the first initiation). Returns
        True when such a handshake was seen. Engines without peer-level control override it.
        """
        if not desired.peers:
            return False
        started = time.time()
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            await self.apply(dataclasses.replace(desired, peers=()))
            await self.apply(desired)
            retry_at = time.monotonic() + every
            while time.monotonic() < min(retry_at, deadline):
                await asyncio.sleep(0.1)
                try:
                    status = await self.status()
                except EngineError as err:
                    log.debug("engine status failed during a session reset: %s", err)
                    continue
                if any(p.last_handshake and p.last_handshake >= started for p in status.peers):
                    log.info("gateway sessions reset: handshake after %.1f s", time.time() - started)
                    return True
        log.warning("gateway sessions reset, but no handshake within %.0f s; WireGuard keeps retrying", within)
        return False
