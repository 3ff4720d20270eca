"""Agent settings: flags and environment parsed ONCE, at the edge, into frozen dataclasses.

Nothing below the CLI reads ``os.environ``; the supervisor receives an
:class:`AgentSettings`. Every bad value raises :class:`~anex_agent.errors.ConfigError`
naming the flag or variable and what is accepted, before anything starts.

Environment (a flag of the same meaning wins over the variable):

====================== ================================ =====================================
variable               flag                             accepted / default
====================== ================================ =====================================
ANEX_COORDINATOR_URL   --coordinator                    http(s)://host[:port] (required)
ANEX_JOIN_TOKEN        --token                          the join token (required on first start)
ANEX_JOIN_TOKEN_FILE   --token-file                     a file holding the join token (preferred:
                                                        a flag's value is visible to every user in ``ps``)
ANEX_CA_FILE           --ca-file                        PEM CA certificates trusted for an https://
                                                        coordinator, besides the system CA store
ANEX_ALLOW_INSECURE    --allow-insecure                 1: accept plain http:// to a public coordinator
                                                        (refused by default; see :mod:`anex_agent.client.transport`)
ANEX_STATE_DIR         --state-dir                      directory; default see :func:`default_state_dir`
ANEX_ENGINE            --engine                         auto|kernel|wireguard-go|userspace|wireproxy
ANEX_PATH              --path                           auto|udp|websocket (see anex_agent.agent.path)
ANEX_PATH_PROBE_INTERVAL --path-probe-interval          seconds between UDP probes while on the
                                                        WebSocket path (auto), default 120
ANEX_DEAD_PEER_AFTER   --dead-peer-after                seconds with data sent to the gateways and nothing
                                                        received before a fresh handshake, default 2
HTTPS_PROXY, HTTP_PROXY, NO_PROXY                       egress proxy (CONNECT) for the WebSocket relay
ANEX_PROXY_LISTEN      --proxy-listen                   IP:PORT, [IPv6]:PORT or localhost:PORT, default 127.0.0.1:3128
ANEX_API_LISTEN        --api-listen                     IP:PORT (as above), default 127.0.0.1:9555
ANEX_PROXY_AUTH        --proxy-auth                     USER:PASSWORD the proxy requires (optional)
ANEX_PROXY_AUTH_FILE   --proxy-auth-file                a file holding USER:PASSWORD
ANEX_SOCKS_LISTEN      --socks-listen                   the SOCKS5 proxy: IP:PORT as above (e.g. 127.0.0.1:1080);
                                                        unset or empty: no SOCKS5 proxy (the default)
ANEX_SOCKS_AUTH        --socks-auth                     USER:PASSWORD the SOCKS5 proxy requires (RFC 1929);
                                                        required when it listens beyond loopback
ANEX_SOCKS_AUTH_FILE   --socks-auth-file                a file holding USER:PASSWORD
ANEX_SSH_PORT          --ssh-port                       SSH server port on the mesh address, default 2222; 0: off
ANEX_PROVIDER          --provider                       vastai|runpod|onprem|other, default other
ANEX_NODE_NAME         --name                           1-253 characters, default the host name
ANEX_INBOUND_PORTS     --inbound-ports                  PORT,PORT/udp,... the workload serves to the mesh
                                                        (PORT or PORT/tcp: TCP; PORT/udp: UDP, not with
                                                        wireproxy); for the userspace and wireproxy
                                                        engines, native engines need none
ANEX_METRICS_HOST_LABEL, ANEX_METRICS_PCIE_THROUGHPUT   GPU metric naming on /metrics
                                                        (see anex_agent.telemetry.options)
GW_TUNNEL_<port>       --tunnel PORT=HOST:PORT          a TCP forward 127.0.0.1:<port> -> HOST:PORT
ANEX_FORWARD_MAX_CONNECTIONS --forward-max-connections  connections relayed at once per forward port,
                                                        1-1000000, default 1024; more are closed at once
ANEX_PROXY_MAX_CONNECTIONS --proxy-max-connections      clients served at once by the HTTP proxy and by the
                                                        SOCKS5 proxy (each), 1-1000000, default 1024; more
                                                        are closed at once
====================== ================================ =====================================
"""

