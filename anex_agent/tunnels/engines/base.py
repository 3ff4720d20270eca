"""The engine contract: what every WireGuard engine (kernel, wireguard-go, userspace, wireproxy) provides.

An *engine* turns a :class:`DesiredConfig` into a working WireGuard tunnel and gives the
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
    status = await engine.status()               # handshakes, bytes, endpoints
    verdict = await engine.readiness()           # its own verdict, or None: judge by the last handshake
    await engine.reset_sessions(desired)         # fresh handshakes now (a gateway restarted)
    engine.send_keepalive({key: mesh_address})   # one datagram to each gateway now (pull a hub back)
    await engine.handshake_now(desired, keys)    # a new initiation to these session-less peers now
    details = engine.report()                    # engine-specific facts for /status ({} for most)
    await engine.stop()                          # nothing of ours is left afterwards

Contracts every engine keeps:

* ``apply(desired, workload)`` is declarative and idempotent: the same config twice
  changes nothing on the second call and returns False (tailscale's ``Reconfig``
  answering ``ErrNoChanges``); peers are added, removed and updated by diff (see
  :func:`plan_peers`), so a peer whose config did not change keeps its session.
  ``workload`` (:class:`WorkloadConfig`) is what the workload is offered; engines that
  serve it themselves render it, the others ignore it; ``None`` keeps the last one.
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

Names of our interfaces start with :data:`IFNAME_PREFIX` so that ``anex-agent cleanup``
can find leftovers after a crash.
"""

from __future__ import annotations

import abc
import asyncio
import dataclasses
import ipaddress
import logging
import socket
import time
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

from anex_agent.net.dialer import Dialer, NameResolver
from anex_agent import parse
from anex_agent.errors import ConfigError, EngineError, config_value

if TYPE_CHECKING:
    from anex_agent.tasks import Tasks

log = logging.getLogger(__name__)

#: RFC 863's discard port: where :meth:`Engine.send_keepalive` sends on an OS interface.
DISCARD_PORT = 9
#: Interfaces (and wireguard-go UAPI sockets) we create are named ``anx<something>``.
IFNAME_PREFIX = "anx"
#: Linux IFNAMSIZ is 16 including the terminating NUL (include/uapi/linux/if.h).
IFNAME_MAX = 15

#: Order in which ``--engine auto`` tries engines: the first supported one wins. For the
#: agent (``choose_engine(..., for_workload=True)``) an engine must also be able to serve
#: the workload (:meth:`Engine.workload_support`). The built-in userspace engine (WireGuard
#: and a TCP/IP stack in this process) needs no capability, TUN device or binary, so a node
#: where kernel WireGuard and wireguard-go cannot run gets it; wireproxy, an external binary,
#: is taken by auto only where userspace cannot serve.
AUTO_ORDER: tuple[str, ...] = ("kernel", "wireguard-go", "userspace", "wireproxy")


@dataclass(frozen=True)
class Support:
    """Answer of ``is_supported()``: ``ok`` and, always, a human ``reason`` (why not, or what was found)."""

    ok: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"supported": self.ok, "reason": self.reason}


@dataclass(frozen=True)
class PeerConfig:
    """One WireGuard peer as we want it. ``public_key`` is base64 (44 characters).

    ``endpoint`` is ``HOST:PORT`` (IPv6 host in brackets) or ``None`` for a peer that
    only ever connects to us. ``allowed_ips`` are CIDR strings, kept in the given
    order but compared as a set. ``persistent_keepalive`` 0 disables it
    (whitepaper §6.5, "Passive keepalive" / wg(8) PersistentKeepalive).
    """

    public_key: str
    endpoint: str | None
    allowed_ips: tuple[str, ...]
    persistent_keepalive: int = 0
    preshared_key: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if not 0 <= self.persistent_keepalive <= 65535:
            raise ConfigError("persistent_keepalive", f"{self.persistent_keepalive} is outside 0..65535")
        for cidr in self.allowed_ips:
            config_value("allowed_ips", parse.cidr_text, cidr)

    def allowed_set(self) -> frozenset[str]:
        """Allowed IPs normalised (host bits cleared) as a set, for comparisons."""
        return frozenset(str(ipaddress.ip_network(c, strict=False)) for c in self.allowed_ips)


