"""One normalized offer model for every source, and a column-wise table of offers.

:class:`Offer` holds one rentable (or on-prem) machine in *annotation units* (see
:mod:`anex_agent.selection.units`): MB, GB/s, TFLOPS, Mbps, MB/s, GB, USD/hour, compute
capability x 100, CUDA as a version key. A value a provider does not report is NaN for
numbers and None otherwise; a filter on an unknown value never matches (unknown is not
proof that a requirement holds).

:class:`OfferTable` keeps the same data as one list per field. Numeric columns are
``array('d')`` (contiguous doubles), text columns share one object per distinct value, and
the list columns (country, GPU, compute capability) carry a per-value index of rows.
Filtering walks a list of row indices through one field at a time (see :mod:`anex_agent.selection.filters`), which
is several times faster in CPython than testing every predicate on every object.
"""

from __future__ import annotations

import re
from array import array
from collections.abc import Iterable, Sequence as SequenceABC
from operator import attrgetter
from typing import Sequence

from anex_agent.selection.jsonpieces import dismantle
from itertools import chain
from dataclasses import dataclass, field, fields

NAN = float("nan")

PROVIDERS = ("vastai", "runpod", "onprem")


def normalize_gpu_name(name: object) -> str:
    """Canonical GPU name for matching: case-folded, ``_`` as space, vendor words dropped.

    ``"RTX_4090"`` (Vast.AI query form), ``"RTX 4090"`` (Vast.AI/RunPod display name) and
    ``"NVIDIA GeForce RTX 4090"`` (NVML, RunPod id) all become ``"rtx 4090"``.
    """
    if not isinstance(name, str):
        return ""
    words = re.split(r"[\s_]+", name.strip().casefold())
    return " ".join(w for w in words if w and w not in ("nvidia", "geforce"))


@dataclass(frozen=True, slots=True)
class Offer:
    """One candidate machine. Numbers in annotation units; NaN/None = not reported."""

    provider: str
    offer_id: str
    machine_id: str | None = None
    gpu_name: str = ""
    gpu_count: float = NAN
    vram_mb: float = NAN  # per GPU
    vram_total_mb: float = NAN
    vram_bw_gbps: float = NAN
    tflops: float = NAN  # total
    compute_cap: float = NAN  # capability x 100
    cuda: float = NAN  # version key, see versions.version_key
    cpu_cores: float = NAN
    ram_mb: float = NAN
    price: float = NAN  # USD/hour, whole machine
    upload_mbps: float = NAN
    download_mbps: float = NAN
    disk_gb: float = NAN
    disk_bw_mbps: float = NAN
    dlperf: float = NAN
    verified: bool | None = None
    datacenter: bool | None = None
    country: str | None = None
    datacenter_id: str | None = None  # RunPod data center id
    cloud_type: str | None = None  # RunPod SECURE / COMMUNITY
    details: dict = field(default_factory=dict, compare=False, hash=False)

    @property
    def gpu_key(self) -> str:
        return normalize_gpu_name(self.gpu_name)


COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Offer))
NUMERIC_COLUMNS = frozenset(f.name for f in fields(Offer) if f.type == "float")


class OfferTable:
    """Offers stored column-wise: ``table.col["price"][i]`` is the price of row ``i``.

    Built once per fetch (providers cache it), read by any number of selections. Derived
    columns: ``gpu_key`` (normalized GPU name) and ``provider`` stays a column like the rest.
    Rows are never mutated after construction.

    The table keeps columns only: no object per offer survives the build (``offers[i]``
    rebuilds row ``i`` as an :class:`Offer` on demand). Numbers live in arrays and text in
    lists of shared strings, none of which the cyclic garbage collector has to walk one by
    one, so a cached table of 100,000 offers does not lengthen the process's full
    collections (100,000 live ``Offer`` objects made each one last 100-200 ms, a stall of
    every thread). Pass a generator of offers so that each one is dropped once read.
    """

    __slots__ = ("col", "size", "_index")

    INDEXED = ("country", "gpu_key", "compute_cap")

    def __init__(self, offers: Iterable[Offer]) -> None:
        row_of = attrgetter(*COLUMNS)
        rows = [row_of(o) for o in offers]  # plain tuples: the collector untracks them
        self.size = len(rows)
        self.col: dict[str, Sequence] = {}
        for k, name in enumerate(COLUMNS):
            # one comprehension per column, not zip(*rows): that single C call would hold the
            # GIL for ~100 ms at 100,000 offers
            values = [row[k] for row in rows]
            if name in NUMERIC_COLUMNS:
                self.col[name] = array("d", values)  # contiguous: no pointer chasing when filtering
            elif name != "details":
                shared: dict = {}
                self.col[name] = [shared.setdefault(v, v) for v in values]  # equal values share one object
            else:
                self.col[name] = values
        dismantle(rows)  # their floats were copied into arrays: free them a piece at a time
        keys: dict[str, str] = {}
        self.col["gpu_key"] = [keys.setdefault(n, normalize_gpu_name(n)) if n not in keys else keys[n]
                               for n in self.col["gpu_name"]]
        self._index = {name: self._build_index(name) for name in self.INDEXED}

    @property
    def offers(self) -> "Rows":
        """The rows as :class:`Offer` values, made on demand (``offers[i]``, ``len``, iteration)."""
        return Rows(self)

    def _build_index(self, column: str) -> dict:
        index: dict = {}
        for i, value in enumerate(self.col[column]):
            if value == value:  # NaN never matches, never indexed
                index.setdefault(value, []).append(i)
        return index

    def rows_with(self, column: str, allowed: frozenset) -> list[int]:
        """Rows whose ``column`` is in ``allowed``, ascending (from the per-value index; no scan).

        Ascending, so later filters read the columns in memory order.
        """
        return sorted(self._matching(column, allowed))

    def row_set(self, column: str, allowed: frozenset) -> set[int]:
        """The same rows as a set (for intersecting with rows already narrowed)."""
        return set(self._matching(column, allowed))

    def _matching(self, column: str, allowed: frozenset):
        index = self._index[column]
        return chain.from_iterable(index[v] for v in allowed if v in index)

    @classmethod
    def concat(cls, tables: list["OfferTable"]) -> "OfferTable":
        out = cls.__new__(cls)
        out.size = sum(t.size for t in tables)
        if len(tables) == 1:
            out.col, out._index = tables[0].col, tables[0]._index  # never mutated: share them
            return out
        out.col = {name: (array("d", chain.from_iterable(t.col[name] for t in tables)) if name in NUMERIC_COLUMNS
                          else list(chain.from_iterable(t.col[name] for t in tables)))
                   for name in (*COLUMNS, "gpu_key")}
        out._index = {}
        for name in cls.INDEXED:
            merged: dict = {}
            offset = 0
            for t in tables:
                for value, rows in t._index[name].items():
                    merged.setdefault(value, []).extend(i + offset for i in rows)
                offset += t.size
            out._index[name] = merged
        return out

    def __len__(self) -> int:
        return self.size


class Rows(SequenceABC):
    """The rows of an :class:`OfferTable` as :class:`Offer` values, each made when asked for."""

    __slots__ = ("_table",)

    def __init__(self, table: OfferTable) -> None:
        self._table = table

    def __len__(self) -> int:
        return self._table.size

    def __getitem__(self, row):  # type: ignore[override]
        if isinstance(row, slice):
            return [self[i] for i in range(*row.indices(self._table.size))]
        if not -self._table.size <= row < self._table.size:
            raise IndexError(row)
        col = self._table.col
        return Offer(*(col[name][row] for name in COLUMNS))