from __future__ import annotations

import errno
import os
import socket
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping
from urllib.parse import urlsplit

from anex_agent import parse
from anex_agent.client import transport
from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, config_value
from anex_agent.telemetry.options import ExpositionOptions, exposition_options
from anex_agent.wire.base import Provider
from anex_agent.wire.nodes import TunnelSpec

ENGINES = ("auto", "kernel", "wireguard-go", "userspace", "wireproxy")
PATHS = ("auto", "udp", "websocket")
DEFAULT_PROXY_LISTEN = "127.0.0.1:3128"
DEFAULT_API_LISTEN = "127.0.0.1:9555"
TUNNEL_PREFIX = "GW_TUNNEL_"
ROOT_STATE_DIR = Path("/var/lib/anex-agent")


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


@dataclass(frozen=True)
class TunnelSetting:
    """One GW_TUNNEL forward and where it came from (the variable name, for error messages)."""

    source: str
    spec: TunnelSpec


@dataclass(frozen=True)
class AgentSettings:
    coordinator_url: str
    join_token: str = field(repr=False)  # secret
    state_dir: Path
    engine: str = "auto"
    path: str = "auto"
    proxy_listen: ListenAddress = ListenAddress("127.0.0.1", 3128)
    api_listen: ListenAddress = ListenAddress("127.0.0.1", 9555)
    provider: Provider = Provider.other
    name: str = field(default_factory=socket.gethostname)
    tunnels: tuple[TunnelSetting, ...] = ()
    #: ``anex_agent.frontends.proxy_core.ProxyAuth`` when ANEX_PROXY_AUTH is set (secret: not in repr)
    proxy_auth: Any = field(default=None, repr=False)
    #: ANEX_SOCKS_LISTEN: where the SOCKS5 proxy listens; None: no SOCKS5 proxy (the default)
    socks_listen: ListenAddress | None = None
    #: ``anex_agent.frontends.socks5_core.SocksAuth`` when ANEX_SOCKS_AUTH is set (secret: not in repr)
    socks_auth: Any = field(default=None, repr=False)
    #: ANEX_INBOUND_PORTS: workload TCP ports the mesh may reach at the node's mesh address. Native
    #: engines reach every port anyway; engines without an OS interface (userspace, wireproxy) serve these.
    inbound_ports: tuple[int, ...] = ()
    #: ANEX_INBOUND_PORTS' ``PORT/udp`` items: workload UDP ports, served by the userspace engine
    #: (wireproxy carries no inbound UDP: it warns and leaves them out).
    inbound_udp_ports: tuple[int, ...] = ()
    #: the flag or variable ``engine`` came from (for error messages)
    engine_source: str = "ANEX_ENGINE"
    #: the flag, variable or file the join token came from (a refused token names it)
    join_token_source: str = "ANEX_JOIN_TOKEN"
    #: PEM CA certificates trusted for an https:// coordinator (and a wss:// relay) besides the system store
    ca_file: Path | None = None
    #: seconds between UDP probes while on the WebSocket path (ANEX_PATH_PROBE_INTERVAL)
    path_probe_interval: float = 120.0
    #: seconds with data sent and nothing received before a fresh handshake (ANEX_DEAD_PEER_AFTER)
    dead_peer_after: float = 2.0
    #: HTTPS_PROXY / HTTP_PROXY / NO_PROXY (either case) as found, for the WebSocket relay connection
    proxy_env: tuple[tuple[str, str], ...] = ()
    #: GPU metric naming on the agent's /metrics (ANEX_METRICS_HOST_LABEL, ANEX_METRICS_PCIE_THROUGHPUT)
    gpu_metrics: ExpositionOptions = field(default_factory=ExpositionOptions)
    #: ANEX_SSH_PORT: the SSH server's port on the mesh address (docs/remote-access.md); 0: no SSH server
    ssh_port: int = 2222
    #: ANEX_FORWARD_MAX_CONNECTIONS: connections relayed at once per forward port (more are refused)
    forward_max_connections: int = 1024
    #: ANEX_PROXY_MAX_CONNECTIONS: clients served at once by each proxy listener (more are refused)
    proxy_max_connections: int = 1024

    @property
    def tunnel_specs(self) -> list[TunnelSpec]:
        return [t.spec for t in self.tunnels]


