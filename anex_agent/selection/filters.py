"""Pure filtering of an :class:`OfferTable` by :class:`Filters`, with an explanation.

Filters run in one fixed, documented order (:data:`STEP_ORDER`: what the pod asks of every
machine first, region and GPU model leading, then provider-scoped filters and bans); each
step narrows a list of row indices by looking at one column. The first step, when it is a
list filter (region, gpu-names, compute-cap), does not scan the table at all: it takes the
rows straight from the table's per-value index (:meth:`OfferTable.rows_with`). A step's ``removed`` count is the number of offers it
removed *among those that passed the steps before it*, so the counts add up to
``total - remaining``. Unknown provider values (NaN/None) never satisfy a filter.

Provider-scoped filters (``vastai.anex.sh/*``, ``runpod.anex.sh/*``, bans) only look at their
provider's offers and let the others pass.

``anex.sh/disk-space-gb`` is the container disk to *allocate* (Anex docs), so its exact
value means "at least that much free disk"; its ``-min``/``-max`` bound the offer's disk.

When nothing is left, :func:`apply_filters` also says which filters emptied the list:
``emptied_by`` (the step at which the count reached zero) and ``blocking`` (for each filter,
how many offers would match if that one filter were dropped, i.e. the offers it alone rejects).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from anex_agent.selection.annotations import Filters
from anex_agent.selection.offers import OfferTable

STEP_ORDER = (
    "region", "gpu-names", "compute-cap",
    "gpu-count", "vram", "vram-total", "vram-bandwidth", "tflops", "cuda", "cpu", "ram", "price",
    "upload-speed", "download-speed", "disk-space-gb", "disk-bw",
    "verified-only", "datacenter-only", "dlperf", "cloud-type", "datacenter-ids", "banned",
)

Keep = Callable[[dict[str, list], list[int]], list[int]]


@dataclass(frozen=True)
class Step:
    """One filter step: its name, the annotations behind it, and how it narrows row indices."""

    name: str
    annotations: tuple[str, ...]
    keep: Keep
    index: tuple[str, frozenset] | None = None  # (column, allowed values): seed from the table's index


@dataclass(frozen=True)
class StepReport:
    name: str
    annotations: tuple[str, ...]
    removed: int
    remaining: int


@dataclass(frozen=True)
class FilterResult:
    rows: list[int]
    total: int
    steps: tuple[StepReport, ...]
    emptied_by: str | None = None
    blocking: tuple[tuple[str, int], ...] = ()  # (filter, offers that match without it), only when empty


def _range_keep(column: str, lo: float, hi: float, exact: bool, only: str | None) -> Keep:
    def keep(col: dict[str, list], rows: list[int]) -> list[int]:
        c = col[column]
        if only is not None:
            p = col["provider"]
            if exact:
                return [i for i in rows if p[i] != only or c[i] == lo]
            return [i for i in rows if p[i] != only or lo <= c[i] <= hi]
        if exact:
            return [i for i in rows if c[i] == lo]
        if lo == -math.inf:
            return [i for i in rows if c[i] <= hi]
        if hi == math.inf:
            return [i for i in rows if c[i] >= lo]
        return [i for i in rows if lo <= c[i] <= hi]

    return keep


def _member_keep(column: str, allowed: frozenset, only: str | None = None) -> Keep:
    def keep(col: dict[str, list], rows: list[int]) -> list[int]:
        c = col[column]
        if only is not None:
            p = col["provider"]
            return [i for i in rows if p[i] != only or c[i] in allowed]
        return [i for i in rows if c[i] in allowed]

    return keep


def _not_member_keep(column: str, banned: frozenset, only: str) -> Keep:
    def keep(col: dict[str, list], rows: list[int]) -> list[int]:
        c, p = col[column], col["provider"]
        return [i for i in rows if p[i] != only or c[i] not in banned]

    return keep


def _true_keep(column: str, only: str) -> Keep:
    def keep(col: dict[str, list], rows: list[int]) -> list[int]:
        c, p = col[column], col["provider"]
        return [i for i in rows if p[i] != only or c[i] is True]

    return keep


def build_steps(filters: Filters, banned_machines: frozenset[str] = frozenset()) -> list[Step]:
    """The active steps for these filters, in :data:`STEP_ORDER`."""
    steps: dict[str, Step] = {}
    src = filters.source_of
    if banned_machines:
        steps["banned"] = Step("banned", ("machine bans (Vast.AI)",),
                               _not_member_keep("machine_id", frozenset(banned_machines), "vastai"))
    if filters.verified_only:
        steps["verified-only"] = Step("verified-only", src("verified-only"), _true_keep("verified", "vastai"))
    if filters.datacenter_only:
        steps["datacenter-only"] = Step("datacenter-only", src("datacenter-only"), _true_keep("datacenter", "vastai"))
    if filters.cloud_type is not None:
        steps["cloud-type"] = Step("cloud-type", src("cloud-type"),
                                   _member_keep("cloud_type", frozenset({filters.cloud_type}), "runpod"))
    if filters.datacenter_ids is not None:
        steps["datacenter-ids"] = Step("datacenter-ids", src("datacenter-ids"),
                                       _member_keep("datacenter_id", frozenset(filters.datacenter_ids), "runpod"))
    if filters.countries is not None:
        steps["region"] = Step("region", src("region"), _member_keep("country", filters.countries),
                               ("country", filters.countries))
    if filters.gpu_keys is not None:
        keys = frozenset(filters.gpu_keys)
        steps["gpu-names"] = Step("gpu-names", src("gpu-names"), _member_keep("gpu_key", keys), ("gpu_key", keys))
    if filters.compute_caps is not None:
        caps = frozenset(float(c) for c in filters.compute_caps)
        steps["compute-cap"] = Step("compute-cap", src("compute-cap"), _member_keep("compute_cap", caps),
                                    ("compute_cap", caps))
    for r in filters.ranges:
        lo, hi = r.bounds
        exact = r.exact is not None
        if r.name == "disk-space-gb" and exact:
            hi, exact = math.inf, False  # an amount to allocate: the offer needs at least that much
        only = "vastai" if r.name == "dlperf" else None
        steps[r.name] = Step(r.name, r.sources, _range_keep(r.column, lo, hi, exact, only))
    return [steps[name] for name in STEP_ORDER if name in steps]


def apply_filters(table: OfferTable, filters: Filters, banned_machines: frozenset[str] = frozenset()) -> FilterResult:
    """Rows of ``table`` that satisfy every filter (in no particular order: rank orders them),
    with per-step counts."""
    steps = build_steps(filters, banned_machines)
    rows: list[int] = []
    reports: list[StepReport] = []
    emptied_by: str | None = None
    for n, step in enumerate(steps):
        before = table.size if n == 0 else len(rows)
        if n == 0 and step.index is not None:
            rows = table.rows_with(*step.index)
        elif n == 0:
            rows = step.keep(table.col, list(range(table.size)))
        elif before and step.index is not None:
            allowed = table.row_set(*step.index)  # ints hash fast: cheaper than reading the column
            rows = [i for i in rows if i in allowed]
        elif before:
            rows = step.keep(table.col, rows)
        reports.append(StepReport(step.name, step.annotations, before - len(rows), len(rows)))
        if before and not rows:
            emptied_by = step.name
    if not steps:
        rows = list(range(table.size))
    blocking: tuple[tuple[str, int], ...] = ()
    if not rows and table.size and steps:
        blocking = _blocking(table, steps)
    return FilterResult(rows, table.size, tuple(reports), emptied_by, blocking)


def _blocking(table: OfferTable, steps: list[Step]) -> tuple[tuple[str, int], ...]:
    """For each step, how many offers fail that step and no other (would match without it)."""
    everything = list(range(table.size))
    failures = [0] * table.size
    failed_sets: list[set[int]] = []
    for step in steps:
        passed = set(step.keep(table.col, everything))
        failed = set(everything) - passed
        failed_sets.append(failed)
        for i in failed:
            failures[i] += 1
    out = []
    for step, failed in zip(steps, failed_sets):
        only_this = sum(1 for i in failed if failures[i] == 1)
        if only_this:
            out.append((step.name, only_this))
    return tuple(out)