@dataclass(frozen=True)
class DesiredConfig:
    """The whole tunnel as we want it.

    ``private_key`` is 32 raw bytes; it is excluded from ``repr`` and never serialised.
    ``listen_port`` ``None`` lets the engine pick a random port (nodes); gateways set it.
    ``address`` is the interface address in CIDR form (``10.254.0.5/16`` or ``/32``).
    ``routes`` are extra networks routed into the interface (besides the address's own
    network); engines add them with the interface as the device.
    """

    private_key: bytes = field(repr=False)
    listen_port: int | None
    address: str
    mtu: int
    peers: tuple[PeerConfig, ...] = ()
    routes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.private_key) != 32:
            raise ConfigError("private_key", "must be 32 raw bytes (an X25519 private key)")
        if self.listen_port is not None and not 0 <= self.listen_port <= 65535:
            raise ConfigError("listen_port", f"{self.listen_port} is outside 0..65535")
        try:
            ipaddress.ip_interface(self.address)
        except ValueError:
            raise ConfigError("address", f"{self.address!r} is not an address in CIDR form (e.g. 10.254.0.5/16)") from None
        if not 1280 <= self.mtu <= 9000:
            raise ConfigError("mtu", f"{self.mtu} is outside 1280..9000")
        keys = [p.public_key for p in self.peers]
        if len(keys) != len(set(keys)):
            raise ConfigError("peers", "the same public key appears twice")
        for cidr in self.routes:
            config_value("routes", parse.cidr, cidr)


@dataclass(frozen=True)
class PeerStatus:
    """What the engine reports about one peer. ``last_handshake`` is a UNIX time, ``None`` if never."""

    public_key: str
    endpoint: str | None
    last_handshake: float | None
    rx_bytes: int
    tx_bytes: int
    allowed_ips: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "public_key": self.public_key,
            "endpoint": self.endpoint,
            "last_handshake": self.last_handshake,
            "rx_bytes": self.rx_bytes,
            "tx_bytes": self.tx_bytes,
            "allowed_ips": list(self.allowed_ips),
        }


@dataclass(frozen=True)
class EngineStatus:
    """What the engine reports about itself. ``listen_port`` is the actual UDP port (0 if none)."""

    engine: str
    interface: str | None
    listen_port: int
    running: bool
    peers: tuple[PeerStatus, ...] = ()

    def peer(self, public_key: str) -> PeerStatus | None:
        return next((p for p in self.peers if p.public_key == public_key), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "engine": self.engine,
            "interface": self.interface,
            "listen_port": self.listen_port,
            "running": self.running,
            "peers": [p.to_dict() for p in self.peers],
        }


@dataclass(frozen=True)
class Forward:
    """A TCP forward offered to the workload: ``127.0.0.1:listen_port`` -> ``target`` (``HOST:PORT``) over the mesh."""

    listen_port: int
    target: str


@dataclass(frozen=True)
class WorkloadConfig:
    """What the workload is offered, besides the tunnel: given to every engine with ``apply()``.

    ``proxy_address``: where the HTTP proxy listens (``HOST:PORT``); ``proxy_auth``:
    whether it must ask for credentials; ``socks_address``: where the SOCKS5 proxy listens
    (``""``: no SOCKS5 proxy), ``socks_auth``: whether it must ask for credentials; ``forwards``: ``GW_TUNNEL`` and pushed forwards;
    ``inbound_ports``: the workload's ports reachable from the mesh; ``dns``: cluster DNS
    servers; ``gateways``: the gateways' mesh addresses (for liveness checks).
    Engines that give a dialer ignore it (the agent serves the proxy and forwards);
    engines with front-ends of their own render it.
    """

    proxy_address: str = "127.0.0.1:3128"
    proxy_auth: bool = False
    socks_address: str = ""
    socks_auth: bool = False
    forwards: tuple[Forward, ...] = ()
    inbound_ports: tuple[int, ...] = ()
    dns: tuple[str, ...] = ()
    gateways: tuple[str, ...] = ()

    def tunnels(self) -> dict[int, str]:
        """Forwards as local port -> target."""
        return {f.listen_port: f.target for f in self.forwards}


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

    async def serve_on_mesh(self, port: int, protocol_factory) -> bool:
        """Serve ``port`` of the mesh address with an asyncio protocol per connection
        (``protocol_factory()``), where the engine itself holds the mesh address (no OS
        interface: :attr:`host_address` False). The protocol's transport reports the mesh
        peer as ``peername``. False (the default): the engine cannot; an engine with an OS
        interface never needs to (listen on the address with a socket)."""
        return False

    def send_keepalive(self, gateways: Mapping[str, str]) -> bool:
        """Make the engine send one datagram to each of ``gateways`` (public key -> mesh address) now.

        What for: after a UDP probe (a handshake from another socket) the hub answers that
        socket until this engine's next datagram reaches it; this pulls the hub back at once.
        Default, for an engine with an OS interface: one empty UDP datagram to each mesh
        address (the discard port), which the host routes into the tunnel and the gateway
        drops after WireGuard took it. Engines without one override it (the built-in engine
        sends a WireGuard keepalive). Returns whether anything was sent; never raises."""
        if not self.host_address:
            return False
        sent = False
        for address in gateways.values():
            family = socket.AF_INET6 if ":" in address else socket.AF_INET
            try:
                with socket.socket(family, socket.SOCK_DGRAM) as sock:
                    sock.sendto(b"", (address, DISCARD_PORT))
                sent = True
            except OSError:
                pass
        return sent

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


