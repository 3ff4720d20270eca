"""Gateway settings: parsed once from flags/environment into a frozen dataclass.

Every bad value raises ConfigError naming the flag and saying what is accepted.
"""

from __future__ import annotations

import hashlib
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent import parse
from anex_agent.client import transport
from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, config_value
from anex_agent.tunnels.engines.ifnames import IFNAME_PREFIX, check_ifname

DEFAULT_LISTEN_UDP = "0.0.0.0:51820"
DNS_PORT = 53  # RFC 1035 §4.2: the upstream's port when --dns-upstream names none
GATEWAY_ENGINES = ("auto", "kernel", "wireguard-go")
GATEWAY_TOKEN = SecretSpec("--token", "ANEX_GATEWAY_TOKEN")


@dataclass(frozen=True)
class GatewaySettings:
    coordinator_url: str
    token: str = field(default="", repr=False)  # secret
    listen_port: int = 51820
    endpoint: str | None = None          # what nodes dial (HOST:PORT); build_settings always sets it
    ws_url: str | None = None
    routes: tuple[str, ...] = ()
    dns_upstream: tuple[str, int] | None = None
    state_dir: Path = Path("/var/lib/anex-gateway")
    engine: str = "auto"
    name: str = ""
    interface: str | None = None         # None: derived from the public key (stable across restarts)
    ca_file: Path | None = None          # PEM CA certificates trusted for an https:// coordinator
    ws_listen: tuple[str, int] | None = None   # the WebSocket relay's HOST:PORT; None: no relay
    tls_cert: Path | None = None         # the relay serves TLS with these (PEM); None: plain
    tls_key: Path | None = None
    ws_trusted_proxies: tuple[str, ...] = ()   # CIDRs of proxies whose X-Forwarded-For the relay believes
    metrics_listen: tuple[str, int] | None = None  # IP:PORT serving GET /metrics; None: not served
    engine_source: str = "--engine"      # the flag or variable ``engine`` came from (for error messages)
    token_source: str = "ANEX_GATEWAY_TOKEN"  # the flag, variable or file the token came from (a refusal names it)


def parse_listen_udp(text: str) -> tuple[str, int]:
    """--listen-udp: ``IP:PORT``, ``[IPv6]:PORT`` or ``:PORT`` (every address; host "")."""
    return config_value("--listen-udp", parse.listen, text, empty_host="")


def parse_upstream(text: str) -> tuple[str, int]:
    """--dns-upstream: ``IP`` or ``IP:PORT`` / ``[IPv6]:PORT`` -> (ip, port)."""
    return config_value("--dns-upstream", parse.ip_port, text.strip(), default_port=DNS_PORT)


def parse_route(text: str) -> str:
    """--route: a network with its prefix length (``10.96.0.0/12``; one address: ``/32``)."""
    return str(config_value("--route", parse.cidr, text, prefix_required=True))


def build_settings(
    *, coordinator_url: str | None, token: str | None, listen_udp: str = DEFAULT_LISTEN_UDP,
    endpoint: str | None = None, ws_url: str | None = None, routes: list[str] | None = None,
    dns_upstream: str | None = None, state_dir: str | None = None, engine: str = "auto",
    name: str | None = None, interface: str | None = None, ca_file: str | None = None,
    allow_insecure: bool = False, ws_listen: str | None = None, tls_cert: str | None = None,
    tls_key: str | None = None, metrics_listen: str | None = None, engine_source: str = "--engine",
    token_source: str = "ANEX_GATEWAY_TOKEN", ws_trusted_proxies: list[str] | None = None,
) -> GatewaySettings:
    """Check every value (ConfigError naming its flag) and build the settings; see :func:`from_args` for the CLI."""
    if not coordinator_url:
        raise ConfigError("--coordinator", "is required (or ANEX_COORDINATOR_URL): the coordinator's http(s) URL")
    if not coordinator_url.startswith(("http://", "https://")):
        raise ConfigError("--coordinator", f"{coordinator_url!r} must start with http:// or https://")
    ca_path = transport.parse_ca_file(ca_file, "--ca-file")
    transport.check_coordinator_url(coordinator_url, "--coordinator", allow_insecure=allow_insecure,
                                    allow_hint=f"--allow-insecure (or {transport.ALLOW_INSECURE_VAR}=1)")
    host, port = parse_listen_udp(listen_udp)
    if endpoint is None and host and host not in ("0.0.0.0", "::"):
        endpoint = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if endpoint is not None:
        config_value("--endpoint", parse.host_port, endpoint)  # the UDP address nodes dial
    if engine not in GATEWAY_ENGINES:
        raise ConfigError(engine_source, f"{engine!r} is not one of {', '.join(GATEWAY_ENGINES)} "
                                         "(a hub needs an OS interface)")
    if interface is not None:
        check_ifname(interface)
    parsed_routes = tuple(dict.fromkeys(parse_route(r) for r in routes or ()))
    upstream = parse_upstream(dns_upstream) if dns_upstream else None
    metrics = (config_value("--metrics-listen", parse.listen, metrics_listen, empty_host=parse.LOCALHOST)
               if metrics_listen else None)
    relay = _relay_settings(ws_listen, tls_cert, tls_key, ws_url)
    if ws_trusted_proxies:
        if ws_listen is None:
            raise ConfigError("--ws-trusted-proxy", "applies to the WebSocket relay: give --ws-listen HOST:PORT too")
        relay["ws_trusted_proxies"] = tuple(dict.fromkeys(
            str(config_value("--ws-trusted-proxy", parse.cidr, text)) for text in ws_trusted_proxies))
    if endpoint is None:  # every value given is well formed; registering no endpoint would leave nodes nothing to dial
        raise ConfigError("--endpoint", f"is required: --listen-udp {listen_udp} names no address nodes could dial; "
                                        f"give the public HOST:PORT of this gateway's UDP port, e.g. --endpoint "
                                        f"gw.example.com:{port}, or --listen-udp PUBLIC_IP:{port}")
    return GatewaySettings(
        coordinator_url=coordinator_url.rstrip("/"),
        token=token or "",
        listen_port=port,
        endpoint=endpoint,
        ws_url=ws_url,
        routes=parsed_routes,
        dns_upstream=upstream,
        state_dir=Path(state_dir) if state_dir else GatewaySettings.state_dir,
        engine=engine,
        engine_source=engine_source,
        token_source=token_source,
        name=name or socket.gethostname(),
        interface=interface,
        ca_file=ca_path,
        metrics_listen=metrics,
        **relay,
    )


