"""REST models of machine selection (``POST /v1/selections``, ``GET /v1/offers``, bans).

Kept here, beside the selection code, on :class:`anex_agent.wire.base.Model` (frozen,
unknown fields rejected); a cluster-side client parses answers with the same classes.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from anex_agent.wire.base import Model

ProviderName = Literal["vastai", "runpod", "onprem"]


class SelectionRequest(Model):
    annotations: dict[Annotated[str, Field(max_length=316)], Annotated[str, Field(max_length=1024)]] = Field(
        max_length=256, description="the pod's annotations (keys up to 316 characters, values up to 1024); only "
        "anex.sh/, vastai.anex.sh/, runpod.anex.sh/ and gpu-provider.glami.cz/ keys are read")
    providers: list[ProviderName] | None = Field(None, description="sources to ask; default: every configured one")
    limit: int = Field(10, ge=1, le=1000, description="most candidates to return")


class Candidate(Model):
    provider: ProviderName
    offer_id: str
    machine_id: str | None = Field(None, description="Vast.AI machine_id (bans key on it); on-prem node id")
    price_per_hour: float | None = Field(None, description="USD/hour for the whole machine")
    gpu_name: str
    gpu_count: float | int | None
    matched: dict[str, Any] = Field(description="for each active filter, the offer's value in annotation units")
    datacenter_id: str | None = None
    cloud_type: str | None = None
    disk_to_allocate_gb: float | int | None = None


class FilterCount(Model):
    filter: str
    annotations: list[str]
    removed: int = Field(description="offers this filter removed among those that passed the filters before it")
    remaining: int


class Blocking(Model):
    filter: str
    would_match_without: int = Field(description="offers that fail only this filter")


class IgnoredAnnotation(Model):
    annotation: str
    because: str


class Explanation(Model):
    offers_considered: int
    matched: int
    returned: int
    filters: list[FilterCount]
    ordering: str
    emptied_by: str | None = Field(None, description="when nothing matched: the filter at which the count hit 0")
    blocking: list[Blocking] = Field(default_factory=list)
    ignored: list[IgnoredAnnotation] = Field(default_factory=list, description="annotations that were set but "
                                             "not applied: a -min/-max beside an exact value")
    providers: dict[str, dict[str, Any]] = Field(default_factory=dict,
                                                 description="per source: offers, or error and retryable")


class SelectionResponse(Model):
    candidates: list[Candidate]
    explanation: Explanation


class OfferView(Model):
    provider: ProviderName
    offer_id: str
    machine_id: str | None
    specs: dict[str, Any] = Field(description="every field of the normalized offer, annotation units, null = unknown")


class OfferList(Model):
    offers: list[OfferView]
    providers: dict[str, dict[str, Any]]
    banned: list[str] = Field(default_factory=list, description="Vast.AI machine ids banned now")


class BanCreate(Model):
    machine_id: str = Field(min_length=1, max_length=64, description="Vast.AI machine_id")
    reason: str = Field("", max_length=1000)
    duration: float | None = Field(None, gt=0, le=365 * 86400, description="seconds; default: the configured time")


class BanView(Model):
    machine_id: str
    provider: Literal["vastai"] = "vastai"
    reason: str
    created_at: float
    expires_at: float


class BanList(Model):
    bans: list[BanView]


class ProvisioningFailure(Model):
    """The cluster reports that renting/starting a selected machine failed."""

    provider: ProviderName
    offer_id: str = Field("", max_length=64)
    machine_id: str | None = Field(None, max_length=64)
    reason: str = Field("", max_length=1000)


class ProvisioningFailureAck(Model):
    banned: bool
    ban: BanView | None = None
    detail: str


class NodeLabelsUpdate(Model):
    """``PATCH /v1/nodes/{node_id}/labels``: labels to set (added or replaced) and keys to remove.

    Known labels (``busy``, ``maintenance``, ``price-per-hour``, ``country``, ``upload-mbps``,
    ``download-mbps``, ``qualification``) are checked and normalized; others are free-form
    (see :mod:`anex_agent.selection.labels`). A key may not be both set and removed.
    """

    set: dict[str, str] = Field(default_factory=dict, max_length=64,
                                description="labels to add or replace: key -> value")
    remove: list[str] = Field(default_factory=list, max_length=64, description="label keys to remove (absent: ignored)")


class NodeLabels(Model):
    node_id: str
    labels: dict[str, str]
    version: int = Field(description="the change-log version of this update (watch streams carry it)")
