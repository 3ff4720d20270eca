"""``anex-agent gateway``: the cluster-side WireGuard hub, routes/NAT into the cluster, DNS for the mesh.

Flags (environment fallback in brackets):

    --coordinator URL       coordinator base URL            [ANEX_COORDINATOR_URL]
    --token T               gateway join token              [ANEX_GATEWAY_TOKEN]
    --listen-udp ADDR       WireGuard UDP HOST:PORT (default 0.0.0.0:51820; the engine binds the port on all addresses)
    --endpoint HOST:PORT    what nodes dial (default: --listen-udp when it names an address)
    --ws-url URL            WebSocket relay URL advertised to UDP-blocked nodes
    --route CIDR            a cluster network nodes may reach (repeat)
    --dns-upstream IP[:PORT] cluster DNS to forward mesh queries to
    --state-dir DIR         key pair and last registration   [ANEX_STATE_DIR] (default /var/lib/anex-gateway)
    --engine E              auto | kernel | wireguard-go
    --interface NAME        interface name (default: anxgw + hash of the public key)
"""

from __future__ import annotations

import argparse
import asyncio
import os

from anex_agent.gateway.settings import DEFAULT_LISTEN_UDP, GATEWAY_ENGINES, build_settings


def configure(parser: argparse.ArgumentParser) -> None:
    env = os.environ.get
    parser.add_argument("--coordinator", default=env("ANEX_COORDINATOR_URL"), help="coordinator base URL")
    parser.add_argument("--token", default=env("ANEX_GATEWAY_TOKEN"), help="gateway join token")
    parser.add_argument("--listen-udp", default=DEFAULT_LISTEN_UDP, help="WireGuard UDP HOST:PORT")
    parser.add_argument("--endpoint", default=None, help="UDP HOST:PORT nodes dial (default: --listen-udp)")
    parser.add_argument("--ws-url", default=None, help="WebSocket relay URL to advertise")
    parser.add_argument("--route", action="append", default=[], metavar="CIDR", help="cluster network to route (repeat)")
    parser.add_argument("--dns-upstream", default=None, metavar="IP[:PORT]", help="cluster DNS server")
    parser.add_argument("--state-dir", default=env("ANEX_STATE_DIR"), help="state directory")
    parser.add_argument("--engine", default=env("ANEX_ENGINE", "auto"), choices=GATEWAY_ENGINES)
    parser.add_argument("--name", default=None, help="gateway name (default: hostname)")
    parser.add_argument("--interface", default=None, help="WireGuard interface name")


def main(args: argparse.Namespace) -> int:
    settings = build_settings(
        coordinator_url=args.coordinator, token=args.token, listen_udp=args.listen_udp, endpoint=args.endpoint,
        ws_url=args.ws_url, routes=args.route, dns_upstream=args.dns_upstream, state_dir=args.state_dir,
        engine=args.engine, name=args.name, interface=args.interface,
    )
    from anex_agent.gateway.service import Gateway

    return asyncio.run(Gateway(settings).run())