def _relay_settings(ws_listen: str | None, tls_cert: str | None, tls_key: str | None, ws_url: str | None) -> dict:
    """``--ws-listen``, ``--tls-cert``, ``--tls-key`` (and ``--ws-url``'s scheme) checked together."""
    if ws_url is not None and not ws_url.startswith(("ws://", "wss://")):
        raise ConfigError("--ws-url", f"{ws_url!r} must start with ws:// or wss://")
    if ws_url is not None and ws_listen is None:
        # the relay exists only inside this process (it authenticates nodes with the hub's key and
        # the watched peer set): advertising one without serving it sends UDP-blocked nodes nowhere
        raise ConfigError("--ws-url", "advertises a WebSocket relay, but this gateway serves none: give --ws-listen "
                                      "HOST:PORT too (the relay runs in the gateway; behind a TLS-terminating proxy "
                                      "or ingress, --ws-listen is where it forwards to and --ws-url its public URL)")
    if (tls_cert is None) != (tls_key is None):
        raise ConfigError("--tls-key" if tls_key is None else "--tls-cert", "--tls-cert and --tls-key go together")
    if ws_listen is None:
        if tls_cert is not None:
            raise ConfigError("--tls-cert", "serves the WebSocket relay: give --ws-listen HOST:PORT too")
        return {}
    try:
        listen = parse.host_port(ws_listen)
    except ValueError as err:
        raise ConfigError("--ws-listen", f"{ws_listen!r}: {err}") from None
    for flag, path in (("--tls-cert", tls_cert), ("--tls-key", tls_key)):
        if path is not None and not Path(path).is_file():
            raise ConfigError(flag, f"{path!r} is not a readable file (PEM)")
    return {"ws_listen": listen, "tls_cert": Path(tls_cert) if tls_cert else None,
            "tls_key": Path(tls_key) if tls_key else None}


def from_args(args, environ: Mapping[str, str]) -> GatewaySettings:
    """Settings from the gateway CLI's ``args`` (flags win over ``environ``); see :mod:`anex_agent.gateway.cli`."""
    token, token_source = pick_secret(GATEWAY_TOKEN, environ, flag_value=args.token, file_value=args.token_file)
    return build_settings(
        coordinator_url=args.coordinator or environ.get("ANEX_COORDINATOR_URL"), token=token,
        listen_udp=args.listen_udp, endpoint=args.endpoint, ws_url=args.ws_url, routes=args.route,
        dns_upstream=args.dns_upstream, state_dir=args.state_dir or environ.get("ANEX_STATE_DIR"),
        engine=args.engine or environ.get("ANEX_ENGINE") or "auto",
        engine_source="--engine" if args.engine else "ANEX_ENGINE", token_source=token_source or "ANEX_GATEWAY_TOKEN",
        name=args.name, interface=args.interface,
        ca_file=args.ca_file or environ.get(transport.CA_FILE_VAR),
        allow_insecure=args.allow_insecure or transport.allow_insecure_from(environ),
        ws_listen=getattr(args, "ws_listen", None), tls_cert=getattr(args, "tls_cert", None),
        tls_key=getattr(args, "tls_key", None), ws_trusted_proxies=getattr(args, "ws_trusted_proxy", None),
        metrics_listen=getattr(args, "metrics_listen", None) or environ.get("ANEX_GATEWAY_METRICS_LISTEN") or None,
    )


def interface_for(public_key_b64: str) -> str:
    """A stable interface name for this gateway: ``anxgw`` + 8 hex of the key's hash (13 characters).

    Stable across restarts so that a restart replaces (rather than duplicates) the
    nftables table and clears its own stale UAPI socket; distinct per gateway key.
    """
    return check_ifname(f"{IFNAME_PREFIX}gw{hashlib.sha256(public_key_b64.encode()).hexdigest()[:8]}")


def table_for(ifname: str) -> str:
    """Our nftables table name for the interface: ``anex_gw_<suffix>``."""
    return f"anex_gw_{ifname[len(IFNAME_PREFIX) + 2:] if ifname.startswith(IFNAME_PREFIX + 'gw') else ifname}"
