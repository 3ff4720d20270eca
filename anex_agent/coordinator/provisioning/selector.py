"""Candidates to rent, from a live offer search (never a cached answer).

:class:`LiveSelector` runs the selection in a selection worker process of its own (the same
jobs as ``POST /v1/selections``: :mod:`anex_agent.selection.worker`, off the coordinator's
event loop) over sources built with the provider cache turned off (``cache_ttl`` 0), so
every provisioning step asks the providers afresh; it
asks only the providers the coordinator can rent from (on-prem machines are not rented),
skips banned Vast.AI machines (:class:`anex_agent.selection.bans.BanStore`) and the offers
a provision already tried. Tests inject any object with the :class:`Selector` shape.
"""

from __future__ import annotations

import dataclasses
import json
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
    """The selection with the provider cache bypassed (see the module docstring).

    The work (provider fetch, decode, table, filters, ranking) runs in a selection worker process
    of its own (:class:`anex_agent.selection.worker.SelectionWorker`, built with ``cache_ttl`` 0),
    never on the coordinator's event loop; :meth:`supervise` stops it at shutdown. ``worker``:
    another worker (tests: :class:`~anex_agent.selection.worker.InProcessWorker`)."""

    def __init__(self, config: SelectionConfig, bans: BanStore, *, limit: int = 20, worker: Any = None) -> None:
        from anex_agent.selection.worker import SelectionWorker

        self.config = live_config(config)
        self.bans = bans
        self.limit = limit
        self.providers = frozenset(name for name, source in (("vastai", self.config.vastai),
                                                             ("runpod", self.config.runpod)) if source is not None)
        self.worker = worker if worker is not None else SelectionWorker(self.config)

    async def select(self, annotations: Mapping[str, str], *, providers: Collection[str],
                     exclude: Collection[tuple[str, str]]) -> Choice:
        from anex_agent.selection.worker_process import SELECT, Job

        filters = parse_annotations(annotations)
        asked = tuple(name for name in ("vastai", "runpod") if name in providers and name in self.providers)
        if not asked:
            return Choice([], "no provider this coordinator can rent from is configured")
        banned = await self.bans.banned_machines()
        body = await self.worker.run(Job(op=SELECT, filters=filters, providers=asked, banned=frozenset(banned),
                                         limit=self.limit + len(exclude), ordering=self.config.ordering))
        answer = json.loads(body)
        skip = set(exclude)
        candidates = [_candidate(c) for c in answer["candidates"]]
        candidates = [c for c in candidates if (c.provider, c.offer_id) not in skip][: self.limit]
        why = "" if candidates else str(answer["explanation"].get("emptied_by") or "every matching offer was tried")
        return Choice(candidates, why)

    async def supervise(self) -> None:
        """A coordinator background task: stops the worker process at shutdown."""
        await self.worker.supervise()


def live_config(config: SelectionConfig) -> SelectionConfig:
    """``config`` with the provider cache off: every selection asks the providers afresh."""
    live = dataclasses.replace(config.policy, cache_ttl=0.0)
    return dataclasses.replace(
        config, policy=live,
        vastai=None if config.vastai is None else dataclasses.replace(config.vastai, policy=live),
        runpod=None if config.runpod is None else dataclasses.replace(config.runpod, policy=live))