# ---------------------------------------------------------------- diff planning (pure)


@dataclass(frozen=True)
class PeerPlan:
    """What to change to go from the current peers to the desired ones.

    ``add``: peers to create; ``update``: peers that exist but differ (the whole desired
    peer is given; engines replace allowed IPs and set endpoint/keepalive/psk);
    ``remove``: public keys to delete. Empty plan == nothing to do.
    """

    add: tuple[PeerConfig, ...] = ()
    update: tuple[PeerConfig, ...] = ()
    remove: tuple[str, ...] = ()

    @property
    def empty(self) -> bool:
        return not (self.add or self.update or self.remove)


def _same_peer(current: PeerConfig, desired: PeerConfig) -> bool:
    # A desired endpoint of None means "learn it from the peer": do not reset a roamed endpoint.
    endpoint_ok = desired.endpoint is None or current.endpoint == desired.endpoint
    return (
        endpoint_ok
        and current.allowed_set() == desired.allowed_set()
        and current.persistent_keepalive == desired.persistent_keepalive
        and (current.preshared_key or None) == (desired.preshared_key or None)
    )


def plan_peers(current: tuple[PeerConfig, ...] | list[PeerConfig], desired: tuple[PeerConfig, ...]) -> PeerPlan:
    """Diff two peer lists by public key. Pure; the result is in a stable (desired) order."""
    have = {p.public_key: p for p in current}
    want = {p.public_key: p for p in desired}
    add = tuple(p for k, p in want.items() if k not in have)
    update = tuple(p for k, p in want.items() if k in have and not _same_peer(have[k], p))
    remove = tuple(k for k in have if k not in want)
    return PeerPlan(add=add, update=update, remove=remove)


def new_ifname(role: str = "") -> str:
    """A fresh, machine-unique-enough interface name: ``anx`` + role letter(s) + random hex (<= 15 chars)."""
    import secrets

    return check_ifname(f"{IFNAME_PREFIX}{role[:3]}{secrets.token_hex(4)}")


def check_ifname(ifname: str) -> str:
    """Validate an interface name we will create; returns it or raises ConfigError."""
    if not ifname or len(ifname) > IFNAME_MAX or "/" in ifname or any(c.isspace() for c in ifname):
        raise ConfigError("interface", f"{ifname!r} is not a valid interface name (1-{IFNAME_MAX} characters, no '/' or spaces)")
    return ifname


# ---------------------------------------------------------------- registry


def engine_classes() -> dict[str, type[Engine]]:
    """Engines that exist in this build, keyed by name, in :data:`AUTO_ORDER`.

    Imported lazily (each module is small, but kernel/wireguard-go pull in pyroute2).
    An engine whose module cannot be imported in a build is simply absent.
    """
    import importlib

    modules = {
        "kernel": ("anex_agent.tunnels.engines.kernel", "KernelEngine"),
        "wireguard-go": ("anex_agent.tunnels.engines.wireguard_go", "WireguardGoEngine"),
        "userspace": ("anex_agent.tunnels.engines.userspace", "UserspaceEngine"),
        "wireproxy": ("anex_agent.tunnels.engines.wireproxy", "WireproxyEngine"),
    }
    found: dict[str, type[Engine]] = {}
    for name in AUTO_ORDER:
        module_name, attr = modules[name]
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            raise
        cls = getattr(module, attr, None)
        if cls is not None:
            found[name] = cls
    return found


