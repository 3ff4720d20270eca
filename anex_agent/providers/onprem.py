"""On-prem offers: GPU servers registered with the coordinator (provider ``onprem``).

:func:`offer_from_node` is the adapter (pure). Its input is one node as the coordinator
knows it, a mapping with at least::

    {"id": "n-1", "name": "dgx-1", "provider": "onprem",
     "state": "ready",                       # wire.NodeState; only "ready" nodes are offered
     "health": "healthy",                    # wire.Health
     "labels": {"price-per-hour": "0.40",    # required: USD/hour for the whole node
                "country": "CZ",             # optional: ISO code, for anex.sh/region
                "upload-mbps": "1000", "download-mbps": "1000",   # optional
                "busy": "true",              # optional: the cluster marks the node in use
                "maintenance": "true",       # optional: never offered
                "qualification": "full"},    # optional: the node's qualification policy
     "telemetry": {...}}                     # the heartbeat block of anex_agent.gpu.telemetry (v1)

Labels come from the join token the node joined with (``JoinTokenCreate.labels``) and from
an administrator afterwards (:mod:`anex_agent.selection.labels`).

From the telemetry (docs/telemetry.md, version 1): ``nvml.state``, ``inventory.gpus[*]``
(``name``, ``memory_total_bytes``, ``compute_capability``, ``memory_bandwidth_gbps``),
``inventory.cuda_version``, ``host.cpu_count``, ``host.mem_total_bytes``,
``host.disk.free_bytes``, ``health.verdict`` and ``qualification`` (the agent's checks).

A node is offered only when it is ready, not in maintenance, qualifies under its
qualification policy (:mod:`anex_agent.selection.qualification`: the runnable rules --
driver loaded, GPU present, GPU healthy -- and the hardware rules the policy names), has a
price, has GPUs of one model, and is not busy. **Busy** means: the label ``busy`` is
``"true"`` (set by the cluster when it places a pod there), or any GPU in
``telemetry["gpus"]`` lists running processes. Every node that is left out comes back with
the reason (naming the rule, for qualification), for the explanation.
"""

from __future__ import annotations

import json
from typing import Any, Awaitable, Callable, Iterable, Mapping

from anex_agent.selection import labels as labels_, qualification, threads, versions
from anex_agent.selection.labels import is_true
from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import Offer, OfferTable
from anex_agent.selection.units import num

MIB = 2 ** 20
GIB = 2 ** 30
PRICE_LABEL = labels_.PRICE
BUSY_LABEL = labels_.BUSY
MAINTENANCE_LABEL = labels_.MAINTENANCE


def offer_from_node(node: Mapping[str, Any], default_policy: str = qualification.DEFAULT_POLICY
                    ) -> tuple[Offer | None, str]:
    """``(offer, "")`` for an available node, else ``(None, reason)``.

    ``default_policy``: the qualification policy of nodes without a ``qualification`` label.
    The telemetry is whatever the node sent (opaque to the coordinator): a payload of an
    unexpected shape leaves that node out with the reason, it never fails the caller.
    """
    try:
        return _offer_from_node(node, default_policy)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as err:
        return None, f"malformed telemetry ({type(err).__name__}: {err})"


