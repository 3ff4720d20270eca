"""The coordinator's view of the demo's nodes: state, transport status, telemetry, ``/metrics``.

``python -m anex_agent.demo.observe --coordinator URL --node ID=NAME [--node ...] [--wait S]``
runs where the coordinator is reachable (the demo runs it in the gateway namespace) with the
admin token in ``ANEX_ADMIN_TOKEN`` (never on the command line) and prints one JSON document::

    {"nodes": {"<id>": {...summary...}}, "complete": true, "waited_s": 1.2}

Per node it asks the coordinator, as the admin, through :class:`anex_agent.client.rest.CoordinatorClient`:
``GET /v1/nodes/{id}`` (state, address, the status block of the last heartbeat) and
``GET /v1/nodes/{id}/telemetry`` (the latest block of :mod:`anex_agent.gpu.telemetry`), and
reads ``GET /metrics`` (with the admin token: the fleet series need it) for the series that
:mod:`anex_agent.coordinator.routes.fleet_metrics` renders with a ``node="<name>"`` label.

Contract:
* It polls every ``POLL_INTERVAL`` seconds until every node is :func:`complete` or ``--wait``
  seconds have passed, then prints what it saw last (``"complete": false`` then). A node's
  telemetry needs a heartbeat after the agent's first sample, and the fleet metrics are
  refreshed by the coordinator every 5 s, so a few seconds of waiting are normal.
* Errors of one call are reported in that node's ``errors`` list; it never raises for a
  coordinator answer. Exit status 0 when complete, 1 when not, 2 on bad arguments.
* :func:`summarize` and :func:`node_series` are pure and do the reading of the documents.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from typing import Any

REQUIRED_SERIES = ("anex_node_health", "anex_fleet_node_telemetry_age_seconds")
"""Series the coordinator must carry with ``node="<name>"`` for a node with telemetry."""
POLL_INTERVAL = 0.5
DEFAULT_WAIT = 20.0


def node_series(metrics_text: str, names: list[str]) -> dict[str, list[str]]:
    """Names of the samples in a Prometheus text exposition that carry ``node="<name>"``, per name.

    Only our own series count: ``anex_*`` and dcgm-exporter's ``DCGM_*``. Each name appears once.
    """
    from prometheus_client.parser import text_string_to_metric_families

    wanted = set(names)
    found: dict[str, set[str]] = {name: set() for name in names}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            node = sample.labels.get("node")
            if node in wanted and sample.name.startswith(("anex_", "DCGM_")):
                found[node].add(sample.name)
    return {name: sorted(series) for name, series in found.items()}


def summarize(view: dict[str, Any] | None, telemetry: dict[str, Any] | None, series: list[str], now: float) -> dict[str, Any]:
    """The flat facts the demo prints for one node.

    ``view`` is a ``wire.NodeView`` as JSON, ``telemetry`` the ``telemetry`` member of a
    ``wire.NodeTelemetry`` (None when the node sent none yet), ``now`` Unix seconds.
    Absent facts are None.
    """
    view = view or {}
    status = view.get("status") or {}
    block = telemetry if isinstance(telemetry, dict) else {}
    health = block.get("health") if isinstance(block.get("health"), dict) else {}
    reasons = health.get("reasons") or view.get("health_reasons") or []
    nvml = block.get("nvml") if isinstance(block.get("nvml"), dict) else {}
    inventory = block.get("inventory") if isinstance(block.get("inventory"), dict) else {}
    host = block.get("host") if isinstance(block.get("host"), dict) else {}
    total, available = host.get("mem_total_bytes"), host.get("mem_available_bytes")
    taken = block.get("taken_at")
    return {
        "name": view.get("name"),
        "state": view.get("state"),
        "address": view.get("address"),
        "engine": status.get("engine") or None,
        "path": status.get("path") or None,
        "handshake_age": status.get("last_handshake_age"),
        "last_heartbeat_at": view.get("last_heartbeat_at"),
        "has_telemetry": bool(block),
        "verdict": health.get("verdict") or view.get("health"),
        "first_reason": reasons[0] if reasons else None,
        "nvml": nvml.get("state"),
        "gpu_count": inventory.get("gpu_count", len(block.get("gpus") or [])) if block else None,
        "cpu_pct": host.get("cpu_util_pct"),
        "mem_used_bytes": total - available if isinstance(total, int) and isinstance(available, int) else None,
        "mem_total_bytes": total if isinstance(total, int) else None,
        "telemetry_age": max(0.0, now - float(taken)) if isinstance(taken, (int, float)) else None,
        "series": series,
        "missing_series": [name for name in REQUIRED_SERIES if name not in series],
    }


def complete(summary: dict[str, Any]) -> bool:
    """The coordinator has everything for this node: ready, a verdict from telemetry, the series."""
    return (
        summary.get("state") == "ready"
        and summary.get("has_telemetry")
        and summary.get("verdict") in ("healthy", "degraded", "unhealthy")
        and not summary.get("missing_series")
        and not summary.get("errors")
    )


async def observe_once(client: Any, session: Any, base_url: str, nodes: dict[str, str]) -> dict[str, dict[str, Any]]:
    """One round of calls: every node's view and telemetry, and ``/metrics`` once."""
    from anex_agent.errors import CoordinatorError

    errors: dict[str, list[str]] = {node_id: [] for node_id in nodes}
    metrics_text = ""
    try:
        async with session.get(f"{base_url}/metrics", headers={"Authorization": f"Bearer {client.admin_token}"}) as resp:
            metrics_text = await resp.text()
            if resp.status != 200:
                raise CoordinatorError(f"GET /metrics: {resp.status}", status=resp.status)
    except Exception as err:  # reported per node below
        for node_errors in errors.values():
            node_errors.append(f"GET /metrics: {err}")
        metrics_text = ""
    try:
        series = node_series(metrics_text, list(nodes.values()))
    except ValueError as err:
        series = {name: [] for name in nodes.values()}
        for node_errors in errors.values():
            node_errors.append(f"/metrics does not parse: {err}")
    out: dict[str, dict[str, Any]] = {}
    for node_id, name in nodes.items():
        view = telemetry = None
        try:
            view = (await client.get_node(node_id)).model_dump(mode="json")
            telemetry = (await client.get_telemetry(node_id)).telemetry
        except CoordinatorError as err:
            errors[node_id].append(str(err))
        summary = summarize(view, telemetry, series.get(name, []), time.time())
        summary["errors"] = errors[node_id]
        out[node_id] = summary
    return out