def choose_engine(requested: str = "auto", *, for_workload: bool = False,
                  source: str = "engine") -> tuple[type[Engine], dict[str, Support]]:
    """Pick the engine class for ``requested`` (a name or ``auto``).

    Returns the class and the Support answer of every engine probed (for reports).
    ``for_workload`` (the node agent): an engine must also serve the workload
    (:meth:`Engine.workload_support`); ``auto`` skips the others, recording why in the
    answers, and naming one explicitly raises ConfigError naming ``source`` (e.g.
    ``ANEX_ENGINE``) with the accepted names and those that run here. Without it (a bare
    tunnel, e.g. the gateway's hub), ``auto`` skips engines that only serve a workload
    (``frontends == "engine"``: wireproxy).
    Raises ConfigError naming ``source`` for an unknown name, and for a named engine that
    cannot run here (why, and the engines that do run here); EngineError when ``auto`` finds
    nothing suitable.
    """
    from anex_agent.errors import EngineError

    classes = engine_classes()
    if requested != "auto" and requested not in AUTO_ORDER:
        raise ConfigError(source, f"{requested!r} is not one of auto, {', '.join(AUTO_ORDER)}")
    if for_workload and requested != "auto":
        require_workload_engine(requested, source, classes)
    candidates = list(classes) if requested == "auto" else [requested]
    tried: dict[str, Support] = {}
    for name in candidates:
        cls = classes.get(name)
        if cls is None:
            tried[name] = Support(False, "not available in this build")
            continue
        if not for_workload and requested == "auto" and getattr(cls, "frontends", "dialer") == "engine":
            tried[name] = Support(False, "serves a node's workload only (its own proxy and tunnels), not a bare tunnel")
            continue
        support = cls.is_supported()
        if support.ok and for_workload:
            serves = cls.workload_support()
            if not serves.ok:
                tried[name] = Support(False, f"runs here but cannot serve the workload: {serves.reason}")
                continue
        tried[name] = support
        if support.ok:
            return cls, tried
    if requested != "auto":  # the one named cannot run here: a setting that does not fit this machine
        raise ConfigError(source, f"{requested!r}: the {requested} engine cannot run here "
                                  f"({tried[requested].reason}); engines that run here: "
                                  f"{', '.join(_usable_here(classes, for_workload, requested)) or 'none'}, "
                                  "or auto (leave it unset) to pick one")
    reasons = "; ".join(f"{n}: {s.reason}" for n, s in tried.items())
    raise EngineError(f"no usable WireGuard engine for {requested!r} ({reasons})")


def _usable_here(classes: dict[str, type[Engine]], for_workload: bool, skip: str) -> list[str]:
    """The engines (other than ``skip``) that run on this machine, and serve a workload when ``for_workload``
    (else: a bare tunnel, so not the workload-only ones)."""
    usable = []
    for name, cls in classes.items():
        if name == skip:
            continue
        if for_workload and not cls.workload_support().ok:
            continue
        if not for_workload and getattr(cls, "frontends", "dialer") == "engine":
            continue
        if cls.is_supported().ok:
            usable.append(name)
    return usable


def require_workload_engine(name: str, source: str, classes: dict[str, type[Engine]] | None = None) -> None:
    """ConfigError naming ``source`` when engine ``name`` cannot serve a workload (see :meth:`Engine.workload_support`).

    The message says why, which names are accepted, and which of them run on this machine.
    """
    classes = engine_classes() if classes is None else classes
    cls = classes.get(name)
    if cls is None:
        return  # absent: choose_engine reports "not available in this build"
    serves = cls.workload_support()
    if serves.ok:
        return
    accepted = ["auto"] + [n for n, c in classes.items() if c.workload_support().ok]
    here = [n for n in accepted[1:] if classes[n].is_supported().ok]
    raise ConfigError(source, f"{name!r} cannot serve the workload yet ({serves.reason}); accepted: "
                              f"{', '.join(accepted)}; usable on this machine: {', '.join(here) or 'none'}")
