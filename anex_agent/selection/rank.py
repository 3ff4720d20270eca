"""Ranking of filtered offers (pure).

Two orderings (:data:`ORDERINGS`), chosen by the pod's ``anex.sh/ordering`` annotation, else
the coordinator's ``ANEX_SELECTION_ORDERING`` setting (default ``price``):

* ``price`` (docs: "candidates are sorted by price ascending"), with deterministic tie-breaks:
  the key below;
* ``prefer-onprem`` ("own the base, rent the burst": jobs always prefer your own nodes):
  every matching on-prem node before any rented offer, each group in the ``price`` order.

The ``price`` key:

1. price per hour ascending (an unknown price sorts last);
2. provider: onprem, then vastai, then runpod ("own the base, rent the burst": at an equal
   price our own hardware wins; Vast.AI before RunPod because bans protect us there);
3. offer id (string order), then machine id: a total order that does not depend on the
   order the providers returned the offers in.

RunPod priorities (``runpod.anex.sh/keep-gpu-type-priority`` = true: the order of
``anex.sh/gpu-names``; ``runpod.anex.sh/datacenter-ids``: its order) reorder RunPod candidates
*among themselves*: RunPod offers keep the positions price gave them in the list, and those
positions are filled by RunPod offers sorted by (GPU priority, data center priority, the key
above). Other providers' candidates are not moved.
"""

from __future__ import annotations

import math

from anex_agent.selection.annotations import ORDERINGS, Filters
from anex_agent.selection.offers import OfferTable

PROVIDER_ORDER = {"onprem": 0, "vastai": 1, "runpod": 2}
PRICE, PREFER_ONPREM = ORDERINGS
DESCRIPTIONS = {
    PRICE: "price ascending; ties: onprem, vastai, runpod; then offer id",
    PREFER_ONPREM: "on-prem nodes first, then rented offers; each by price ascending; ties: onprem, vastai, runpod; "
                   "then offer id",
}


def effective_ordering(filters: Filters, default: str = PRICE) -> str:
    """The pod's ``anex.sh/ordering`` when set, else the coordinator's ``default``."""
    return filters.ordering or default


def rank(table: OfferTable, rows: list[int], filters: Filters, default_ordering: str = PRICE) -> list[int]:
    """``rows`` sorted as described in the module docstring."""
    col = table.col
    price, provider, offer_id, machine_id = col["price"], col["provider"], col["offer_id"], col["machine_id"]
    onprem_first = effective_ordering(filters, default_ordering) == PREFER_ONPREM

    def key(i: int) -> tuple:
        p = price[i]
        by_price = (math.inf if p != p else p, PROVIDER_ORDER.get(provider[i], 9), offer_id[i], machine_id[i] or "")
        return ((provider[i] != "onprem",) + by_price) if onprem_first else by_price

    ordered = sorted(rows, key=key)
    gpu_priority = filters.keep_gpu_type_priority and filters.gpu_keys is not None
    dc_priority = filters.datacenter_ids is not None
    if not (gpu_priority or dc_priority):
        return ordered
    slots = [pos for pos, i in enumerate(ordered) if provider[i] == "runpod"]
    if len(slots) < 2:
        return ordered
    gpu_rank = {name: n for n, name in enumerate(filters.gpu_keys or ())}
    dc_rank = {name: n for n, name in enumerate(filters.datacenter_ids or ())}
    gpu_key, dc = col["gpu_key"], col["datacenter_id"]

    def runpod_key(i: int) -> tuple:
        return (gpu_rank.get(gpu_key[i], len(gpu_rank)) if gpu_priority else 0,
                dc_rank.get(dc[i], len(dc_rank)) if dc_priority else 0, key(i))

    runpod_rows = sorted((ordered[pos] for pos in slots), key=runpod_key)
    for pos, i in zip(slots, runpod_rows):
        ordered[pos] = i
    return ordered
