"""On-prem offers: GPU servers registered with the coordinator (provider ``onprem``).

:func:`offer_from_node` is the adapter (pure). Its input is one node as the coordinator
knows it, a mapping with at least::

    {"id": "n-1", "name": "dgx-1", "provider": "onprem",
     "state": "ready",                       # wire.NodeState; only "ready" nodes are offered
     "health": "healthy",                    # wire.Health; only "healthy" nodes are offered
     "labels": {"price-per-hour": "0.40",    # required: USD/hour for the whole node
                "country": "CZ",             # optional: ISO code, for anex.sh/region
                "upload-mbps": "1000", "download-mbps": "1000",   # optional
                "busy": "true"},             # optional: the cluster marks the node in use
     "telemetry": {...}}                     # the heartbeat block of anex_agent.gpu.telemetry (v1)

Labels come from the join token the node joined with (``JoinTokenCreate.labels``).

From the telemetry (docs/telemetry.md, version 1): ``inventory.gpus[*]`` (``name``,
``memory_total_bytes``, ``compute_capability``, ``memory_bandwidth_gbps``),
``inventory.cuda_version``, ``host.cpu_count``, ``host.mem_total_bytes``,
``host.disk.free_bytes``, ``health.verdict`` and ``qualification`` (``required_ok`` true or
``status`` ``"pass"``).

A node is offered only when it is ready, healthy (the node's health and the telemetry
verdict), has passed qualification, has a price, has GPUs of one model, and is not busy.
**Busy** means: the label ``busy`` is ``"true"`` (set by the cluster when it places a pod
there), or any GPU in ``telemetry["gpus"]`` lists running processes. Every node that is
left out comes back with the reason, for the explanation.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Iterable, Mapping

from anex_agent.selection import versions
from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import Offer, OfferTable
from anex_agent.selection.units import num

MIB = 2 ** 20
GIB = 2 ** 30
PRICE_LABEL = "price-per-hour"
BUSY_LABEL = "busy"


def _qualified(qualification: Any) -> bool:
    """The on-prem rules of docs/telemetry.md (``anex-agent qualify`` JSON) hold.

    ``required_ok`` true (every rule required of all on-prem systems passed) or ``status``
    ``"pass"`` (every rule passed). ``"fail"``, ``"incomplete"`` with required rules unchecked,
    or no qualification at all: not qualified.
    """
    if not isinstance(qualification, Mapping):
        return False
    return qualification.get("required_ok") is True or qualification.get("status") == "pass"


def offer_from_node(node: Mapping[str, Any]) -> tuple[Offer | None, str]:
    """``(offer, "")`` for an available node, else ``(None, reason)``.

    The telemetry is whatever the node sent (opaque to the coordinator): a payload of an
    unexpected shape leaves that node out with the reason, it never fails the caller.
    """
    try:
        return _offer_from_node(node)
    except (AttributeError, TypeError, ValueError, KeyError, IndexError) as err:
        return None, f"malformed telemetry ({type(err).__name__}: {err})"


def _offer_from_node(node: Mapping[str, Any]) -> tuple[Offer | None, str]:
    node_id = str(node.get("id", ""))
    if node.get("provider") != "onprem":
        return None, "not an on-prem node"
    if node.get("state") != "ready":
        return None, f"state is {node.get('state')!r}, not 'ready'"
    labels = node.get("labels") or {}
    telemetry = node.get("telemetry") or {}
    health = node.get("health")
    verdict = (telemetry.get("health") or {}).get("verdict")
    if health != "healthy" or verdict not in (None, "healthy"):
        return None, f"not healthy (health {health!r}, telemetry verdict {verdict!r})"
    if not _qualified(telemetry.get("qualification")):
        return None, "has not passed qualification (telemetry['qualification'])"
    price = num(labels.get(PRICE_LABEL))
    if not price >= 0:
        return None, f"no valid '{PRICE_LABEL}' label (USD/hour)"
    if str(labels.get(BUSY_LABEL, "")).lower() == "true":
        return None, "busy (label busy=true)"
    if any((gpu or {}).get("processes") for gpu in telemetry.get("gpus") or []):
        return None, "busy (GPU processes running)"
    inventory = telemetry.get("inventory") or {}
    gpus = [g for g in inventory.get("gpus") or [] if isinstance(g, Mapping)]
    if not gpus:
        return None, "no GPUs in telemetry inventory"
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

    def __init__(self, list_nodes: NodeLister) -> None:
        self._list_nodes = list_nodes
        self.skipped: dict[str, str] = {}  # node id -> why it was not offered (last call)

    async def offers(self, filters: Filters) -> OfferTable:
        out: list[Offer] = []
        skipped: dict[str, str] = {}
        for node in await self._list_nodes():
            if node.get("provider") != "onprem":
                continue
            offer, reason = offer_from_node(node)
            if offer is None:
                skipped[str(node.get("id"))] = reason
            else:
                out.append(offer)
        self.skipped = skipped
        return OfferTable(out)
