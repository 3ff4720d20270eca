"""Candidates to rent, from a live offer search (never a cached answer).

:class:`LiveSelector` runs the selection (:func:`anex_agent.selection.service.gather_offers`
and :func:`~anex_agent.selection.service.choose`) over sources built with the provider cache
turned off (``cache_ttl`` 0), so every provisioning step asks the providers afresh; it
asks only the providers the coordinator can rent from (on-prem machines are not rented),
skips banned Vast.AI machines (:class:`anex_agent.selection.bans.BanStore`) and the offers
a provision already tried. Tests inject any object with the :class:`Selector` shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.bans import BanStore
from anex_agent.selection.config import SelectionConfig

DEFAULT_DISK_GB = 20.0


@dataclass(frozen=True)
class Candidate:
    provider: str
    offer_id: str
    machine_id: str | None = None
    price_per_hour: float | None = None
    gpu_count: int = 1
    disk_gb: float | None = None  # what the annotations ask to allocate


@dataclass(frozen=True)
class Choice:
    candidates: list[Candidate]
    why_none: str = ""  # when empty: what emptied the selection


class Selector(Protocol):
    async def select(self, annotations: Mapping[str, str], *, providers: Collection[str],
                     exclude: Collection[tuple[str, str]]) -> Choice: ...


def _candidate(raw: Mapping[str, Any]) -> Candidate:
    gpus = raw.get("gpu_count")
    return Candidate(provider=raw["provider"], offer_id=str(raw["offer_id"]),
                     machine_id=None if raw.get("machine_id") is None else str(raw["machine_id"]),
                     price_per_hour=raw.get("price_per_hour"),
                     gpu_count=max(1, int(gpus)) if isinstance(gpus, (int, float)) else 1,
                     disk_gb=raw.get("disk_to_allocate_gb"))


class LiveSelector:
    """The selection with the provider cache bypassed (see the module docstring)."""

    def __init__(self, config: SelectionConfig, bans: BanStore, *, limit: int = 20) -> None:
        self.config = config
        self.bans = bans
        self.limit = limit
        self._sources = self._build_sources(config)

    @staticmethod
    def _build_sources(config: SelectionConfig) -> dict[str, Any]:
        from anex_agent.selection.providers.runpod import RunPodSource
        from anex_agent.selection.providers.vastai import VastAISource

        live = dataclasses.replace(config.policy, cache_ttl=0.0)
        sources: dict[str, Any] = {}
        if config.vastai is not None:
            sources["vastai"] = VastAISource(dataclasses.replace(config.vastai, policy=live))
        if config.runpod is not None:
            sources["runpod"] = RunPodSource(dataclasses.replace(config.runpod, policy=live))
        return sources

    async def select(self, annotations: Mapping[str, str], *, providers: Collection[str],
                     exclude: Collection[tuple[str, str]]) -> Choice:
        from anex_agent.selection.service import attach_provider_report, choose, gather_offers
        from anex_agent.selection import worker

        filters = parse_annotations(annotations)
        sources = [s for name, s in self._sources.items() if name in providers]
        if not sources:
            return Choice([], "no provider this coordinator can rent from is configured")
        table, report = await gather_offers(sources, filters)
        banned = await self.bans.banned_machines()
        selection = await worker.run(choose, table, filters, banned=banned, limit=self.limit + len(exclude),
                                     default_ordering=self.config.ordering)
        attach_provider_report(selection, report)
        skip = set(exclude)
        candidates = [_candidate(c) for c in selection.candidates]
        candidates = [c for c in candidates if (c.provider, c.offer_id) not in skip][: self.limit]
        why = "" if candidates else str(selection.explanation.get("emptied_by") or "every matching offer was tried")
        return Choice(candidates, why)

