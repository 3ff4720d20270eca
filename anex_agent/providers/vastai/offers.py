"""Vast.AI offers from its search API (``GET /api/v0/bundles/?q=<json>``).

The request carries the filters the API can apply (``rentable``, ``verified``, ``num_gpus``,
``gpu_ram``, ``cpu_ram``, ``dph_total``, ``inet_up``/``inet_down``, ``compute_cap``,
``cuda_max_good``, ``geolocation``, ``gpu_name``, ...), each one the same as or looser than
the annotation; the selection applies every filter again locally, so the API narrowing is
only an optimization and never the judge.

Field units (Vast.AI API): ``dph_total`` USD/hour for the whole offer, ``gpu_ram`` and
``cpu_ram`` MB, ``gpu_mem_bw`` GB/s, ``total_flops`` TFLOPS, ``compute_cap`` capability x 100
(8.6 -> 860), ``cuda_max_good`` a float version, ``inet_up``/``inet_down`` Mb/s, ``disk_bw``
MB/s, ``disk_space`` GB, ``geolocation`` "<country>, <CODE>". Bans key on ``machine_id``.

Configuration: ``VastAIConfig`` (API key from ``ANEX_VASTAI_API_KEY`` or
``--vastai-api-key``; never logged).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from anex_agent.selection import versions
from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import Offer, OfferTable, normalize_gpu_name
from anex_agent.providers.offers_http import HttpPolicy, JsonClient, ProviderError
from anex_agent.selection.regions import country_from_location
from anex_agent.selection.units import num

DEFAULT_URL = "https://console.vast.ai/api/v0"


@dataclass(frozen=True)
class VastAIConfig:
    api_key: str = field(default="", repr=False)
    base_url: str = DEFAULT_URL
    limit: int = 1000  # offers asked for per search
    policy: HttpPolicy = HttpPolicy()


# annotation range name -> (API field, scale from annotation unit to API unit)
_API_RANGES = {
    "gpu-count": ("num_gpus", 1.0),
    "vram": ("gpu_ram", 1.0),
    "vram-total": ("gpu_totalram", 1.0),
    "vram-bandwidth": ("gpu_mem_bw", 1.0),
    "tflops": ("total_flops", 1.0),
    "cpu": ("cpu_cores_effective", 1.0),
    "ram": ("cpu_ram", 1.0),
    "price": ("dph_total", 1.0),
    "upload-speed": ("inet_up", 1.0),
    "download-speed": ("inet_down", 1.0),
    "disk-space-gb": ("disk_space", 1.0),
    "disk-bw": ("disk_bw", 1.0),
    "dlperf": ("dlperf", 1.0),
}


def _api_gpu_name(name: str) -> str:
    """The Vast.AI spelling of a GPU name ("RTX 4090"): vendor words dropped, ``_`` as space."""
    words = name.replace("_", " ").split()
    return " ".join(w for w in words if w.casefold() not in ("nvidia", "geforce"))


def build_query(filters: Filters, limit: int) -> dict:
    """The ``q`` document for the bundles search: what the API can filter, no stricter than asked."""
    q: dict = {"rentable": {"eq": True}, "rented": {"eq": False}, "type": "on-demand",
               "order": [["dph_total", "asc"]], "limit": limit}
    if filters.verified_only:
        q["verified"] = {"eq": True}
    if filters.datacenter_only:
        q["datacenter"] = {"eq": True}
    if filters.countries is not None:
        q["geolocation"] = {"in": sorted(filters.countries)}
    if filters.gpu_names is not None:
        q["gpu_name"] = {"in": [_api_gpu_name(n) for n in filters.gpu_names]}
    if filters.compute_caps is not None:
        q["compute_cap"] = {"in": list(filters.compute_caps)}
    for r in filters.ranges:
        if r.name == "cuda":
            # cuda_max_good is a float: only a lower bound is safe to send (12.10 is not a float)
            low = r.exact if r.exact is not None else r.lo
            if low is not None:
                text = versions.key_to_text(int(low))
                if text.count(".") == 1 and len(text.split(".")[1]) == 1:
                    q["cuda_max_good"] = {"gte": float(text)}
            continue
        api = _API_RANGES.get(r.name)
        if api is None:
            continue
        name, scale = api
        if r.exact is not None:
            if r.name == "disk-space-gb":  # an amount to allocate: at least that much
                q[name] = {"gte": r.exact * scale}
            elif r.name == "gpu-count":
                q[name] = {"eq": int(r.exact)}
            else:  # exact floats: send a closed range, the local filter decides equality
                q[name] = {"gte": r.exact * scale, "lte": r.exact * scale}
            continue
        cond = {}
        if r.lo is not None:
            cond["gte"] = r.lo * scale
        if r.hi is not None:
            cond["lte"] = r.hi * scale
        q[name] = cond
    return q


_QUERY_FILTER_NAMES = {"verified": "verified-only", "datacenter": "datacenter-only", "geolocation": "region",
                       "gpu_name": "gpu-names", "compute_cap": "compute-cap", "cuda_max_good": "cuda",
                       **{api: name for name, (api, _scale) in _API_RANGES.items()}}


def remote_filters(filters: Filters) -> list[str]:
    """Names of the filters the Vast.AI API applies for ``filters`` (for explanations)."""
    query = build_query(filters, 1)
    return [_QUERY_FILTER_NAMES[k] for k in query if k in _QUERY_FILTER_NAMES]


# The offer fields offer_from_api reads, with their units (docs/selection.md lists them too).
FIELDS_READ: dict[str, str] = {
    "id": "offer id (rent it with PUT /asks/{id}/)",
    "machine_id": "stable machine id: bans key on it",
    "gpu_name": "display name, e.g. \"RTX 4090\"",
    "num_gpus": "count",
    "gpu_ram": "MB per GPU",
    "gpu_totalram": "MB, all GPUs (else gpu_ram x num_gpus)",
    "gpu_mem_bw": "GB/s",
    "total_flops": "TFLOPS, all GPUs",
    "compute_cap": "capability x 100 (8.6 -> 860)",
    "cuda_max_good": "highest CUDA version the driver supports, a float (12.4)",
    "cpu_cores_effective": "cores the offer gets (else cpu_cores)",
    "cpu_cores": "cores of the machine",
    "cpu_ram": "MB",
    "dph_total": "USD/hour, the whole offer",
    "inet_up": "Mb/s",
    "inet_down": "Mb/s",
    "disk_space": "GB",
    "disk_bw": "MB/s",
    "dlperf": "DLPerf score",
    "verified": "bool (else verification == \"verified\")",
    "verification": "\"verified\" / \"unverified\" / \"deverified\"",
    "datacenter": "bool, when present (else hosting_type)",
    "hosting_type": "1 = datacenter, 0 = consumer",
    "geolocation": "\"<country name>, <ISO code>\"",
    "reliability": "0..1 (kept as a detail)",
}


def _verified(raw: dict) -> bool | None:
    if raw.get("verified") is not None:
        return bool(raw.get("verified"))
    if isinstance(raw.get("verification"), str):
        return raw.get("verification") == "verified"
    return None


def offer_from_api(raw: dict) -> Offer:
    """One Vast.AI bundle -> :class:`Offer` in annotation units."""
    num_gpus = num(raw.get("num_gpus"))
    gpu_ram = num(raw.get("gpu_ram"))
    total = num(raw.get("gpu_totalram"))
    if total != total and num_gpus == num_gpus:
        total = gpu_ram * num_gpus
    hosting = raw.get("datacenter")
    if hosting is None and "hosting_type" in raw:
        hosting = raw.get("hosting_type") == 1
    cpu = raw.get("cpu_cores_effective", raw.get("cpu_cores"))
    return Offer(
        provider="vastai",
        offer_id=str(raw.get("id")),
        machine_id=None if raw.get("machine_id") is None else str(raw.get("machine_id")),
        gpu_name=str(raw.get("gpu_name") or ""),
        gpu_count=num_gpus,
        vram_mb=gpu_ram,
        vram_total_mb=total,
        vram_bw_gbps=num(raw.get("gpu_mem_bw")),
        tflops=num(raw.get("total_flops")),
        compute_cap=num(raw.get("compute_cap")),
        cuda=versions.float_version_key(raw.get("cuda_max_good")),
        cpu_cores=num(cpu),
        ram_mb=num(raw.get("cpu_ram")),
        price=num(raw.get("dph_total")),
        upload_mbps=num(raw.get("inet_up")),
        download_mbps=num(raw.get("inet_down")),
        disk_gb=num(raw.get("disk_space")),
        disk_bw_mbps=num(raw.get("disk_bw")),
        dlperf=num(raw.get("dlperf")),
        verified=_verified(raw),
        datacenter=bool(hosting) if hosting is not None else None,
        country=country_from_location(raw.get("geolocation")),
        details={"reliability": raw.get("reliability"), "geolocation": raw.get("geolocation")},
    )


class VastAISource:
    """Offer source for Vast.AI. Owns its :class:`JsonClient` (close with ``aclose``)."""

    name = "vastai"

    def __init__(self, config: VastAIConfig, client: JsonClient | None = None) -> None:
        self.config = config
        self.client = client or JsonClient("vastai", policy=config.policy)

    async def aclose(self) -> None:
        await self.client.close()

    def remote_filters(self, filters: Filters) -> list[str]:
        return remote_filters(filters)

    async def offers(self, filters: Filters) -> OfferTable:
        query = build_query(filters, self.config.limit)
        headers = {"Accept": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return await self.client.request("GET", f"{self.config.base_url.rstrip('/')}/bundles/",
                                         params={"q": json.dumps(query, sort_keys=True)}, headers=headers,
                                         build=table_from_answer)


def table_from_answer(answer: object) -> OfferTable:
    """The offer table of a bundles answer ``{"offers": [...]}`` (runs on the selection thread)."""
    if not isinstance(answer, dict) or not isinstance(answer.get("offers"), list):
        raise ProviderError("vastai", "search answer has no 'offers' list")
    return OfferTable(offer_from_api(raw) for raw in answer["offers"]  # a generator: no offer object outlives its row
                      if isinstance(raw, dict) and raw.get("id") is not None)


__all__ = ["VastAIConfig", "VastAISource", "build_query", "offer_from_api", "normalize_gpu_name"]
