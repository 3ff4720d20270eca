"""``anex-agent detect [--json] [--state-dir DIR]``: which WireGuard engines and paths work here, and why not.

The engine report comes from :func:`anex_agent.tunnels.engines.detect.detect` (the engines' own
probes); the same report is part of ``/status``, of the heartbeat facts and of the join
request. When the state dir holds a joined node (its key and last config), ``detect`` also
tests each gateway for real (:func:`gateway_report`): a WireGuard handshake over UDP
(:mod:`anex_agent.tunnels.binds.udp_probe`: proves datagrams get there and back, which opening a
socket does not), and a connection to its WebSocket relay (authenticated with the node's
key, through ``HTTPS_PROXY``/``HTTP_PROXY`` unless ``NO_PROXY`` says otherwise). A state dir
it may not read (an unprivileged user, root's state dir) leaves the engine report standing
and ends with one line naming the path and what to do.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
from pathlib import Path
from typing import Any

from anex_agent import parse


def detect_report() -> dict[str, Any]:
    """``{"engines": {name: {"supported", "reason", "serves_workload", "workload_reason"}}, "auto",
    "auto_skipped", "udp", "capabilities"}``."""
    from anex_agent.tunnels.engines.detect import detect

    return detect().to_dict()


async def gateway_report(state_dir: Path, environ: dict[str, str]) -> dict[str, Any]:
    """Per gateway of the saved config: ``{"udp": {"supported", "reason", "rtt_ms"}, "websocket": {...}}``.

    ``{}`` plus a ``note`` when the state dir holds no joined node."""
    from anex_agent.wire import keys
    from anex_agent.agent.state import KEY_FILE, StateDir
    from anex_agent.client.transport import client_ssl_context
    from anex_agent.tunnels.binds.udp_probe import probe_gateway
    from anex_agent.tunnels.binds.egress_proxy import proxy_for
    from anex_agent.tunnels.binds.relay_client import RelayTarget, check_relay

    state = StateDir(state_dir)
    try:
        config = state.load_config() if (state_dir / KEY_FILE).exists() else None
        pair = state.keypair() if config is not None else None
    except OSError as err:  # an unprivileged user and root's state dir: the engines' report still stands
        return {"note": f"cannot read {err.filename or state_dir}: {err.strerror or err}: the gateways were not "
                        "tested (run as root, or give the node's state dir with --state-dir or ANEX_STATE_DIR)"}
    if config is None:
        return {"note": f"no joined node in {state_dir}: the gateways were not tested (join first, or give --state-dir)"}
    ca = environ.get("ANEX_CA_FILE")
    context = client_ssl_context(Path(ca)) if ca else None
    loop = asyncio.get_running_loop()
    out: dict[str, Any] = {}
    for gw in config.gateways:
        gateway_key = keys.decode_key(gw.public_key, what="gateway public_key")
        item: dict[str, Any] = {}
        if gw.endpoint:
            try:
                host, port = parse.host_port(gw.endpoint)
                infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
                address = (infos[0][4][0], port)
            except (OSError, ValueError) as err:
                item["udp"] = {"supported": False, "reason": f"cannot resolve {gw.endpoint}: {err}"}
            else:
                item["udp"] = (await probe_gateway(pair.private, gateway_key, address)).to_dict()
        else:
            item["udp"] = {"supported": False, "reason": "the gateway has no UDP endpoint"}
        if gw.ws_url:
            target = RelayTarget(url=gw.ws_url, gateway_public_key=gateway_key, proxy=proxy_for(gw.ws_url, environ),
                                 ssl_context=context)
            ok, reason = await check_relay(target, private_key=pair.private, public_key=pair.public_b64)
            item["websocket"] = {"supported": ok, "reason": reason, "url": gw.ws_url}
        else:
            item["websocket"] = {"supported": False, "reason": "the gateway advertises no WebSocket relay"}
        out[gw.id] = item
    return out


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument("--state-dir", metavar="DIR",
                        help="a joined node's state dir: test its gateways over UDP and WebSocket [ANEX_STATE_DIR]")


def main(args: argparse.Namespace) -> int:
    from anex_agent.agent.settings import default_state_dir

    report = detect_report()
    state_dir = Path(args.state_dir or os.environ.get("ANEX_STATE_DIR") or default_state_dir(os.environ))
    report["gateways"] = asyncio.run(gateway_report(state_dir, dict(os.environ)))
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    rows = [(name, item) for name, item in report.get("engines", {}).items()]
    rows.append(("path: udp socket", report.get("udp", {})))
    for gw_id, item in report["gateways"].items():
        if isinstance(item, dict):
            rows.append((f"gateway {gw_id}: udp", item.get("udp", {})))
            rows.append((f"gateway {gw_id}: websocket", item.get("websocket", {})))
    width = max(len(name) for name, _ in rows)
    print(f"{'engine / path':<{width}}  supported  workload  reason")
    for name, item in rows:
        serves = item.get("serves_workload")
        workload = "-" if serves is None else ("yes" if serves else "no")
        reason = item.get("reason", "")
        if serves is False:
            reason += f"; workload: {item.get('workload_reason', '')}"
        print(f"{name:<{width}}  {'yes' if item.get('supported') else 'no':<9}  {workload:<8}  {reason}")
    for name, why in (report.get("auto_skipped") or {}).items():
        print(f"auto skips {name}: {why}")
    print(f"auto picks: {report.get('auto') or 'nothing (no engine here can serve the workload)'}")
    if "note" in report["gateways"]:
        print(report["gateways"]["note"])
    return 0
