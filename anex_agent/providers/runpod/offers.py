"""RunPod offers from its GraphQL API (``POST https://api.runpod.io/graphql``).

One query asks for ``gpuTypes`` (``id``, ``displayName``, ``memoryInGb``, ``secureCloud``,
``communityCloud``, ``securePrice``/``communityPrice`` in USD/hour per GPU, ``maxGpuCount``,
``lowestPrice(input: {gpuCount})`` with ``stockStatus``, ``minVcpu``, ``minMemory`` in GB) and
``dataCenters`` (``id`` such as ``EU-RO-1``, ``name``, ``location``, ``gpuAvailability``: the
GPU type ids in stock there with their ``stockStatus``).

Each (GPU type, data center where it is in stock, cloud tier it is offered in) becomes one
:class:`Offer`: price = tier price x GPU count, the GPU count being ``anex.sh/gpu-count``
(else its ``-min``, else 1). RunPod does not report CUDA, bandwidth, TFLOPS or network
speeds here, so filters on them exclude RunPod offers (unknown never matches). There is no
machine id, hence no bans (as documented). The country comes from the data center id in
every shape RunPod uses (``EU-RO-1`` -> RO, ``EUR-IS-1`` -> IS, ``SEA-SG-1`` -> SG,
``US-CA-2`` -> US, ``CA-MTL-1`` -> CA; see :func:`country_of_datacenter`).

Configuration: ``RunPodConfig`` (API key from ``ANEX_RUNPOD_API_KEY`` or ``--runpod-api-key``).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field

from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import Offer, OfferTable
from anex_agent.providers.offers_http import HttpPolicy, JsonClient, ProviderError
from anex_agent.selection.regions import region_of
from anex_agent.selection.units import gb_to_mb, num

DEFAULT_URL = "https://api.runpod.io/graphql"

QUERY = """
query AnexOffers($gpuCount: Int!) {
  gpuTypes {
    id displayName memoryInGb secureCloud communityCloud securePrice communityPrice maxGpuCount
    lowestPrice(input: {gpuCount: $gpuCount}) { stockStatus minVcpu minMemory uninterruptablePrice }
  }
  dataCenters { id name location gpuAvailability { gpuTypeId stockStatus available } }
}
""".strip()


# What offers_from_answer reads from the answer to QUERY (docs/selection.md lists them too).
FIELDS_READ: dict[str, str] = {
    "gpuTypes[].id": "GPU type id, e.g. \"NVIDIA GeForce RTX 4090\" (gpuAvailability refers to it)",
    "gpuTypes[].displayName": "e.g. \"RTX 4090\"",
    "gpuTypes[].memoryInGb": "GB per GPU",
    "gpuTypes[].secureCloud / communityCloud": "bool: offered in the tier",
    "gpuTypes[].securePrice / communityPrice": "USD/hour per GPU",
    "gpuTypes[].maxGpuCount": "most GPUs of the type in one pod",
    "gpuTypes[].lowestPrice.stockStatus": "null when out of stock for gpuCount",
    "gpuTypes[].lowestPrice.minVcpu": "vCPUs for gpuCount GPUs",
    "gpuTypes[].lowestPrice.minMemory": "GB of RAM for gpuCount GPUs",
    "dataCenters[].id": "e.g. EU-RO-1, EUR-IS-1, US-CA-2 (the country comes from it)",
    "dataCenters[].gpuAvailability[].gpuTypeId / stockStatus / available": "what is in stock there",
}


@dataclass(frozen=True)
class RunPodConfig:
    api_key: str = field(default="", repr=False)
    url: str = DEFAULT_URL
    policy: HttpPolicy = HttpPolicy()


def requested_gpu_count(filters: Filters) -> int:
    r = filters.range("gpu-count")
    if r is None:
        return 1
    value = r.exact if r.exact is not None else r.lo
    return max(1, int(value or 1))


# Two-letter region prefixes that are also ISO country codes (AF Afghanistan, SA Saudi Arabia, ME
# Montenegro, AS American Samoa, NA Namibia): read as a region when a country code follows.
_TWO_LETTER_REGION_PREFIXES = frozenset({"EU", "AP", "OC", "AF", "SA", "ME", "AS", "NA", "AN"})


_SERIAL = re.compile(r"[0-9]+")


def country_of_datacenter(dc_id: str) -> str | None:
    """The ISO country code of a RunPod data center id, or None when it names none.

    Shapes RunPod uses (a trailing number is the site index and is ignored):

    * ``<region>-<country>-<n>`` with a two-, three- or four-letter region: ``EU-RO-1`` -> RO,
      ``EUR-IS-1`` -> IS, ``EUR-NO-1`` -> NO, ``AP-JP-1`` -> JP, ``OC-AU-1`` -> AU, ``SEA-SG-1`` -> SG;
    * ``<country>-<state or city>-<n>``: ``US-CA-2`` -> US (California, not Canada),
      ``US-DE-1`` -> US (Delaware), ``US-TX-3`` -> US, ``CA-MTL-1`` -> CA (Montreal);
    * ``<country>-<n>`` / ``<country>``: ``JP-1`` -> JP.

    A region prefix is a leading part that is not a country code (``EUR``, ``SEA``), or one of
    the two-letter region codes above followed by a country code.
    """
    parts = [p for p in str(dc_id).strip().upper().split("-") if p]
    while parts and _SERIAL.fullmatch(parts[-1]):  # the trailing serial number(s)
        parts.pop()
    if not parts:
        return None
    head = parts[0]
    second = parts[1] if len(parts) > 1 else ""
    second_is_country = len(second) == 2 and region_of(second) is not None
    if second_is_country and (region_of(head) is None or head in _TWO_LETTER_REGION_PREFIXES):
        return second
    if len(head) == 2 and region_of(head) is not None:
        return head
    return None


def offers_from_answer(data: dict, gpu_count: int) -> list[Offer]:
    gpu_types = {g.get("id"): g for g in data.get("gpuTypes") or [] if isinstance(g, dict)}
    out: list[Offer] = []
    for dc in data.get("dataCenters") or []:
        if not isinstance(dc, dict) or not dc.get("id"):
            continue
        dc_id = str(dc["id"]).upper()
        for avail in dc.get("gpuAvailability") or []:
            gpu = gpu_types.get(avail.get("gpuTypeId"))
            if gpu is None or not avail.get("stockStatus") or avail.get("available") is False:
                continue
            lowest = gpu.get("lowestPrice") or {}
            if not lowest.get("stockStatus"):
                continue
            max_count = gpu.get("maxGpuCount")
            if isinstance(max_count, int) and max_count < gpu_count:
                continue
            for tier, flag, price_field in (("SECURE", "secureCloud", "securePrice"),
                                            ("COMMUNITY", "communityCloud", "communityPrice")):
                per_gpu = num(gpu.get(price_field))
                if not gpu.get(flag) or not per_gpu > 0:
                    continue
                vram = gb_to_mb(gpu.get("memoryInGb"))
                out.append(Offer(
                    provider="runpod",
                    offer_id=f"{gpu['id']}@{dc_id}/{tier}/x{gpu_count}",
                    gpu_name=str(gpu.get("displayName") or gpu["id"]),
                    gpu_count=float(gpu_count),
                    vram_mb=vram,
                    vram_total_mb=vram * gpu_count,
                    cpu_cores=num(lowest.get("minVcpu")),
                    ram_mb=gb_to_mb(lowest.get("minMemory")),
                    price=round(per_gpu * gpu_count, 6),
                    datacenter=tier == "SECURE",
                    country=country_of_datacenter(dc_id),
                    datacenter_id=dc_id,
                    cloud_type=tier,
                    details={"gpu_type_id": gpu["id"], "stock": avail.get("stockStatus"),
                             "datacenter_name": dc.get("name"), "location": dc.get("location")},
                ))
    return out


class RunPodSource:
    name = "runpod"

    def __init__(self, config: RunPodConfig, client: JsonClient | None = None) -> None:
        self.config = config
        self.client = client or JsonClient("runpod", policy=config.policy)

    async def aclose(self) -> None:
        await self.client.close()

    async def offers(self, filters: Filters) -> OfferTable:
        count = requested_gpu_count(filters)
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        return await self.client.request("POST", self.config.url, headers=headers,
                                         body={"query": QUERY, "variables": {"gpuCount": count}},
                                         build=functools.partial(table_from_answer, gpu_count=count))


def table_from_answer(answer: object, gpu_count: int) -> OfferTable:
    """The offer table of a GraphQL answer (runs on the selection thread); GraphQL errors raise."""
    if not isinstance(answer, dict):
        raise ProviderError("runpod", "GraphQL answer is not an object")
    if answer.get("errors"):
        messages = "; ".join(str(e.get("message", "?")) for e in answer["errors"] if isinstance(e, dict))
        raise ProviderError("runpod", f"GraphQL errors: {messages or 'unspecified'}")
    data = answer.get("data")
    if not isinstance(data, dict):
        raise ProviderError("runpod", "GraphQL answer has no 'data'")
    return OfferTable(offers_from_answer(data, gpu_count))
