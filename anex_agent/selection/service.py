"""Machine selection: annotations + offer sources -> ranked candidates and an explanation.

:func:`choose` is the pure part (a table in, a :class:`Selection` out); :func:`select`
fetches offers from the sources concurrently (one named task per source in a TaskGroup),
keeps going when a source fails (the failure is reported in the explanation), applies bans,
filters and ranks; :func:`selection_body` and :func:`offers_body` render the answers of the
routes. All of it runs in the selection worker process (:mod:`anex_agent.selection.worker`),
never in the coordinator; building, joining and choosing over tables run on that process's
selection thread (:mod:`anex_agent.selection.threads`).
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from anex_agent.selection import models, threads, versions
from anex_agent.selection.annotations import Filters, parse_annotations
from anex_agent.selection.filters import FilterResult, apply_filters
from anex_agent.selection.offers import COLUMNS, OfferTable
from anex_agent.providers.offers import OfferSource
from anex_agent.providers.offers_http import ProviderError
from anex_agent.selection.rank import DESCRIPTIONS, PRICE, effective_ordering, rank
from anex_agent.selection.units import compute_cap_text

DEFAULT_LIMIT = 10
MAX_LIMIT = 1000

# filter name -> (offer column, how to show the offer's value)
_MATCHED = {
    "verified-only": "verified", "datacenter-only": "datacenter", "cloud-type": "cloud_type",
    "datacenter-ids": "datacenter_id", "region": "country", "gpu-names": "gpu_name",
    "compute-cap": "compute_cap", "gpu-count": "gpu_count", "vram": "vram_mb", "vram-total": "vram_total_mb",
    "vram-bandwidth": "vram_bw_gbps", "tflops": "tflops", "cuda": "cuda", "cpu": "cpu_cores", "ram": "ram_mb",
    "price": "price", "upload-speed": "upload_mbps", "download-speed": "download_mbps",
    "disk-space-gb": "disk_gb", "disk-bw": "disk_bw_mbps", "dlperf": "dlperf",
}


def show_value(column: str, value: Any) -> Any:
    if isinstance(value, float):
        if math.isnan(value):
            return None
        if column == "cuda":
            return versions.key_to_text(int(value))
        if column == "compute_cap":
            return compute_cap_text(value)
        return int(value) if value.is_integer() else round(value, 6)
    return value


@dataclass(frozen=True)
class Selection:
    candidates: list[dict[str, Any]]
    explanation: dict[str, Any]


def candidate(table: OfferTable, row: int, filters: Filters, result: FilterResult) -> dict[str, Any]:
    offer = table.offers[row]
    matched = {}
    for step in result.steps:
        column = _MATCHED.get(step.name)
        if column is None:
            continue
        if step.name in ("verified-only", "datacenter-only", "dlperf") and offer.provider != "vastai":
            continue
        if step.name in ("cloud-type", "datacenter-ids") and offer.provider != "runpod":
            continue
        matched[step.name] = show_value(column, getattr(offer, column))
    out = {
        "provider": offer.provider,
        "offer_id": offer.offer_id,
        "machine_id": offer.machine_id,
        "price_per_hour": show_value("price", offer.price),
        "gpu_name": offer.gpu_name,
        "gpu_count": show_value("gpu_count", offer.gpu_count),
        "matched": matched,
    }
    if offer.datacenter_id:
        out["datacenter_id"] = offer.datacenter_id
    if offer.cloud_type:
        out["cloud_type"] = offer.cloud_type
    disk = filters.disk_to_allocate_gb
    if disk is not None:
        out["disk_to_allocate_gb"] = show_value("disk_gb", disk)
    return out


def choose(table: OfferTable, filters: Filters, *, banned: frozenset[str] = frozenset(),
           limit: int = DEFAULT_LIMIT, default_ordering: str = PRICE) -> Selection:
    """Filter, rank and explain (pure). ``default_ordering``: the coordinator's, for pods without
    ``anex.sh/ordering``."""
    result = apply_filters(table, filters, banned)
    ordering = effective_ordering(filters, default_ordering)
    ordered = rank(table, result.rows, filters, ordering)
    explanation: dict[str, Any] = {
        "offers_considered": result.total,
        "matched": len(ordered),
        "returned": min(limit, len(ordered)),
        "filters": [{"filter": s.name, "annotations": list(s.annotations), "removed": s.removed,
                     "remaining": s.remaining} for s in result.steps],
        "ordering": f"{ordering}: {DESCRIPTIONS[ordering]}",
    }
    if filters.ignored:
        explanation["ignored"] = [{"annotation": name, "because": why} for name, why in filters.ignored]
    if not ordered:
        explanation["emptied_by"] = result.emptied_by
        explanation["blocking"] = [{"filter": name, "would_match_without": n} for name, n in result.blocking]
        if result.total == 0:
            explanation["emptied_by"] = "no offers from any provider"
    return Selection([candidate(table, i, filters, result) for i in ordered[:limit]], explanation)


async def gather_offers(sources: Sequence[OfferSource], filters: Filters) -> tuple[OfferTable, dict[str, Any]]:
    """Offers of every source (fetched concurrently) and a per-source report."""
    results: dict[str, OfferTable | BaseException] = {}

    async def fetch(source: OfferSource) -> None:
        try:
            results[source.name] = await source.offers(filters)
        except ProviderError as err:
            results[source.name] = err

    async with asyncio.TaskGroup() as group:
        for source in sources:
            group.create_task(fetch(source), name=f"selection-offers-{source.name}")
    tables: list[OfferTable] = []
    report: dict[str, Any] = {}
    for source in sources:
        got = results[source.name]
        if isinstance(got, OfferTable):
            tables.append(got)
            report[source.name] = {"offers": len(got)}
            remote = getattr(source, "remote_filters", None)
            if remote is not None:
                report[source.name]["applied_by_provider"] = remote(filters)
            skipped = getattr(source, "skipped", None)
            if skipped:
                report[source.name]["skipped"] = dict(skipped)
        else:
            report[source.name] = {"offers": 0, "error": str(got), "retryable": getattr(got, "retryable", False)}
    return await threads.run(OfferTable.concat, tables), report


async def select(annotations: Mapping[str, str], sources: Sequence[OfferSource], *, limit: int = DEFAULT_LIMIT,
                 banned: frozenset[str] = frozenset(), default_ordering: str = PRICE) -> Selection:
    """Parse (raises AnnotationError), fetch, filter, rank; ``explanation['providers']`` says per source."""
    filters = parse_annotations(annotations)
    table, report = await gather_offers(sources, filters)
    selection = await threads.run(choose, table, filters, banned=banned, limit=limit,
                                 default_ordering=default_ordering)
    attach_provider_report(selection, report)
    return selection


def attach_provider_report(selection: Selection, report: dict[str, Any]) -> None:
    """Put the per-source report in the explanation; when no offer came back at all, say why."""
    selection.explanation["providers"] = report
    if selection.explanation["offers_considered"] == 0:
        parts = []
        for name, r in report.items():
            if r.get("configured") is False:
                parts.append(str(r.get("error") or f"{name} is not configured"))
            elif "error" in r:
                parts.append(f"{name} failed: {r['error']}")
            elif r.get("applied_by_provider"):
                parts.append(f"{name} had no offers matching {', '.join(r['applied_by_provider'])} "
                             "(filters its API applies)")
            elif name == "onprem" and r.get("skipped"):
                skipped = r["skipped"]
                first = next(iter(skipped.items()))
                parts.append(f"onprem had no offers: {len(skipped)} on-prem node(s) not offered ({first[0]}: "
                             f"{first[1]}{', ...' if len(skipped) > 1 else ''})")
            elif name == "onprem":
                parts.append("onprem had no offers: no on-prem node has joined this coordinator")
            else:
                parts.append(f"{name} had no offers")
        selection.explanation["emptied_by"] = "; ".join(parts) or "no provider was asked"


def selection_body(table: OfferTable, filters: Filters, banned: frozenset[str], limit: int, ordering: str,
                   report: dict[str, Any]) -> bytes:
    """The ``SelectionResponse`` JSON (pure; the selection worker runs it on its thread)."""
    selection = choose(table, filters, banned=banned, limit=limit, default_ordering=ordering)
    attach_provider_report(selection, report)
    return models.SelectionResponse.model_validate(
        {"candidates": selection.candidates, "explanation": selection.explanation}).model_dump_json().encode()


def offers_body(table: OfferTable, filters: Filters, limit: int, report: dict[str, Any],
                banned: list[str]) -> bytes:
    """The ``OfferList`` JSON of the cheapest ``limit`` offers (pure; the selection worker runs it on its thread)."""
    views = [_offer_view(table, i) for i in rank(table, list(range(table.size)), filters)[:limit]]
    return models.OfferList(offers=views, providers=report, banned=banned).model_dump_json().encode()


def _offer_view(table: OfferTable, row: int) -> models.OfferView:
    offer = table.offers[row]
    specs = {name: show_value(name, getattr(offer, name)) for name in COLUMNS
             if name not in ("provider", "offer_id", "machine_id", "details")}
    specs = {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in specs.items()}
    return models.OfferView(provider=offer.provider, offer_id=offer.offer_id, machine_id=offer.machine_id,
                            specs=specs)