#: the largest ANEX_FORWARD_MAX_CONNECTIONS (and ANEX_PROXY_MAX_CONNECTIONS) accepted
MAX_FORWARD_CONNECTIONS = 1_000_000


def default_state_dir(environ: Mapping[str, str], euid: int | None = None) -> Path:
    """``/var/lib/anex-agent`` for root; else ``$XDG_STATE_HOME/anex-agent`` or ``~/.local/state/anex-agent``."""
    euid = os.geteuid() if euid is None else euid
    if euid == 0:
        return ROOT_STATE_DIR
    base = environ.get("XDG_STATE_HOME") or str(Path(environ.get("HOME", str(Path.home()))) / ".local" / "state")
    return Path(base) / "anex-agent"


def parse_listen(value: str, source: str) -> ListenAddress:
    """Parse ``HOST:PORT`` (IPv6 in brackets, ``localhost`` = 127.0.0.1) into a :class:`ListenAddress`."""
    return ListenAddress(*config_value(source, parse.listen, value.strip()))


def parse_tunnel(source: str, port_text: str, target: str) -> TunnelSetting:
    """One forward: ``port_text`` is the local port (from the variable name), ``target`` HOST:PORT."""
    accepted = ("GW_TUNNEL_<port>=<host>:<port> with both ports from 1 to 65535 in ASCII digits (IPv6 hosts "
                "in brackets), e.g. GW_TUNNEL_5432=db.default.svc.cluster.local:5432")
    try:
        local = parse.port(port_text)
    except ValueError:
        raise ConfigError(source, f"local port {port_text!r} is not a port from 1 to 65535; expected {accepted}") from None
    try:
        parse.host_port(target.strip())
    except ValueError:
        raise ConfigError(source, f"value {target!r} is not <host>:<port>; expected {accepted}") from None
    return TunnelSetting(source, TunnelSpec(listen_port=local, target=target.strip()))


def parse_tunnels(environ: Mapping[str, str], flags: list[str] | None = None) -> tuple[TunnelSetting, ...]:
    """All GW_TUNNEL_<port> variables plus ``--tunnel PORT=HOST:PORT`` flags, sorted by port."""
    found: dict[int, TunnelSetting] = {}
    items = [(name, name[len(TUNNEL_PREFIX):], value) for name, value in environ.items() if name.startswith(TUNNEL_PREFIX)]
    for flag in flags or []:
        port_text, sep, target = flag.partition("=")
        if not sep:
            raise ConfigError("--tunnel", f"{flag!r}: expected PORT=HOST:PORT, e.g. --tunnel 5432=db:5432")
        items.append(("--tunnel", port_text, target))
    for source, port_text, target in items:
        setting = parse_tunnel(source, port_text, target)
        port = setting.spec.listen_port
        if port in found:
            raise ConfigError(source, f"local port {port} is already used by {found[port].source}; each port once")
        found[port] = setting
    return tuple(found[p] for p in sorted(found))


