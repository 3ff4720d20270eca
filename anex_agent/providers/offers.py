"""Offer sources: Vast.AI, RunPod and on-prem nodes.

Every source provides ``name`` and ``async offers(filters) -> OfferTable``. Sources may use
the filters to narrow what they ask the provider for; the selection always applies every
filter again locally, so a source may return more than matches but never less.
"""

from __future__ import annotations

from typing import Protocol

from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import OfferTable


class OfferSource(Protocol):
    name: str

    async def offers(self, filters: Filters) -> OfferTable: ...
