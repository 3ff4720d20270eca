"""``anex-agent coordinator``: run the coordinator REST service.

Who may connect: the default listen address is loopback (127.0.0.1:8700). Admin routes
need the admin token, node routes a node credential, gateway routes a gateway
credential, join routes a join token in the body; /healthz, /readyz, /metrics and
/v1/openapi.json need nothing (/metrics adds the fleet's series for the admin or metrics token). Listen on a wider address only behind TLS (a reverse
proxy or your ingress): bearer secrets travel in headers.
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

from anex_agent.coordinator import app as app_module
from anex_agent.coordinator import limits
from anex_agent.coordinator.limits import Limits
from anex_agent.coordinator.context import Coordinator
from anex_agent.coordinator.ipam import Pool
from anex_agent.coordinator.settings import DEFAULT_LISTEN, DEFAULT_MTU, DEFAULT_NETWORK, Settings, default_state_dir
from anex_agent.coordinator.states import Timings
from anex_agent.errors import ConfigError

log = logging.getLogger("anex_agent.coordinator")


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", default=DEFAULT_LISTEN, metavar="HOST:PORT",
                        help=f"address to serve on (default {DEFAULT_LISTEN}: this machine only)")
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
    parser.add_argument("--address-quarantine", type=float, default=3600.0, metavar="SECONDS",
                        help="a freed address is not reused for this long (default 3600)")
    parser.add_argument("--access-token-ttl", type=int, default=300, metavar="SECONDS",
                        help="lifetime of agent API access tokens (default 300, at most 86400)")
    parser.add_argument("--heartbeat-flush-interval", type=float, default=0.1, metavar="SECONDS",
                        help="heartbeats are written in one batch this often (default 0.1; 0 writes each "
                             "heartbeat before answering it, slower)")
    parser.add_argument("--metrics-token-file", type=Path, metavar="FILE",
                        help="token (mode 0600) that Prometheus presents as bearer to see the fleet's series on "
                             "/metrics; also $ANEX_METRICS_TOKEN; the admin token always works")
    parser.add_argument("--trusted-proxy", action="append", default=[], metavar="IP",
                        help="reverse proxy whose X-Forwarded-For names the client for the failed-authentication "
                             "limit (repeatable; default: none, the TCP peer is the client)")
    parser.add_argument("--signing-key-file", type=Path, metavar="FILE",
                        help="Ed25519 key signing agent API access tokens (default <state-dir>/access-token-signing-key; "
                             "every coordinator on one database needs the same file)")


def _listen(value: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    host = host.strip("[]")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError("--listen", f"{value!r} must be HOST:PORT, e.g. 127.0.0.1:8700 or [::1]:8700")
    try:
        ipaddress.ip_address(host)
    except ValueError:
        if host != "localhost":
            raise ConfigError("--listen", f"{host!r} must be an IP address (or localhost)") from None
    return host, int(port)


def settings_from(args: argparse.Namespace, environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
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
        timings = Timings(args.heartbeat_interval, args.not_ready_after, args.expired_after)
    except ValueError as err:
        raise ConfigError("--heartbeat-interval/--not-ready-after/--expired-after", str(err)) from None
    if not args.address_quarantine >= 0:  # also NaN: it would make a freed address never (or randomly) reusable
        raise ConfigError("--address-quarantine", "must be 0 or more seconds")
    if not 0 <= args.heartbeat_flush_interval <= 5:
        raise ConfigError("--heartbeat-flush-interval", "must be 0..5 seconds")
    try:
        proxies = frozenset(str(ipaddress.ip_address(ip)) for ip in args.trusted_proxy)
    except ValueError:
        raise ConfigError("--trusted-proxy", "must be an IP address") from None
    if not 1 <= args.access_token_ttl <= 86400:
        raise ConfigError("--access-token-ttl", "must be 1..86400 seconds")
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
        metrics_token_file=args.metrics_token_file,
        limits=Limits(trusted_proxies=proxies),
    )


async def serve(settings: Settings, host: str, port: int, signing_key_file: Path | None) -> None:
    settings.state_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    modules = app_module.load_modules()
    ctx = await Coordinator.open(
        settings, extra_migrations=app_module.module_migrations(modules), signing_key_file=signing_key_file
    )
    log.info("admin token: %s", ctx.admin_token_source)
    log.info("database: %s (%s)", _redacted(settings.database_url), ctx.db.dialect)
    application = app_module.build_app(ctx, modules)
    runner = limits.make_runner(application, settings.limits, access_log=None, shutdown_timeout=5)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port, reuse_address=True)
        try:
            await site.start()
        except OSError as err:
            raise ConfigError("--listen", f"cannot listen on {host}:{port}: {err.strerror}") from None
        bound = runner.addresses[0] if runner.addresses else (host, port)
        log.info("coordinator listening on http://%s:%s (network %s)", bound[0], bound[1], settings.pool.cidr)
        print(f"anex-agent coordinator listening on http://{bound[0]}:{bound[1]}", flush=True)
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
    asyncio.run(serve(settings, host, port, args.signing_key_file))
    return 0