def parse_inbound_ports(value: str, source: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``PORT,PORT/udp,PORT/tcp,...`` (spaces allowed, empty = none) into sorted unique TCP ports
    and UDP ports (a bare ``PORT`` is TCP); ConfigError naming ``source``."""
    accepted = ("expected a comma-separated list of ports from 1 to 65535, each PORT or PORT/tcp (TCP) or "
                "PORT/udp (UDP), e.g. 8000,5353/udp")
    ports: dict[str, set[int]] = {"tcp": set(), "udp": set()}
    for item in value.split(","):
        item = item.strip()
        if not item:
            continue
        try:
            number, protocol = parse.port_protocol(item)
        except ValueError:
            number_text, slash, protocol_text = item.partition("/")
            unknown = slash and protocol_text.lower() not in parse.PROTOCOLS and parse.is_integer(number_text)
            what = f"has the protocol {protocol_text!r}" if unknown else "is not a port"
            raise ConfigError(source, f"{item!r} in {value!r} {what}; {accepted}") from None
        ports[protocol].add(number)
    return tuple(sorted(ports["tcp"])), tuple(sorted(ports["udp"]))


def port_in_use(host: str, port: int) -> bool:
    """True when a TCP listener cannot bind ``host:port`` (SO_REUSEADDR set, as asyncio does)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as err:
            if err.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


def listeners(settings: AgentSettings) -> list[tuple[ListenAddress, str]]:
    """The agent's own listeners and the variable that sets each: the HTTP proxy, the agent API,
    and the SOCKS5 proxy when it is on."""
    found = [(settings.proxy_listen, "ANEX_PROXY_LISTEN"), (settings.api_listen, "ANEX_API_LISTEN")]
    if settings.socks_listen is not None:
        found.append((settings.socks_listen, "ANEX_SOCKS_LISTEN"))
    return found


def check_ports_free(settings: AgentSettings) -> None:
    """Raise ConfigError naming the variable whose local port is taken (by another process or another setting)."""
    taken = {listen.port: source for listen, source in listeners(settings) if listen.host in ("127.0.0.1", "0.0.0.0", "::")}
    for tunnel in settings.tunnels:
        port = tunnel.spec.listen_port
        if port in taken:
            raise ConfigError(tunnel.source, f"local port {port} is also {taken[port]}; choose another port")
        if port_in_use("127.0.0.1", port):
            raise ConfigError(
                tunnel.source, f"local port {port} is already in use on 127.0.0.1; GW_TUNNEL_<port> needs a free port"
            )
    for listen, source in listeners(settings):
        if port_in_use(listen.host, listen.port):
            raise ConfigError(source, f"{listen} is already in use; set {source}=HOST:PORT to a free address")


def _url(value: str, source: str) -> str:
    parts = urlsplit(value.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(source, f"{value!r}: expected an http:// or https:// URL of the coordinator")
    return value.strip().rstrip("/")


def _choice(value: str, source: str, choices: tuple[str, ...]) -> str:
    value = value.strip().lower()
    if value not in choices:
        raise ConfigError(source, f"{value!r}: expected one of {'|'.join(choices)}")
    return value


def _pick(flag_value, flag: str, environ: Mapping[str, str], var: str, default: str | None) -> tuple[str | None, str]:
    """Return (value, source name) with flag > environment > default."""
    if flag_value not in (None, ""):
        return str(flag_value), flag
    if environ.get(var, "") != "":
        return environ[var], var
    return default, var


JOIN_TOKEN = SecretSpec("--token", "ANEX_JOIN_TOKEN")
PROXY_AUTH = SecretSpec("--proxy-auth", "ANEX_PROXY_AUTH")
SOCKS_AUTH = SecretSpec("--socks-auth", "ANEX_SOCKS_AUTH")


def from_args(args, environ: Mapping[str, str], *, require_coordinator: bool = True) -> AgentSettings:
    """Build settings from argparse ``args`` (see :func:`add_arguments`) and ``environ``."""
    token, token_source = pick_secret(JOIN_TOKEN, environ, flag_value=getattr(args, "token", None),
                                      file_value=getattr(args, "token_file", None))
    auth_text, src_u = pick_secret(PROXY_AUTH, environ, flag_value=getattr(args, "proxy_auth", None),
                                   file_value=getattr(args, "proxy_auth_file", None))
    socks_auth_text, src_sa = pick_secret(SOCKS_AUTH, environ, flag_value=getattr(args, "socks_auth", None),
                                          file_value=getattr(args, "socks_auth_file", None))
    ca, src_c = _pick(getattr(args, "ca_file", None), "--ca-file", environ, transport.CA_FILE_VAR, None)
    ca_file = transport.parse_ca_file(ca, src_c)
    allow_insecure = bool(getattr(args, "allow_insecure", False)) or transport.allow_insecure_from(environ)
    url, src = _pick(getattr(args, "coordinator", None), "--coordinator", environ, "ANEX_COORDINATOR_URL", None)
    if url is None:
        if require_coordinator:
            raise ConfigError("ANEX_COORDINATOR_URL", "is not set; expected the coordinator URL, e.g. https://coordinator.example:8700")
        url = ""
    else:
        url = _url(url, src)
        transport.check_coordinator_url(url, src, allow_insecure=allow_insecure,
                                        allow_hint=f"{transport.ALLOW_INSECURE_VAR}=1 (or --allow-insecure)")
    state, _ = _pick(getattr(args, "state_dir", None), "--state-dir", environ, "ANEX_STATE_DIR", None)
    engine, src_e = _pick(getattr(args, "engine", None), "--engine", environ, "ANEX_ENGINE", "auto")
    path, src_p = _pick(getattr(args, "path", None), "--path", environ, "ANEX_PATH", "auto")
    probe, src_pi = _pick(getattr(args, "path_probe_interval", None), "--path-probe-interval", environ,
                          "ANEX_PATH_PROBE_INTERVAL", "120")
    dead, src_dp = _pick(getattr(args, "dead_peer_after", None), "--dead-peer-after", environ,
                         "ANEX_DEAD_PEER_AFTER", "2")
    proxy, src_x = _pick(getattr(args, "proxy_listen", None), "--proxy-listen", environ, "ANEX_PROXY_LISTEN", DEFAULT_PROXY_LISTEN)
    socks, src_sl = _pick(getattr(args, "socks_listen", None), "--socks-listen", environ, "ANEX_SOCKS_LISTEN", None)
    api, src_a = _pick(getattr(args, "api_listen", None), "--api-listen", environ, "ANEX_API_LISTEN", DEFAULT_API_LISTEN)
    provider, src_v = _pick(getattr(args, "provider", None), "--provider", environ, "ANEX_PROVIDER", "other")
    name, src_n = _pick(getattr(args, "name", None), "--name", environ, "ANEX_NODE_NAME", socket.gethostname())
    inbound, src_i = _pick(getattr(args, "inbound_ports", None), "--inbound-ports", environ, "ANEX_INBOUND_PORTS", "")
    ssh, src_s = _pick(getattr(args, "ssh_port", None), "--ssh-port", environ, "ANEX_SSH_PORT", "2222")
    fwd_max, src_f = _pick(getattr(args, "forward_max_connections", None), "--forward-max-connections", environ,
                           "ANEX_FORWARD_MAX_CONNECTIONS", "1024")
    proxy_max, src_pm = _pick(getattr(args, "proxy_max_connections", None), "--proxy-max-connections", environ,
                              "ANEX_PROXY_MAX_CONNECTIONS", "1024")
    proxy_auth = None
    if auth_text:
        from anex_agent.frontends.proxy_core import ProxyAuth

        proxy_auth = ProxyAuth.parse(auth_text, source=src_u)
    try:
        provider_value = Provider(provider.strip().lower())
    except ValueError:
        raise ConfigError(src_v, f"{provider!r}: expected one of {'|'.join(p.value for p in Provider)}") from None
    if not 1 <= len(name) <= 253:
        raise ConfigError(src_n, "expected a node name of 1 to 253 characters")
    proxy_listen, api_listen = parse_listen(proxy, src_x), parse_listen(api, src_a)
    inbound_ports, inbound_udp_ports = parse_inbound_ports(inbound or "", src_i)
    socks_listen, socks_auth = _socks(socks, src_sl, socks_auth_text, src_sa)
    ours = [(api_listen, "the agent API"), (proxy_listen, "the HTTP proxy")]
    if socks_listen is not None:
        for listen, what in ours:
            if listen.port == socks_listen.port and _overlap(listen.host, socks_listen.host):
                raise ConfigError(src_sl, f"{socks_listen} is also {what}'s address ({listen}); choose another port")
        ours.append((socks_listen, "the SOCKS5 proxy"))
    for listen, what in ours:
        # wireproxy delivers inbound connections from 127.0.0.1: a mesh caller would look local
        # (the API trusts loopback callers without a token; the proxy would serve the mesh)
        if listen.port in inbound_ports:
            raise ConfigError(src_i, f"port {listen.port} is {what}'s port ({listen}); it is never served to the mesh "
                                     "through an inbound port, list only the workload's ports")
    # No UDP port is refused: the listeners above are TCP only, and the agent's own UDP sockets trust
    # no loopback sender (WireGuard's authenticates every datagram; the SOCKS5 relay's and DNS
    # queries' are on ephemeral ports nobody lists)
    ssh_port = _ssh_port(ssh, src_s)
    if ssh_port and ssh_port in inbound_ports:  # the SSH server serves the mesh itself on that port
        raise ConfigError(src_i, f"port {ssh_port} is the agent's SSH server's port ({src_s}); list only the "
                                 "workload's ports, or move or turn off the SSH server")
    engine = _choice(engine, src_e, ENGINES)
    if engine != "auto":  # fail here, before anything starts, when the engine cannot serve a workload
        from anex_agent.tunnels.engines.registry import require_workload_engine

        require_workload_engine(engine, src_e)
    return AgentSettings(
        coordinator_url=url,
        join_token=(token or "").strip(),
        join_token_source=token_source or "ANEX_JOIN_TOKEN",
        state_dir=Path(state) if state else default_state_dir(environ),
        engine=engine,
        engine_source=src_e,
        path=_choice(path, src_p, PATHS),
        proxy_listen=proxy_listen,
        api_listen=api_listen,
        provider=provider_value,
        name=name,
        tunnels=parse_tunnels(environ, getattr(args, "tunnel", None)),
        proxy_auth=proxy_auth,
        socks_listen=socks_listen,
        socks_auth=socks_auth,
        inbound_ports=inbound_ports,
        inbound_udp_ports=inbound_udp_ports,
        ca_file=ca_file,
        path_probe_interval=_seconds(probe, src_pi),
        dead_peer_after=_seconds(dead, src_dp),
        proxy_env=tuple((k, v) for k, v in sorted(environ.items())
                        if k.lower() in ("https_proxy", "http_proxy", "no_proxy") and v),
        gpu_metrics=exposition_options(environ),
        ssh_port=ssh_port,
        forward_max_connections=_forward_max(fwd_max, src_f),
        proxy_max_connections=_forward_max(proxy_max, src_pm, "clients served at once by each proxy"),
    )


def _overlap(a: str, b: str) -> bool:
    """Whether listeners on hosts ``a`` and ``b`` with the same port would collide."""
    return a == b or {a, b} & {"0.0.0.0", "::"} != set()


def _socks(listen_text: str | None, listen_source: str, auth_text: str | None,
           auth_source: str | None) -> tuple[ListenAddress | None, Any]:
    """The SOCKS5 proxy's address (None: off) and credentials, checked together: credentials
    without a listener are a mistake, and a listener beyond loopback needs credentials."""
    from anex_agent.frontends import socks5_core

    auth = socks5_core.SocksAuth.parse(auth_text, source=auth_source or "ANEX_SOCKS_AUTH") if auth_text else None
    if listen_text is None or not listen_text.strip():
        if auth is not None:
            raise ConfigError(auth_source or "ANEX_SOCKS_AUTH", "is set but the SOCKS5 proxy is off; set "
                              "ANEX_SOCKS_LISTEN=127.0.0.1:1080 (or --socks-listen) to turn it on, or unset it")
        return None, None
    listen = parse_listen(listen_text, listen_source)
    socks5_core.check_listener(listen.host, auth, source=listen_source)
    return listen, auth


def _ssh_port(text: str, source: str) -> int:
    try:
        return parse.integer(str(text).strip(), minimum=0, maximum=65535)
    except ValueError as err:
        raise ConfigError(source, f"{text!r}: {err} (a port, or 0 for no SSH server)") from None


def _forward_max(text: str, source: str, what: str = "connections relayed at once per forward port") -> int:
    try:
        return parse.integer(str(text).strip(), minimum=1, maximum=MAX_FORWARD_CONNECTIONS)
    except ValueError as err:
        raise ConfigError(source, f"{text!r}: {err} ({what})") from None


def _seconds(text: str, source: str) -> float:
    """Whole seconds from 1 to 86400."""
    try:
        return float(parse.integer(str(text).strip(), minimum=1, maximum=86400))
    except ValueError as err:
        raise ConfigError(source, f"{text!r}: {err} (seconds)") from None


def add_arguments(parser) -> None:
    """The agent's flags, shared by ``run`` and ``daemon``. Each overrides its environment variable."""
    g = parser.add_argument_group("agent settings (flags override ANEX_* environment variables)")
    g.add_argument("--coordinator", metavar="URL", help="coordinator URL [ANEX_COORDINATOR_URL]")
    g.add_argument("--token", metavar="TOKEN",
                   help="join token, needed on first start; visible in ps, prefer --token-file [ANEX_JOIN_TOKEN]")
    g.add_argument("--token-file", metavar="FILE", help="file holding the join token [ANEX_JOIN_TOKEN_FILE]")
    g.add_argument("--state-dir", metavar="DIR", help="key, credential, last good config [ANEX_STATE_DIR]")
    g.add_argument("--engine", metavar="|".join(ENGINES), help="WireGuard engine, default auto [ANEX_ENGINE]")
    g.add_argument("--path", metavar="|".join(PATHS), help="datagram path, default auto [ANEX_PATH]")
    g.add_argument("--path-probe-interval", metavar="SECONDS",
                   help="while on the WebSocket path, probe UDP this often, default 120 [ANEX_PATH_PROBE_INTERVAL]")
    g.add_argument("--dead-peer-after", metavar="SECONDS",
                   help="data sent to the gateways and nothing received this long: start a fresh handshake, "
                        "default 2 [ANEX_DEAD_PEER_AFTER]")
    g.add_argument("--proxy-listen", metavar="HOST:PORT", help=f"HTTP proxy, default {DEFAULT_PROXY_LISTEN} [ANEX_PROXY_LISTEN]")
    g.add_argument("--api-listen", metavar="HOST:PORT", help=f"agent API, default {DEFAULT_API_LISTEN} [ANEX_API_LISTEN]")
    g.add_argument("--ssh-port", metavar="PORT",
                   help="SSH server port on the mesh address, default 2222; 0: off [ANEX_SSH_PORT]")
    g.add_argument("--forward-max-connections", metavar="N",
                   help="connections relayed at once per forward port, default 1024; more are closed at once "
                        "[ANEX_FORWARD_MAX_CONNECTIONS]")
    g.add_argument("--proxy-max-connections", metavar="N",
                   help="clients served at once by the HTTP proxy and by the SOCKS5 proxy (each), default 1024; "
                        "more are closed at once [ANEX_PROXY_MAX_CONNECTIONS]")
    g.add_argument("--proxy-auth", metavar="USER:PASSWORD",
                   help="require Proxy-Authorization Basic; visible in ps, prefer --proxy-auth-file [ANEX_PROXY_AUTH]")
    g.add_argument("--proxy-auth-file", metavar="FILE", help="file holding USER:PASSWORD [ANEX_PROXY_AUTH_FILE]")
    g.add_argument("--socks-listen", metavar="HOST:PORT",
                   help="SOCKS5 proxy, e.g. 127.0.0.1:1080; off unless set [ANEX_SOCKS_LISTEN]")
    g.add_argument("--socks-auth", metavar="USER:PASSWORD",
                   help="require SOCKS5 username/password; visible in ps, prefer --socks-auth-file [ANEX_SOCKS_AUTH]")
    g.add_argument("--socks-auth-file", metavar="FILE", help="file holding USER:PASSWORD [ANEX_SOCKS_AUTH_FILE]")
    g.add_argument("--ca-file", metavar="FILE",
                   help="PEM CA certificates to trust for an https:// coordinator, besides the system ones [ANEX_CA_FILE]")
    g.add_argument("--allow-insecure", action="store_true", default=None,
                   help="accept a plain http:// coordinator URL to a public address [ANEX_ALLOW_INSECURE=1]")
    g.add_argument("--provider", metavar="NAME", help="vastai|runpod|onprem|other [ANEX_PROVIDER]")
    g.add_argument("--name", metavar="NAME", help="node name, default the host name [ANEX_NODE_NAME]")
    g.add_argument("--inbound-ports", metavar="PORT[/udp],...",
                   help="workload ports served to the mesh by the userspace and wireproxy engines: PORT or PORT/tcp "
                        "for TCP, PORT/udp for UDP (userspace only), e.g. 8000,5353/udp [ANEX_INBOUND_PORTS]")
    g.add_argument(
        "--tunnel", metavar="PORT=HOST:PORT", action="append", default=[], help="a TCP forward, like GW_TUNNEL_<PORT>=HOST:PORT"
    )