async def observe(base_url: str, admin_token: str, nodes: dict[str, str], wait: float = DEFAULT_WAIT) -> dict[str, Any]:
    """Poll until every node is :func:`complete` or ``wait`` seconds passed; the last round's result."""
    import aiohttp

    from anex_agent.client.rest import CoordinatorClient

    started = time.monotonic()
    deadline = started + wait
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10)) as session, \
            CoordinatorClient(base_url, admin_token=admin_token) as client:
        while True:
            seen = await observe_once(client, session, base_url, nodes)
            done = all(complete(summary) for summary in seen.values())
            if done or time.monotonic() >= deadline:
                return {"nodes": seen, "complete": done, "waited_s": round(time.monotonic() - started, 2)}
            await asyncio.sleep(POLL_INTERVAL)


def _node_arg(value: str) -> tuple[str, str]:
    node_id, sep, name = value.partition("=")
    if not sep or not node_id or not name:
        raise argparse.ArgumentTypeError(f"--node {value!r}: expected ID=NAME (the node's id and its name at the coordinator)")
    return node_id, name


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anex_agent.demo.observe", description=__doc__.splitlines()[0])
    parser.add_argument("--coordinator", required=True, metavar="URL", help="the coordinator's base URL")
    parser.add_argument("--node", action="append", type=_node_arg, required=True, metavar="ID=NAME", help="a node to observe (repeatable)")
    parser.add_argument("--wait", type=float, default=DEFAULT_WAIT, metavar="SECONDS", help=f"how long to wait for complete telemetry (default {DEFAULT_WAIT:.0f})")
    args = parser.parse_args(argv)
    token = os.environ.get("ANEX_ADMIN_TOKEN")
    if not token:
        parser.error("ANEX_ADMIN_TOKEN is not set: the coordinator's admin token is needed to read nodes and telemetry")
    result = asyncio.run(observe(args.coordinator.rstrip("/"), token, dict(args.node), args.wait))
    print(json.dumps(result))
    return 0 if result["complete"] else 1


if __name__ == "__main__":
    sys.exit(main())