def _offer_from_node(node: Mapping[str, Any], default_policy: str) -> tuple[Offer | None, str]:
    node_id = str(node.get("id", ""))
    if node.get("provider") != "onprem":
        return None, "not an on-prem node"
    labels = node.get("labels") or {}
    if is_true(labels.get(MAINTENANCE_LABEL, "")):
        return None, "in maintenance (label maintenance=true)"
    if node.get("state") != "ready":
        return None, f"state is {node.get('state')!r}, not 'ready'"
    telemetry = node.get("telemetry") or {}
    policy_name = str(labels.get(qualification.LABEL) or default_policy)
    try:
        policy = qualification.parse_policy(policy_name)
    except ValueError as err:
        return None, f"label {qualification.LABEL}={policy_name!r}: {err}"
    reason = qualification.first_failure(node, telemetry, policy, policy_name)
    if reason:
        return None, reason
    price = num(labels.get(PRICE_LABEL))
    if not price >= 0:
        return None, f"no valid '{PRICE_LABEL}' label (USD/hour)"
    if is_true(labels.get(BUSY_LABEL, "")):
        return None, "busy (label busy=true)"
    if any((gpu or {}).get("processes") for gpu in telemetry.get("gpus") or []):
        return None, "busy (GPU processes running)"
    inventory = telemetry.get("inventory") or {}
    gpus = [g for g in inventory.get("gpus") or [] if isinstance(g, Mapping)]
    names = {str(g.get("name", "")) for g in gpus}
    if len(names) != 1:
        return None, f"GPUs of more than one model: {sorted(names)}"
    first = gpus[0]
    vram = [num(g.get("memory_total_bytes"), 1 / MIB) for g in gpus]
    caps = {g.get("compute_capability") for g in gpus}
    cap = num(float(next(iter(caps))) * 100) if len(caps) == 1 and next(iter(caps)) else float("nan")
    bandwidths = [num(g.get("memory_bandwidth_gbps")) for g in gpus]
    host = telemetry.get("host") or {}
    disk = host.get("disk") or {}
    cuda = inventory.get("cuda_version")
    return Offer(
        provider="onprem",
        offer_id=node_id,
        machine_id=node_id,
        gpu_name=str(first.get("name", "")),
        gpu_count=float(len(gpus)),
        vram_mb=min(vram),
        vram_total_mb=sum(vram),
        vram_bw_gbps=min(bandwidths),
        compute_cap=round(cap) if cap == cap else cap,
        cuda=float(versions.version_key(cuda)) if isinstance(cuda, str) and _is_version(cuda) else float("nan"),
        cpu_cores=num(host.get("cpu_count")),
        ram_mb=num(host.get("mem_total_bytes"), 1 / MIB),
        price=price,
        upload_mbps=num(labels.get("upload-mbps")),
        download_mbps=num(labels.get("download-mbps")),
        disk_gb=num(disk.get("free_bytes"), 1 / GIB),
        country=str(labels["country"]).upper() if labels.get("country") else None,
        details={"name": node.get("name")},
    ), ""


def _is_version(text: str) -> bool:
    try:
        versions.parse_version(text)
    except ValueError:
        return False
    return True


NodeLister = Callable[[], Awaitable[Iterable[Mapping[str, Any]]]]


class OnpremSource:
    """Offers from the coordinator's on-prem nodes. ``list_nodes`` returns node mappings (see above)."""

    name = "onprem"

    def __init__(self, list_nodes: NodeLister, *, default_policy: str = qualification.DEFAULT_POLICY) -> None:
        self._list_nodes = list_nodes
        self.default_policy = default_policy
        self.skipped: dict[str, str] = {}  # node id -> why it was not offered (last call)

    async def offers(self, filters: Filters) -> OfferTable:
        nodes = list(await self._list_nodes())
        table, self.skipped = await threads.run(table_of_nodes, nodes, self.default_policy)
        return table


def table_of_nodes(nodes: Iterable[Mapping[str, Any]], default_policy: str = qualification.DEFAULT_POLICY
                   ) -> tuple[OfferTable, dict[str, str]]:
    """The offers of the available on-prem nodes and, for the others, why not (pure; run on the
    selection thread: labels and telemetry given as JSON text, as stored, are decoded here)."""
    out: list[Offer] = []
    skipped: dict[str, str] = {}
    for node in nodes:
        if node.get("provider") != "onprem":
            continue
        if isinstance(node.get("labels"), (str, bytes)):  # as stored: JSON text
            try:
                node = {**node, "labels": json.loads(node["labels"])}
            except ValueError:
                skipped[str(node.get("id"))] = "malformed labels (not JSON)"
                continue
        if isinstance(node.get("telemetry"), (str, bytes)):
            try:
                node = {**node, "telemetry": json.loads(node["telemetry"])}
            except ValueError:
                skipped[str(node.get("id"))] = "malformed telemetry (not JSON)"
                continue
        offer, reason = offer_from_node(node, default_policy)
        if offer is None:
            skipped[str(node.get("id"))] = reason
        else:
            out.append(offer)
    return OfferTable(out), skipped
