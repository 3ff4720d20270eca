"""The virtual node's settings, parsed once from flags and the environment (flags win).

=============================  ================================  =============================================
flag                           variable                          meaning
=============================  ================================  =============================================
``--coordinator URL``          ``ANEX_COORDINATOR_URL``          the coordinator's REST API (required)
``--admin-token-file FILE``    ``ANEX_ADMIN_TOKEN[_FILE]``       the coordinator's admin token (required)
``--ca-file FILE``                                               PEM CA of an ``https://`` coordinator
``--kubeconfig FILE``          ``KUBECONFIG``                    else the in-cluster service account
``--providers LIST``           ``ANEX_VIRTUAL_NODE_PROVIDERS``   providers to make a Node for (vastai,runpod)
``--node-prefix TEXT``                                           Node names: ``<prefix><provider>`` (anex-)
``--internal-ip IP``           ``ANEX_VIRTUAL_NODE_IP``          the node's InternalIP (the API server reaches
                                                                 the kubelet port there); else this host's
``--kubelet-port PORT``                                          daemonEndpoints.kubeletEndpoint.Port (10250)
``--provision-prefix TEXT``                                      provision names: ``<prefix><pod uid>`` (vk-)
``--max-pods N``                                                 the pods capacity of each Node (100)
``--capacity-cpu/-memory-mib/-gpus N``                           capacity while the offers cannot be read
``--offers-limit N``                                             offers summed into the capacity (100)
``--poll-interval SECONDS``                                      how often ready provisions' nodes are read (2)
``--volume-refresh SECONDS``                                     how often running pods' ConfigMap and Secret
                                                                 volumes are read again, changed files pushed (60)
``--metrics-listen IP:PORT``   ``ANEX_VIRTUAL_NODE_METRICS_LISTEN``  Prometheus metrics there (GET /metrics, no
                                                                 token: bind loopback); default: not served
=============================  ================================  =============================================

A bad value is a :class:`~anex_agent.errors.ConfigError` naming the flag or variable.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent import parse
from anex_agent.host.config_secrets import SecretSpec, pick_secret
from anex_agent.errors import ConfigError, config_value
from anex_agent.virtualnode.nodeobject import Capacity

PROVIDERS = ("vastai", "runpod")  # what the coordinator can rent from
ADMIN_TOKEN = SecretSpec(None, "ANEX_ADMIN_TOKEN", file_flag="--admin-token-file")
PREFIX = re.compile(r"^[a-z0-9]([a-z0-9.-]{0,30})$")
LEASE_INTERVAL = 10.0  # seconds between Lease renewals (the kubelet's)
STATUS_INTERVAL = 60.0  # seconds between node status updates


@dataclass(frozen=True)
class Settings:
    coordinator_url: str
    admin_token: str = field(repr=False)
    kubeconfig: str | None
    providers: tuple[str, ...]
    internal_ip: str
    ca_file: Path | None = None
    node_prefix: str = "anex-"
    kubelet_port: int = 10250
    provision_prefix: str = "vk-"
    max_pods: int = 100
    fallback: Capacity = Capacity(pods=100, cpu=256, memory_mib=1024 * 1024, gpus=64)
    offers_limit: int = 100
    poll_interval: float = 2.0
    volume_refresh: float = 60.0
    kubeconfig_source: str = "--kubeconfig"  # or KUBECONFIG: what a message about it names
    lease_interval: float = LEASE_INTERVAL
    status_interval: float = STATUS_INTERVAL
    metrics_listen: tuple[str, int] | None = None  # IP:PORT serving GET /metrics; None: not served


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--coordinator", metavar="URL", help="coordinator URL [ANEX_COORDINATOR_URL]")
    parser.add_argument("--admin-token-file", metavar="FILE",
                        help="file holding the coordinator's admin token [ANEX_ADMIN_TOKEN, ANEX_ADMIN_TOKEN_FILE]")
    parser.add_argument("--ca-file", type=Path, metavar="FILE", help="PEM CA for an https:// coordinator")
    parser.add_argument("--kubeconfig", metavar="FILE",
                        help="kubeconfig of the cluster [KUBECONFIG]; default: the in-cluster service account")
    parser.add_argument("--providers", metavar="LIST",
                        help=f"providers to make a Node for, comma-separated [ANEX_VIRTUAL_NODE_PROVIDERS] "
                             f"(default and accepted: {','.join(PROVIDERS)})")
    parser.add_argument("--node-prefix", default="anex-", metavar="TEXT", help="Node names: PREFIX+provider "
                        "(default anex-)")
    parser.add_argument("--internal-ip", metavar="IP", help="the Nodes' InternalIP, where the API server reaches "
                        "the kubelet port [ANEX_VIRTUAL_NODE_IP] (default: this host's address)")
    parser.add_argument("--kubelet-port", default="10250", metavar="PORT", help="the Nodes' kubelet port (10250)")
    parser.add_argument("--provision-prefix", default="vk-", metavar="TEXT",
                        help="provision names: PREFIX+pod uid (default vk-)")
    parser.add_argument("--max-pods", default="100", metavar="N", help="pods per Node (default 100)")
    parser.add_argument("--capacity-cpu", default="256", metavar="N",
                        help="CPU cores a Node offers while the coordinator's offers cannot be read (256)")
    parser.add_argument("--capacity-memory-mib", default=str(1024 * 1024), metavar="N",
                        help="memory (MiB) a Node offers while the offers cannot be read (1 TiB)")
    parser.add_argument("--capacity-gpus", default="64", metavar="N",
                        help="GPUs a Node offers while the offers cannot be read (64)")
    parser.add_argument("--offers-limit", default="100", metavar="N",
                        help="offers (cheapest first) summed into a Node's capacity (100)")
    parser.add_argument("--poll-interval", default="2", metavar="SECONDS",
                        help="how often the nodes of ready provisions are read for the workload's state (2)")
    parser.add_argument("--volume-refresh", default="60", metavar="SECONDS",
                        help="how often the ConfigMap and Secret volumes of running pods are read again, a changed "
                             "file pushed to the machine (60)")
    parser.add_argument("--metrics-listen", default=None, metavar="IP:PORT",
                        help="serve Prometheus metrics on IP:PORT (GET /metrics, no token: bind loopback or an "
                             "address only the cluster's Prometheus reaches) [ANEX_VIRTUAL_NODE_METRICS_LISTEN] "
                             "(default: not served)")


def _int(flag: str, text: str, minimum: int, maximum: int | None = None) -> int:
    try:
        return parse.integer(str(text), minimum=minimum, maximum=maximum)
    except ValueError as err:
        raise ConfigError(flag, f"{text!r}: {err}") from None


def _providers(text: str, source: str) -> tuple[str, ...]:
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in chosen if p not in PROVIDERS]
    if bad or not chosen:
        raise ConfigError(source, f"{text!r}: expected a comma-separated list of {', '.join(PROVIDERS)}")
    return chosen


def _own_address() -> str | None:
    try:
        address = socket.gethostbyname(socket.gethostname())
    except OSError:
        return None
    return None if address.startswith("127.") else address


def from_args(args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    url = args.coordinator or env.get("ANEX_COORDINATOR_URL", "")
    source = "--coordinator" if args.coordinator else "ANEX_COORDINATOR_URL"
    if not url:
        raise ConfigError("ANEX_COORDINATOR_URL", "is not set; expected the coordinator URL, e.g. "
                          "https://coordinator.example:8700 (or --coordinator)")
    if not re.match(r"^https?://[^/\s]+", url):
        raise ConfigError(source, f"{url!r}: expected an http:// or https:// URL")
    token, _ = pick_secret(ADMIN_TOKEN, env, file_value=args.admin_token_file)
    if not token:
        raise ConfigError("ANEX_ADMIN_TOKEN", "is not set; the virtual node needs the coordinator's admin token "
                          "(ANEX_ADMIN_TOKEN, ANEX_ADMIN_TOKEN_FILE or --admin-token-file)")
    providers = _providers(args.providers, "--providers") if args.providers else (
        _providers(env["ANEX_VIRTUAL_NODE_PROVIDERS"], "ANEX_VIRTUAL_NODE_PROVIDERS")
        if env.get("ANEX_VIRTUAL_NODE_PROVIDERS") else PROVIDERS)
    ip_text, ip_source = (args.internal_ip, "--internal-ip") if args.internal_ip else (
        env.get("ANEX_VIRTUAL_NODE_IP", ""), "ANEX_VIRTUAL_NODE_IP")
    if not ip_text:
        ip_text = _own_address() or ""
        if not ip_text:
            raise ConfigError("--internal-ip", "is not set and this host's name resolves to no address other than "
                              "loopback; give the address the API server reaches the virtual node at "
                              "(or ANEX_VIRTUAL_NODE_IP)")
    try:
        internal_ip = str(ipaddress.ip_address(ip_text))
    except ValueError:
        raise ConfigError(ip_source, f"{ip_text!r}: expected an IPv4 or IPv6 address") from None
    for flag, value in (("--node-prefix", args.node_prefix), ("--provision-prefix", args.provision_prefix)):
        if not PREFIX.fullmatch(value):
            raise ConfigError(flag, f"{value!r}: expected 1-31 lower-case letters, digits, '-' or '.', starting "
                              "with a letter or digit")
    try:
        kubelet_port = parse.port(str(args.kubelet_port))
    except ValueError as err:
        raise ConfigError("--kubelet-port", f"{args.kubelet_port!r}: {err}") from None
    try:
        poll = parse.number(str(args.poll_interval), minimum=0.1)
    except ValueError as err:
        raise ConfigError("--poll-interval", f"{args.poll_interval!r}: {err}") from None
    try:
        refresh = parse.number(str(getattr(args, "volume_refresh", "60")), minimum=0.1)
    except ValueError as err:
        raise ConfigError("--volume-refresh", f"{args.volume_refresh!r}: {err}") from None
    metrics_text, metrics_source = ((args.metrics_listen, "--metrics-listen") if getattr(args, "metrics_listen", None)
                                    else (env.get("ANEX_VIRTUAL_NODE_METRICS_LISTEN", ""),
                                          "ANEX_VIRTUAL_NODE_METRICS_LISTEN"))
    metrics = (config_value(metrics_source, parse.listen, metrics_text, empty_host=parse.LOCALHOST)
               if metrics_text else None)
    max_pods = _int("--max-pods", args.max_pods, 1, 100_000)
    fallback = Capacity(pods=max_pods, cpu=_int("--capacity-cpu", args.capacity_cpu, 0),
                        memory_mib=_int("--capacity-memory-mib", args.capacity_memory_mib, 0),
                        gpus=_int("--capacity-gpus", args.capacity_gpus, 0))
    return Settings(coordinator_url=url.rstrip("/"), admin_token=token,
                    kubeconfig=args.kubeconfig or env.get("KUBECONFIG") or None, providers=providers,
                    internal_ip=internal_ip, ca_file=args.ca_file, node_prefix=args.node_prefix,
                    kubelet_port=kubelet_port, provision_prefix=args.provision_prefix, max_pods=max_pods,
                    fallback=fallback, offers_limit=_int("--offers-limit", args.offers_limit, 1, 1000),
                    poll_interval=poll, volume_refresh=refresh, metrics_listen=metrics, kubeconfig_source="--kubeconfig" if args.kubeconfig else "KUBECONFIG")
