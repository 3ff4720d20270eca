"""``anex-agent gateway``: the cluster-side WireGuard hub, routes/NAT into the cluster, DNS for the mesh.

Flags (environment fallback in brackets):

    --coordinator URL       coordinator base URL            [ANEX_COORDINATOR_URL]
    --token T               gateway join token              [ANEX_GATEWAY_TOKEN]
                            (visible to every user in ps: prefer --token-file)
    --token-file FILE       file holding the gateway join token [ANEX_GATEWAY_TOKEN_FILE]
    --ca-file FILE          PEM CA certificates trusted for an https:// coordinator [ANEX_CA_FILE]
    --allow-insecure        accept plain http:// to a public coordinator address [ANEX_ALLOW_INSECURE=1]
    --listen-udp ADDR       WireGuard UDP IP:PORT or :PORT (default 0.0.0.0:51820; the engine binds the port on all addresses)
    --endpoint HOST:PORT    what nodes dial (default: --listen-udp when it names an address; required otherwise)
    --ws-url URL            WebSocket relay URL advertised to UDP-blocked nodes (ws:// or wss://; needs --ws-listen)
    --ws-listen HOST:PORT   serve the WebSocket relay there (plain, or TLS with --tls-cert/--tls-key)
    --tls-cert FILE         PEM certificate (chain) of the relay
    --tls-key FILE          PEM private key of the relay
    --ws-trusted-proxy CIDR a reverse proxy in front of the relay whose X-Forwarded-For names the
                            client (repeat; without it the header is ignored)
    --metrics-listen IP:PORT serve Prometheus metrics there (GET /metrics, no token: bind loopback or a
                            cluster-only address) [ANEX_GATEWAY_METRICS_LISTEN]
    --route CIDR            a cluster network nodes may reach (repeat; with its prefix length: 10.96.0.0/12)
    --dns-upstream IP[:PORT] cluster DNS to forward mesh queries to
    --state-dir DIR         key pair and last registration   [ANEX_STATE_DIR] (default /var/lib/anex-gateway)
    --engine E              auto | kernel | wireguard-go
    --interface NAME        interface name (default: anxgw + hash of the public key)
"""

from __future__ import annotations

import argparse
import asyncio
import os

from anex_agent.host import statelock
from anex_agent.gateway.settings import DEFAULT_LISTEN_UDP, GATEWAY_ENGINES, from_args


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", default=None, help="coordinator base URL [ANEX_COORDINATOR_URL]")
    parser.add_argument("--token", default=None,
                        help="gateway join token; visible to every user in ps, prefer --token-file [ANEX_GATEWAY_TOKEN]")
    parser.add_argument("--token-file", default=None, metavar="FILE",
                        help="file holding the gateway join token [ANEX_GATEWAY_TOKEN_FILE]")
    parser.add_argument("--ca-file", default=None, metavar="FILE",
                        help="PEM CA certificates to trust for an https:// coordinator, besides the system ones "
                             "[ANEX_CA_FILE]")
    parser.add_argument("--allow-insecure", action="store_true",
                        help="accept a plain http:// coordinator URL to a public address [ANEX_ALLOW_INSECURE=1]")
    parser.add_argument("--listen-udp", default=DEFAULT_LISTEN_UDP, help="WireGuard UDP IP:PORT, [IPv6]:PORT or :PORT, port 1..65535")
    parser.add_argument("--endpoint", default=None,
                        help="UDP HOST:PORT nodes dial (default: --listen-udp when it names an address; required "
                             "when it listens on every address)")
    parser.add_argument("--ws-url", default=None,
                        help="WebSocket relay URL advertised to UDP-blocked nodes (ws:// or wss://; behind a "
                             "TLS-terminating proxy or ingress: its public URL); needs --ws-listen")
    parser.add_argument("--ws-listen", default=None, metavar="HOST:PORT",
                        help="serve the WebSocket relay for UDP-blocked nodes on HOST:PORT")
    parser.add_argument("--tls-cert", default=None, metavar="FILE", help="PEM certificate chain of the relay (TLS)")
    parser.add_argument("--tls-key", default=None, metavar="FILE", help="PEM private key of the relay (TLS)")
    parser.add_argument("--ws-trusted-proxy", action="append", default=[], metavar="CIDR",
                        help="a reverse proxy or ingress in front of the relay: its X-Forwarded-For names the client "
                             "the relay's per-address limits count (repeat; without it the header is ignored)")
    parser.add_argument("--metrics-listen", default=None, metavar="IP:PORT",
                        help="serve Prometheus metrics on IP:PORT (GET /metrics, no token: bind loopback or an "
                             "address only the cluster reaches) [ANEX_GATEWAY_METRICS_LISTEN]")
    parser.add_argument("--route", action="append", default=[], metavar="CIDR",
                        help="cluster network to route, in CIDR form with its prefix length (10.96.0.0/12; repeat)")
    parser.add_argument("--dns-upstream", default=None, metavar="IP[:PORT]", help="cluster DNS server")
    parser.add_argument("--state-dir", default=None, help="state directory [ANEX_STATE_DIR]")
    parser.add_argument("--engine", default=None, choices=GATEWAY_ENGINES, help="default auto [ANEX_ENGINE]")
    parser.add_argument("--name", default=None, help="gateway name (default: hostname)")
    parser.add_argument("--interface", default=None, help="WireGuard interface name")


def main(args: argparse.Namespace) -> int:
    settings = from_args(args, os.environ)
    lock = statelock.acquire(settings.state_dir, "gateway")  # before anything else: one instance per state dir
    from anex_agent.gateway.service import Gateway

    from anex_agent.host.sdnotify import Notifier, supervised

    notifier = Notifier.from_environ(os.environ)  # systemd Type=notify: READY=1 once the hub serves, watchdog
    Notifier.scrub(os.environ)
    gateway = Gateway(settings)
    try:
        return asyncio.run(supervised(gateway.run(), notifier, gateway.ready, "gateway up"))
    finally:
        lock.release()
