"""``anex-agent coordinator``: run the coordinator REST service.

Who may connect: the default listen address is loopback (127.0.0.1:8700). Admin routes
need the admin token, node routes a node credential, gateway routes a gateway
credential, join routes a join token in the body; /healthz, /readyz, /metrics and
/v1/openapi.json need nothing (/metrics adds the fleet's series for the admin or metrics token).
Listen on a wider address only with TLS: ``--tls-cert``/``--tls-key`` (the
coordinator serves HTTPS itself) or a reverse proxy / ingress in front: bearer secrets
travel in headers. A non-loopback ``--listen`` without ``--tls-cert`` starts, with a
warning saying so and how to fix it (:func:`plain_http_warning`).

Secrets never need the command line (every user of the host sees it in ``ps``): the
admin token comes from ``ANEX_ADMIN_TOKEN`` or ``ANEX_ADMIN_TOKEN_FILE`` (else the state
dir), the PostgreSQL password from ``--database-password-file``, ``ANEX_DATABASE_PASSWORD``,
``ANEX_DATABASE_PASSWORD_FILE``, or asyncpg's own ``PGPASSWORD``/``PGPASSFILE``. A password
inside ``--database`` still works, with a warning.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import logging
import os
import signal
from pathlib import Path

from aiohttp import web

from anex_agent import parse
from anex_agent.host import statelock
from anex_agent.wire import access_token
from anex_agent.host.config_secrets import SecretSpec, pick_secret, warn_command_line
from anex_agent.coordinator import app as app_module
from anex_agent.coordinator import gateway_networks as gateway_routes, limits, tls
from anex_agent.coordinator.limits import Limits
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.db import split_password
from anex_agent.coordinator.ipam import Pool
from anex_agent.coordinator.settings import DEFAULT_LISTEN, DEFAULT_MTU, DEFAULT_NETWORK, Settings, default_state_dir
from anex_agent.coordinator.states import Timings
from anex_agent.errors import ConfigError, config_value
from anex_agent.wire.route_policy import DEFAULT_GATEWAY_ROUTES
from anex_agent.telemetry.options import exposition_options

log = logging.getLogger("anex_agent.coordinator")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve on: IP:PORT, [IPv6]:PORT or localhost:PORT; port 0 picks a free port "
                             f"and the address served is printed (default {DEFAULT_LISTEN}: this machine only)")
    parser.add_argument("--database", metavar="URL",
                        help="sqlite:///PATH or postgresql://USER:PASS@HOST/DB (default: SQLite in the state dir); "
                             "also $ANEX_DATABASE_URL")
    parser.add_argument("--state-dir", type=Path, metavar="DIR",
                        help="admin token, signing key, SQLite file (default $ANEX_STATE_DIR/coordinator "
                             "or ./state/coordinator)")
    parser.add_argument("--network", default=DEFAULT_NETWORK, metavar="CIDR",
                        help=f"IPv4 mesh network to assign addresses from (default {DEFAULT_NETWORK})")
    parser.add_argument("--mtu", type=int, default=DEFAULT_MTU, help=f"tunnel MTU told to nodes (default {DEFAULT_MTU})")
    parser.add_argument("--dns", action="append", default=[], metavar="IP",
                        help="DNS server for nodes (repeatable; default: the gateways' mesh addresses)")
    parser.add_argument("--search-domain", action="append", default=[], metavar="DOMAIN",
                        help="DNS search domain for nodes (repeatable)")
    parser.add_argument("--heartbeat-interval", type=float, default=15.0, metavar="SECONDS",
                        help="how often nodes are told to heartbeat (default 15)")
    parser.add_argument("--not-ready-after", type=float, default=60.0, metavar="SECONDS",
                        help="a node without heartbeat for this long is not_ready (default 60)")
    parser.add_argument("--expired-after", type=float, default=3600.0, metavar="SECONDS",
                        help="a node without heartbeat for this long is expired (default 3600)")
    parser.add_argument("--gateway-gone-after", type=float, default=60.0, metavar="SECONDS",
                        help="a gateway not heard of for this long (no open watch stream) is gone: nodes leave it "
                             "out until it is back (default 60, at least 5)")
    parser.add_argument("--credential-rotation", type=float, default=3600.0, metavar="SECONDS",
                        help="node and gateway credentials are replaced this often (default 3600)")
    parser.add_argument("--credential-grace", type=float, default=300.0, metavar="SECONDS",
                        help="a replaced credential keeps working this long (default 300)")
    parser.add_argument("--address-quarantine", type=float, default=3600.0, metavar="SECONDS",
                        help="a freed address is not reused for this long (default 3600)")
    parser.add_argument("--access-token-ttl", type=int, default=300, metavar="SECONDS",
                        help="lifetime of agent API access tokens, each good for one call (default 300, at most 3600)")
    parser.add_argument("--heartbeat-flush-interval", type=float, default=0.1, metavar="SECONDS",
                        help="heartbeats are written in one batch this often (default 0.1; 0 writes each "
                             "heartbeat before answering it, slower)")
    parser.add_argument("--gateway-route", action="append", default=[], metavar="CIDR",
                        help="a network gateways may offer to nodes (repeatable; default: private address space, "
                             f"{', '.join(DEFAULT_GATEWAY_ROUTES)}; 'none': no network but the mesh); a gateway "
                             "registering a route outside the list is refused, and nodes install only routes inside it")
    parser.add_argument("--coordinator-key-file", type=Path, metavar="FILE",
                        help="X25519 key that join proofs are made against (default <state-dir>/coordinator-key; "
                             "every coordinator on one database needs the same file)")
    parser.add_argument("--metrics-token-file", type=Path, metavar="FILE",
                        help="token (mode 0600) that Prometheus presents as bearer to see the fleet's series on "
                             "/metrics; also $ANEX_METRICS_TOKEN; the admin token always works")
    parser.add_argument("--trusted-proxy", action="append", default=[], metavar="IP",
                        help="reverse proxy whose X-Forwarded-For names the client for the failed-authentication "
                             "limit (repeatable; default: none, the TCP peer is the client)")
    parser.add_argument("--signing-key-file", type=Path, metavar="FILE",
                        help="Ed25519 key signing agent API access tokens (default <state-dir>/access-token-signing-key; "
                             "every coordinator on one database needs the same file)")
    parser.add_argument("--agent-binary", action="append", default=[], metavar="[ARCH=]PATH",
                        help="the single-file agent (images/build-single-file) that rented machines download from "
                             "GET /v1/agent/ARCH with their join token (repeatable, one per architecture as uname -m "
                             "names it; a bare PATH is this machine's architecture)")
    parser.add_argument("--ssh-ca-key-file", type=Path, metavar="FILE",
                        help="Ed25519 SSH certificate authority (default <state-dir>/ssh-ca-key; every coordinator on "
                             "one database needs the same file)")
    parser.add_argument("--ssh-ca-previous", action="append", default=[], metavar="PUBLIC_KEY",
                        help="an older SSH CA public key still trusted while the CA is rotated (repeatable)")
    parser.add_argument("--ssh-certificate-ttl", type=int, default=600, metavar="SECONDS",
                        help="default lifetime of SSH user certificates (default 600)")
    parser.add_argument("--ssh-certificate-max-ttl", type=int, default=3600, metavar="SECONDS",
                        help="longest lifetime an SSH user certificate may be asked for (default 3600)")
    parser.add_argument("--ssh-issuer-token-file", type=Path, metavar="FILE",
                        help="token (mode 0600) good only for SSH user certificates (the admin token always works)")
    parser.add_argument("--reuse-port", action="store_true",
                        help="listen with SO_REUSEPORT: several coordinators on one host (each with its own "
                             "--state-dir, one PostgreSQL) share one address and the kernel spreads connections")
    _configure_secrets_and_tls(parser)


def agent_binaries(values: list[str]) -> tuple[tuple[str, Path], ...]:
    """``--agent-binary [ARCH=]PATH`` values: each an existing file, one per architecture."""
    import platform

    out: dict[str, Path] = {}
    for value in values:
        arch, sep, path = value.partition("=")
        if not sep:
            arch, path = platform.machine(), value
        if not arch or not path or not all(c.isalnum() or c in "_-" for c in arch):
            raise ConfigError("--agent-binary", f"{value!r} must be PATH or ARCH=PATH (ARCH as uname -m names it)")
        if arch in out:
            raise ConfigError("--agent-binary", f"architecture {arch} is given twice")
        if not Path(path).is_file():
            raise ConfigError("--agent-binary", f"{path!r} is not a file")
        out[arch] = Path(path).resolve()
    return tuple(sorted(out.items()))


def _configure_secrets_and_tls(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--database-password-file", type=Path, metavar="FILE",
                        help="file holding the PostgreSQL password (also $ANEX_DATABASE_PASSWORD, "
                             "$ANEX_DATABASE_PASSWORD_FILE, $PGPASSWORD, $PGPASSFILE); keeps it out of --database")
    parser.add_argument("--tls-cert", type=Path, metavar="FILE",
                        help="serve HTTPS with this PEM certificate chain (leaf first); needs --tls-key")
    parser.add_argument("--tls-key", type=Path, metavar="FILE",
                        help="the PEM private key of --tls-cert (unencrypted; keep it mode 0600)")


DATABASE_PASSWORD = SecretSpec(None, "ANEX_DATABASE_PASSWORD", file_flag="--database-password-file")
ADMIN_TOKEN = SecretSpec(None, "ANEX_ADMIN_TOKEN")


def _secrets_and_tls(args: argparse.Namespace, env) -> dict:
    """The secret and TLS fields of :class:`Settings`, read once here; warnings for secrets on the command line."""
    if args.database and split_password(args.database)[1] is not None:
        warn_command_line("a password in --database", "--database-password-file", "ANEX_DATABASE_PASSWORD")
    password, _ = pick_secret(DATABASE_PASSWORD, env, file_value=getattr(args, "database_password_file", None))
    admin_token, source = pick_secret(ADMIN_TOKEN, env)
    if source == ADMIN_TOKEN.file_var:
        log.info("admin token read from the file in %s", source)
    cert, key = getattr(args, "tls_cert", None), getattr(args, "tls_key", None)
    tls.check_pair(cert, key)
    if cert is not None:
        tls.server_ssl_context(cert, key)  # fail now, naming the flag, rather than after the database opened
    return {"database_password": password, "admin_token": admin_token, "tls_cert": cert, "tls_key": key,
            "metrics_token": env.get("ANEX_METRICS_TOKEN") or None}


def plain_http_warning(host: str, port: int, tls: bool) -> str | None:
    """The warning for plain HTTP on an address other machines reach (None: loopback, or TLS).

    Join tokens, node and gateway credentials and the admin token travel in headers: over
    plain HTTP past this host anyone on the path reads them. Not refused: behind a
    TLS-terminating proxy on a private network it is how some run it."""
    if tls:
        return None
    try:
        if ipaddress.ip_address(host).is_loopback:
            return None
    except ValueError:
        pass
    where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    return (f"--listen {where} without --tls-cert: plain HTTP reachable from other machines, so join tokens, "
            "credentials and the admin token would cross the network in clear text; give --tls-cert FILE and "
            "--tls-key FILE (agents and gateways then use https://), or listen on 127.0.0.1 behind a "
            "TLS-terminating reverse proxy or ingress")


def _listen(value: str) -> tuple[str, int]:
    """--listen: port 0 is allowed and means any free port (the bound address is printed)."""
    return config_value("--listen", parse.listen, value, any_port=True)


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    secret_fields = _secrets_and_tls(args, env)
    state_dir = args.state_dir or default_state_dir(env)
    database = args.database or env.get("ANEX_DATABASE_URL") or f"sqlite:///{state_dir / 'coordinator.db'}"
    if not 1280 <= args.mtu <= 9000:
        raise ConfigError("--mtu", f"{args.mtu} is out of range; use 1280..9000")
    for server in args.dns:
        try:
            ipaddress.ip_address(server)
        except ValueError:
            raise ConfigError("--dns", f"{server!r} is not an IP address") from None
    try:
        timings = Timings(args.heartbeat_interval, args.not_ready_after, args.expired_after,
                          args.credential_rotation, args.credential_grace)
    except ValueError as err:
        flags = "--heartbeat-interval/--credential-rotation/--credential-grace" if "credential" in str(err) else \
            "--heartbeat-interval/--not-ready-after/--expired-after"
        raise ConfigError(flags, str(err)) from None
    if not 5 <= args.gateway_gone_after <= 86400:  # also NaN
        raise ConfigError("--gateway-gone-after", f"{args.gateway_gone_after} is out of range; use 5..86400 seconds")
    if not args.address_quarantine >= 0:  # also NaN: it would make a freed address never (or randomly) reusable
        raise ConfigError("--address-quarantine", "must be 0 or more seconds")
    if not 0 <= args.heartbeat_flush_interval <= 5:
        raise ConfigError("--heartbeat-flush-interval", "must be 0..5 seconds")
    if not 1 <= args.access_token_ttl <= access_token.MAX_TTL:  # agents refuse longer-lived tokens
        raise ConfigError("--access-token-ttl", f"{args.access_token_ttl} is out of range; "
                          f"use 1..{access_token.MAX_TTL} seconds (an hour at most)")
    if not 1 <= args.ssh_certificate_ttl <= args.ssh_certificate_max_ttl <= 86400:
        raise ConfigError("--ssh-certificate-ttl/--ssh-certificate-max-ttl",
                          "need 1 <= ttl <= max ttl <= 86400 seconds")
    routes = gateway_routes.from_flags(args.gateway_route)
    try:
        proxies = frozenset(str(ipaddress.ip_address(ip)) for ip in args.trusted_proxy)
    except ValueError:
        raise ConfigError("--trusted-proxy", "must be an IP address") from None
    return Settings(
        state_dir=state_dir,
        database_url=database,
        pool=Pool.parse(args.network),
        mtu=args.mtu,
        dns=tuple(args.dns),
        search_domains=tuple(args.search_domain),
        timings=timings,
        address_quarantine=args.address_quarantine,
        access_token_ttl=args.access_token_ttl,
        heartbeat_flush_interval=args.heartbeat_flush_interval,
        gateway_routes=routes,
        gateway_gone_after=args.gateway_gone_after,
        **secret_fields,
        metrics_token_file=args.metrics_token_file,
        limits=Limits(trusted_proxies=proxies),
        gpu_metrics=exposition_options(env),
        agent_binaries=agent_binaries(getattr(args, "agent_binary", [])),
        ssh_ca_key_file=args.ssh_ca_key_file,
        ssh_ca_previous=tuple(args.ssh_ca_previous),
        ssh_certificate_ttl=args.ssh_certificate_ttl,
        ssh_certificate_max_ttl=args.ssh_certificate_max_ttl,
        ssh_issuer_token_file=args.ssh_issuer_token_file,
    )


async def serve(
    settings: Settings, host: str, port: int, signing_key_file: Path | None, coordinator_key_file: Path | None = None,
    ready: asyncio.Event | None = None, *, reuse_port: bool = False,
) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    modules = app_module.load_modules()
    ssl_context = tls.server_ssl_context(settings.tls_cert, settings.tls_key) if settings.tls_cert else None
    scheme = "https" if ssl_context else "http"
    ctx = await Coordinator.open(
        settings, extra_migrations=app_module.module_migrations(modules), signing_key_file=signing_key_file,
        environ={name: value for name, value in (("ANEX_ADMIN_TOKEN", settings.admin_token),
                                                 ("ANEX_METRICS_TOKEN", settings.metrics_token)) if value},
        coordinator_key_file=coordinator_key_file,
    )
    log.info("admin token: %s", ctx.admin_token_source)
    log.info("database: %s (%s)", _redacted(settings.database_url), ctx.db.dialect)
    application = app_module.build_app(ctx, modules)
    runner = limits.make_runner(application, settings.limits, access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True, reuse_port=reuse_port or None,
                           ssl_context=ssl_context)
        try:
            await site.start()
        except OSError as err:
            raise ConfigError("--listen", f"cannot listen on {host}:{port}: {err.strerror}") from None
        bound = runner.addresses[0] if runner.addresses else (host, port)
        log.info("coordinator listening on %s://%s:%s (network %s)", scheme, bound[0], bound[1], settings.pool.cidr)
        print(f"anex-agent coordinator listening on {scheme}://{bound[0]}:{bound[1]}", flush=True)
        if ready is not None:  # systemd: READY=1
            ready.set()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
    finally:
        await runner.cleanup()


def _redacted(url: str) -> str:
    from anex_agent.coordinator.db import _redact

    return _redact(url)


def main(args: argparse.Namespace) -> int:
    host, port = _listen(args.listen)
    settings = settings_from(args)
    lock = statelock.acquire(settings.state_dir, "coordinator")  # noqa: F841 - held until exit; one instance per state dir
    warning = plain_http_warning(host, port, settings.tls_cert is not None)
    if warning:
        log.warning("%s", warning)
    from anex_agent.host.sdnotify import Notifier, supervised

    notifier = Notifier.from_environ(os.environ)  # systemd Type=notify: READY=1 once listening, watchdog
    Notifier.scrub(os.environ)
    ready = asyncio.Event()
    asyncio.run(supervised(serve(settings, host, port, args.signing_key_file, args.coordinator_key_file, ready,
                                     reuse_port=args.reuse_port),
                           notifier, ready, f"listening on {host}:{port}"))
    return 0
