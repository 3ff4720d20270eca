"""The external wireproxy engine: render a config for windtf/wireproxy v1.1, run it, supervise it.

wireproxy (a Go program: wireguard-go + gVisor netstack) owns its own HTTP proxy and TCP
tunnels, so this engine only

* renders a *validated* config (:func:`render_config`): ``[Interface]`` Address /
  PrivateKey / DNS / MTU / ``CheckAlive`` (the gateway's mesh address), one ``[Peer]``
  per peer, ``[http]`` on the proxy address, a ``[TCPClientTunnel]`` per ``GW_TUNNEL``
  forward and a ``[TCPServerTunnel]`` per inbound port, written mode 0600 (it holds the
  private key) by :func:`write_config`;
* runs ``wireproxy -c <file> -i <health address>`` and supervises it: it restarts the
  process when it exits, when ``/readyz`` fails (503 or no answer) ``failures_before_restart``
  checks in a row, or when a peer endpoint's host name resolves to a different address
  (wireproxy resolves endpoints once, when it parses its config);
* translates ``/metrics`` (wireguard-go's UAPI ``get`` dump with keys redacted, see
  :func:`parse_metrics`) into :class:`EngineStatus`.

``dialer()`` returns None: the workload talks to wireproxy's own proxy and tunnels.
What this module cannot check without the real binary is listed in docs/userspace-wireguard.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import os
import re
import shutil
import signal
import socket
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anex_agent.childenv import engine_env
from anex_agent.errors import ConfigError, EngineError
from anex_agent.keys import decode_key, encode_key
from anex_agent.tunnels.base import DesiredConfig, Engine, EngineStatus, PeerStatus, Support

log = logging.getLogger(__name__)

BINARY = "wireproxy"
#: wireproxy's default CheckAliveInterval (seconds); /readyz says 503 once the last pong is older than this + 2 s.
CHECK_ALIVE_INTERVAL = 5
STOP_GRACE = 5.0
#: Restart reasons kept for reports (the oldest are dropped); ``Supervision.starts`` counts them all.
RESTART_HISTORY = 20

_HOST_RE = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$")


# ---------------------------------------------------------------- options and validation


def _check_host_port(value: str, what: str, *, literal: bool = False) -> str:
    """``HOST:PORT`` (``[v6]:PORT``) with a valid host name or IP literal; ConfigError naming ``what`` otherwise."""
    accepted = "HOST:PORT with a host name or IP address and a port from 1 to 65535"
    host, sep, port = str(value).rpartition(":")
    if not sep or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise ConfigError(what, f"{value!r} is not {accepted}")
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        ip = ipaddress.ip_address(bare)
        if ip.version == 6 and not host.startswith("["):
            raise ConfigError(what, f"{value!r}: put an IPv6 address in brackets, e.g. [fd00::1]:{port}")
    except ValueError:
        if literal or not _HOST_RE.match(bare):
            raise ConfigError(what, f"{value!r} is not {accepted}" + (" (an IP address here)" if literal else "")) from None
    return value


@dataclass(frozen=True)
class ClientTunnel:
    """``[TCPClientTunnel]``: wireproxy listens on ``bind_address`` (local) and connects to ``target`` over the mesh."""

    bind_address: str
    target: str

    def __post_init__(self) -> None:
        _check_host_port(self.bind_address, "client tunnel bind_address", literal=True)
        _check_host_port(self.target, "client tunnel target")


@dataclass(frozen=True)
class ServerTunnel:
    """``[TCPServerTunnel]``: wireproxy listens on mesh port ``listen_port`` and connects to local ``target``."""

    listen_port: int
    target: str

    def __post_init__(self) -> None:
        if not isinstance(self.listen_port, int) or not 1 <= self.listen_port <= 65535:
            raise ConfigError("server tunnel listen_port", f"{self.listen_port!r} is not a port from 1 to 65535")
        _check_host_port(self.target, "server tunnel target")


@dataclass(frozen=True)
class WireproxyOptions:
    """What wireproxy needs beyond the WireGuard config.

    ``proxy_address``: where its HTTP proxy listens (e.g. ``127.0.0.1:3128``);
    ``health_address``: where ``-i`` serves ``/readyz`` and ``/metrics`` (loopback only:
    ``/metrics`` reveals peers and endpoints); ``check_alive``: mesh addresses pinged for
    ``/readyz`` (the gateway's); ``dns``: resolvers inside the mesh.
    """

    proxy_address: str = "127.0.0.1:3128"
    health_address: str = "127.0.0.1:9080"
    dns: tuple[str, ...] = ()
    check_alive: tuple[str, ...] = ()
    check_alive_interval: int = CHECK_ALIVE_INTERVAL
    client_tunnels: tuple[ClientTunnel, ...] = ()
    server_tunnels: tuple[ServerTunnel, ...] = ()

    def __post_init__(self) -> None:
        _check_host_port(self.proxy_address, "proxy_address", literal=True)
        _check_host_port(self.health_address, "health_address", literal=True)
        host = self.health_address.rpartition(":")[0].strip("[]")
        if not ipaddress.ip_address(host).is_loopback:
            raise ConfigError("health_address", f"{self.health_address!r}: must be a loopback address "
                              "(wireproxy's /metrics lists peers and endpoints to whoever connects)")
        for what, values in (("dns", self.dns), ("check_alive", self.check_alive)):
            for value in values:
                try:
                    ipaddress.ip_address(value)
                except ValueError:
                    raise ConfigError(what, f"{value!r} is not an IP address") from None
        if not 1 <= self.check_alive_interval <= 3600:
            raise ConfigError("check_alive_interval", f"{self.check_alive_interval} is not 1..3600 seconds")
        binds = [t.bind_address for t in self.client_tunnels] + [self.proxy_address, self.health_address]
        if len(binds) != len(set(binds)):
            raise ConfigError("client_tunnels", "two listeners (tunnels, proxy, health) share one address")
        ports = [t.listen_port for t in self.server_tunnels]
        if len(ports) != len(set(ports)):
            raise ConfigError("server_tunnels", "the same listen_port appears twice")

    @classmethod
    def for_node(cls, config: Any, *, proxy_address: str = "127.0.0.1:3128",
                 health_address: str = "127.0.0.1:9080", inbound_ports: tuple[int, ...] = ()) -> WireproxyOptions:
        """Options for a node from its ``anex_agent.wire.NodeConfig``: DNS, CheckAlive on every
        gateway's mesh address, a client tunnel ``127.0.0.1:<listen_port> -> target`` per
        ``GW_TUNNEL`` forward, and a server tunnel ``<port> -> 127.0.0.1:<port>`` per inbound port."""
        return cls(
            proxy_address=proxy_address,
            health_address=health_address,
            dns=tuple(config.dns),
            check_alive=tuple(g.mesh_address for g in config.gateways if g.mesh_address),
            client_tunnels=tuple(ClientTunnel(f"127.0.0.1:{t.listen_port}", str(t.target)) for t in config.tunnels),
            server_tunnels=tuple(ServerTunnel(p, f"127.0.0.1:{p}") for p in inbound_ports),
        )


# ---------------------------------------------------------------- rendering


def render_config(desired: DesiredConfig, options: WireproxyOptions) -> str:
    """The wireproxy config text for ``desired`` + ``options``. Pure; raises ConfigError naming the bad field.

    wireproxy reads values starting with ``$`` as environment references; nothing we render
    can start with one (keys are base64, the rest is validated addresses).
    """
    if not desired.peers:
        raise ConfigError("peers", "wireproxy needs at least one peer (the gateway)")
    lines = ["# Written by anex-agent for wireproxy; holds a private key (mode 0600). Do not edit.",
             "[Interface]",
             f"Address = {desired.address}",
             f"PrivateKey = {encode_key(desired.private_key)}"]
    if desired.listen_port:
        lines.append(f"ListenPort = {desired.listen_port}")
    if options.dns:
        lines.append(f"DNS = {', '.join(options.dns)}")
    lines.append(f"MTU = {desired.mtu}")
    if options.check_alive:
        lines.append(f"CheckAlive = {', '.join(options.check_alive)}")
        if options.check_alive_interval != CHECK_ALIVE_INTERVAL:
            lines.append(f"CheckAliveInterval = {options.check_alive_interval}")
    for peer in desired.peers:
        decode_key(peer.public_key, what="peer public_key")
        lines += ["", "[Peer]", f"PublicKey = {peer.public_key}"]
        if peer.preshared_key:
            decode_key(peer.preshared_key, what="peer preshared_key")
            lines.append(f"PresharedKey = {peer.preshared_key}")
        if peer.endpoint:
            lines.append(f"Endpoint = {_check_host_port(peer.endpoint, 'peer endpoint')}")
        if peer.allowed_ips:
            lines.append(f"AllowedIPs = {', '.join(peer.allowed_ips)}")
        if peer.persistent_keepalive:
            lines.append(f"PersistentKeepalive = {peer.persistent_keepalive}")
    lines += ["", "[http]", f"BindAddress = {options.proxy_address}"]
    for tunnel in options.client_tunnels:
        lines += ["", "[TCPClientTunnel]", f"BindAddress = {tunnel.bind_address}", f"Target = {tunnel.target}"]
    for server in options.server_tunnels:
        lines += ["", "[TCPServerTunnel]", f"ListenPort = {server.listen_port}", f"Target = {server.target}"]
    return "\n".join(lines) + "\n"


def write_config(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically with mode 0600 (never readable by others, not even briefly)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    fd, tmp = tempfile.mkstemp(prefix=".wireproxy-", dir=path.parent)  # mkstemp creates 0600
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# ---------------------------------------------------------------- /metrics


def parse_metrics(text: str, *, now: float | None = None) -> tuple[int, tuple[PeerStatus, ...]]:
    """(listen_port, peers) from wireproxy's ``/metrics``: a UAPI ``get`` dump, one ``key=value`` per line.

    Device keys come first (``private_key=REDACTED``, ``listen_port``); each
    ``public_key=<hex>`` starts a peer with ``endpoint``, ``last_handshake_time_sec/nsec``,
    ``rx_bytes``, ``tx_bytes``, ``allowed_ip`` (repeated)... Unknown keys are ignored;
    malformed values raise EngineError (the dump comes from a process we run).
    """
    listen_port = 0
    peers: list[dict[str, Any]] = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise EngineError(f"wireproxy /metrics line {number} is not key=value: {line[:80]!r}")
        try:
            if key == "public_key":
                peers.append({"public_key": encode_key(bytes.fromhex(value)), "allowed_ips": [],
                              "rx": 0, "tx": 0, "sec": 0, "nsec": 0, "endpoint": None})
            elif key == "listen_port" and not peers:
                listen_port = int(value)
            elif peers and key in ("rx_bytes", "tx_bytes"):
                peers[-1][key[:2]] = int(value)
            elif peers and key == "last_handshake_time_sec":
                peers[-1]["sec"] = int(value)
            elif peers and key == "last_handshake_time_nsec":
                peers[-1]["nsec"] = int(value)
            elif peers and key == "endpoint":
                peers[-1]["endpoint"] = value
            elif peers and key == "allowed_ip":
                peers[-1]["allowed_ips"].append(str(ipaddress.ip_network(value, strict=False)))
        except ValueError:
            raise EngineError(f"wireproxy /metrics line {number}: bad value for {key}: {value[:80]!r}") from None
    return listen_port, tuple(
        PeerStatus(public_key=p["public_key"], endpoint=p["endpoint"],
                   last_handshake=(p["sec"] + p["nsec"] / 1e9) if p["sec"] else None,
                   rx_bytes=p["rx"], tx_bytes=p["tx"], allowed_ips=tuple(p["allowed_ips"]))
        for p in peers
    )


async def http_get(address: str, path: str, timeout: float) -> tuple[int, str]:
    """(status, body) of ``GET path`` on ``HOST:PORT``; OSError/TimeoutError when there is no answer."""
    host, _, port = address.rpartition(":")

    async def go() -> tuple[int, str]:
        reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
        try:
            writer.write(f"GET {path} HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
            await writer.drain()
            data = b""
            while len(data) < (1 << 20):  # HTTP/1.0: the server closes after the response
                chunk = await reader.read(65536)
                if not chunk:
                    break
                data += chunk
        finally:
            writer.close()
        head, _, body = data.partition(b"\r\n\r\n")
        parts = head.split(b" ", 2)
        if len(parts) < 2 or not parts[1].isdigit():
            raise OSError(f"not an HTTP response from {address}")
        return int(parts[1]), body.decode("utf-8", "replace")

    return await asyncio.wait_for(go(), timeout)


# ---------------------------------------------------------------- the engine

Resolver = Callable[[str, int], Awaitable[list[str]]]


async def _system_resolve(host: str, port: int) -> list[str]:
    infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_DGRAM)
    return sorted({info[4][0] for info in infos})


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG (linux/prctl.h)


@dataclass
class Supervision:
    """What the supervisor did: process starts, and why the last RESTART_HISTORY restarts happened."""

    starts: int = 0
    restarts: list[str] = field(default_factory=list)
    health_failures: int = 0
    last_health: int | None = None  # HTTP status of the last /readyz, None if no answer


class WireproxyEngine(Engine):
    """wireproxy as a supervised child process. Options come with the constructor (or :meth:`set_options`)."""

    name = "wireproxy"
    frontends = "engine"  # wireproxy owns the HTTP proxy, the client and the server tunnels
    host_address = False  # no OS interface: the mesh address lives inside wireproxy

    def __init__(self, *, ifname: str | None = None, options: WireproxyOptions | None = None,
                 binary: str = BINARY, state_dir: Path | None = None, health_interval: float = 5.0,
                 failures_before_restart: int = 3, start_grace: float | None = None,
                 resolve_interval: float = 30.0, resolver: Resolver = _system_resolve) -> None:
        self.ifname = ifname  # no OS interface: accepted and ignored
        self.options = options or WireproxyOptions()
        self.binary = binary
        self.state_dir = Path(state_dir) if state_dir else None
        self.health_interval = health_interval
        self.failures_before_restart = failures_before_restart
        # /readyz is 503 until the first pong: failures of a fresh process count only after
        # its first 200 or after start_grace seconds.
        self.start_grace = start_grace if start_grace is not None else 2 * self.options.check_alive_interval + 10
        self.resolve_interval = resolve_interval
        self.resolver = resolver
        self.supervision = Supervision()
        self._config_text: str | None = None
        self._endpoint_addrs: dict[str, list[str]] = {}
        self._proc: asyncio.subprocess.Process | None = None
        self._started_at = 0.0
        self._seen_healthy = False
        self._supervisor: asyncio.Task | None = None
        self._tmpdir: tempfile.TemporaryDirectory | None = None
        self._lock = asyncio.Lock()

    def __repr__(self) -> str:
        return f"WireproxyEngine(binary={self.binary!r}, running={self.running})"

    @classmethod
    def is_supported(cls, binary: str = BINARY) -> Support:
        path = shutil.which(binary)
        if path is None:
            return Support(False, f"no {binary!r} on PATH (external engine: install windtf/wireproxy v1.1 to use it)")
        return Support(True, f"{path} (external wireproxy: owns its own proxy and tunnels)")

    @classmethod
    def workload_support(cls) -> Support:
        return Support(True, "wireproxy serves the HTTP proxy, the GW_TUNNEL tunnels and inbound ports itself")

    async def readiness(self) -> tuple[bool, str]:
        """wireproxy's own verdict: ``/readyz`` on the health address (200 once CheckAlive got a pong)."""
        if not self.running:
            return False, "wireproxy is not running"
        try:
            code, _ = await http_get(self.options.health_address, "/readyz", timeout=2.0)
        except (OSError, asyncio.TimeoutError) as err:
            return False, f"wireproxy /readyz did not answer: {err or type(err).__name__}"
        if code == 200:
            return True, "wireproxy /readyz: 200"
        return False, f"wireproxy /readyz: HTTP {code} (no recent pong from the gateway)"

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.returncode is None

    @property
    def config_path(self) -> Path:
        if self.state_dir is None:
            if self._tmpdir is None:
                self._tmpdir = tempfile.TemporaryDirectory(prefix="anex-wireproxy-")
            self.state_dir = Path(self._tmpdir.name)
        return self.state_dir / "wireproxy.conf"

    def set_options(self, options: WireproxyOptions) -> None:
        """New proxy/tunnel/health options; they take effect at the next apply()."""
        self.options = options

    async def start(self) -> None:
        """Nothing runs before the first apply() (the config carries the key)."""

    async def apply(self, desired: DesiredConfig) -> None:
        text = render_config(desired, self.options)
        async with self._lock:
            if text == self._config_text and self.running:
                return
            write_config(self.config_path, text)
            self._config_text = text
            self._endpoint_addrs = await self._resolve_endpoints(desired)
            await self._restart("config changed" if self.supervision.starts else "first start")
        if self._supervisor is None or self._supervisor.done():
            self._supervisor = asyncio.create_task(self._supervise(), name="wireproxy-supervisor")

    async def restart(self, reason: str) -> None:
        """Restart the running process now (e.g. the gateway re-registered: a fresh process handshakes at once)."""
        async with self._lock:
            if self._proc is not None:
                await self._restart(reason)

    async def _resolve_endpoints(self, desired: DesiredConfig) -> dict[str, list[str]]:
        found: dict[str, list[str]] = {}
        for peer in desired.peers:
            if not peer.endpoint:
                continue
            host, _, port = peer.endpoint.rpartition(":")
            host = host.strip("[]")
            try:
                ipaddress.ip_address(host)
                continue  # a literal never changes
            except ValueError:
                pass
            try:
                found[peer.endpoint] = await self.resolver(host, int(port))
            except OSError as err:
                log.warning("wireproxy: cannot resolve %s: %s", peer.endpoint, err)
                found[peer.endpoint] = []
        return found

    async def _restart(self, reason: str) -> None:
        await self._terminate()
        if self.supervision.starts:
            self.supervision.restarts.append(reason)
            del self.supervision.restarts[:-RESTART_HISTORY]
            log.warning("wireproxy: restarting (%s)", reason)
        logfile = open(self.config_path.with_suffix(".log"), "ab")
        try:
            self._proc = await asyncio.create_subprocess_exec(
                self.binary, "-c", str(self.config_path), "-i", self.options.health_address,
                stdin=asyncio.subprocess.DEVNULL, stdout=logfile, stderr=logfile, preexec_fn=_pdeathsig, env=engine_env(os.environ))
        except OSError as err:
            raise EngineError(f"cannot start {self.binary!r}: {err.strerror or err}") from None
        finally:
            logfile.close()
        self.supervision.starts += 1
        self.supervision.health_failures = 0
        self._started_at = time.monotonic()
        self._seen_healthy = False

    async def _supervise(self) -> None:
        next_resolve = time.monotonic() + self.resolve_interval
        while True:
            await asyncio.sleep(self.health_interval)
            async with self._lock:
                if self._proc is None:
                    return
                if self._proc.returncode is not None:
                    await self._restart(f"process exited with status {self._proc.returncode}")
                    continue
                if time.monotonic() >= next_resolve:
                    next_resolve = time.monotonic() + self.resolve_interval
                    if await self._endpoints_moved():
                        continue
                await self._check_health()

    async def _endpoints_moved(self) -> bool:
        for endpoint, before in self._endpoint_addrs.items():
            host, _, port = endpoint.rpartition(":")
            try:
                now = await self.resolver(host.strip("[]"), int(port))
            except OSError:
                continue  # DNS trouble is not a reason to drop a working tunnel
            if now and now != before:
                self._endpoint_addrs[endpoint] = now
                await self._restart(f"endpoint {endpoint} now resolves to {', '.join(now)} (was {', '.join(before) or 'nothing'})")
                return True
        return False

    async def _check_health(self) -> None:
        try:
            status, _ = await http_get(self.options.health_address, "/readyz", timeout=max(1.0, self.health_interval))
        except (OSError, asyncio.TimeoutError):
            status = None
        self.supervision.last_health = status
        if status == 200:
            self.supervision.health_failures = 0
            self._seen_healthy = True
            return
        if not self._seen_healthy and time.monotonic() - self._started_at < self.start_grace:
            return  # still starting: the first handshake and pong may take a while
        self.supervision.health_failures += 1
        if self.supervision.health_failures >= self.failures_before_restart:
            what = f"HTTP {status}" if status is not None else "no answer"
            await self._restart(f"/readyz failed {self.supervision.health_failures} times ({what})")

    async def status(self) -> EngineStatus:
        if not self.running:
            return EngineStatus(self.name, None, 0, False)
        try:
            code, body = await http_get(self.options.health_address, "/metrics", timeout=5.0)
        except (OSError, asyncio.TimeoutError):
            return EngineStatus(self.name, None, 0, True)
        if code != 200:
            return EngineStatus(self.name, None, 0, True)
        port, peers = parse_metrics(body)
        return EngineStatus(self.name, None, port, True, peers)

    def dialer(self, resolver: Any = None) -> None:
        """None: wireproxy serves the proxy and the tunnels itself; the agent's front-ends stay off."""
        return None

    async def _terminate(self) -> None:
        """SIGTERM, then SIGKILL after STOP_GRACE. ``_proc`` is cleared only once the process is gone,
        so a cancelled caller leaves it for stop() instead of orphaning it."""
        proc = self._proc
        if proc is None:
            return
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(proc.wait(), STOP_GRACE)
            except asyncio.TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()
                await asyncio.wait({asyncio.ensure_future(proc.wait())}, timeout=STOP_GRACE)
        self._proc = None

    async def stop(self) -> None:
        task, self._supervisor = self._supervisor, None
        if task is not None:
            task.cancel()
            await asyncio.wait({task}, timeout=2 * STOP_GRACE)  # never hang a shutdown on it
        await self._terminate()
        self._config_text = None
        if self.state_dir is not None:
            with contextlib.suppress(FileNotFoundError):
                self.config_path.unlink()  # the private key does not outlive the engine
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
            self._tmpdir = None
            self.state_dir = None
