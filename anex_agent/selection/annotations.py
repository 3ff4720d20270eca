"""Pod annotations -> a frozen :class:`Filters` value (pure: no I/O).

Prefixes (Anex docs "Machine Selection"; legacy GLAMI "gpu-provider" docs):

* ``anex.sh/``              shared filters, and ``ordering`` (``price`` / ``prefer-onprem``);
* ``vastai.anex.sh/``       Vast.AI only: ``verified-only`` (default true), ``datacenter-only``, ``dlperf``;
* ``runpod.anex.sh/``       RunPod only: ``cloud-type``, ``datacenter-ids``, ``keep-gpu-type-priority``;
* ``gpu-provider.glami.cz/`` legacy names still carried by existing pods: the shared filters the
  legacy docs list, plus ``verified-only`` / ``datacenter-only`` / ``vastai-dlperf*`` (Vast.AI).

Semantics: an exact value overrides its ``-min``/``-max``: they are then ignored entirely
(not parsed, not compared, never an error; listed in ``Filters.ignored`` for the
explanation); all filters must hold (AND); a list accepts any of its values (OR). Annotations
under any other prefix are ignored. Every problem (unknown key under one of our prefixes,
unparsable value, unknown region or cloud type, ``-min`` > ``-max``, the same filter set
differently under the legacy and current names; none of them for an ignored ``-min``/``-max``) is collected and raised together as one
:class:`AnnotationError`, each naming the annotation and saying what is accepted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from collections.abc import Callable, Mapping
from typing import TypeVar

from anex_agent.errors import ConfigError
from anex_agent.selection import units, versions
from anex_agent.selection.offers import normalize_gpu_name
from anex_agent.selection.regions import REGION_NAMES, countries_of

SHARED = "anex.sh/"
VASTAI = "vastai.anex.sh/"
RUNPOD = "runpod.anex.sh/"
LEGACY = "gpu-provider.glami.cz/"
OUR_PREFIXES = (VASTAI, RUNPOD, SHARED, LEGACY)


@dataclass(frozen=True)
class NumericSpec:
    """One documented numeric filter: annotation base name -> offer column, unit, value kind."""

    name: str
    column: str
    unit: str
    kind: str  # "int" | "float" | "version"


# Anex docs, "Numeric Filters" table (order kept: it is also the explanation order).
SHARED_NUMERIC: tuple[NumericSpec, ...] = (
    NumericSpec("gpu-count", "gpu_count", "count", "int"),
    NumericSpec("vram", "vram_mb", "MB", "float"),
    NumericSpec("vram-total", "vram_total_mb", "MB", "float"),
    NumericSpec("vram-bandwidth", "vram_bw_gbps", "GB/s", "float"),
    NumericSpec("tflops", "tflops", "TFLOPS", "float"),
    NumericSpec("cuda", "cuda", "version", "version"),
    NumericSpec("cpu", "cpu_cores", "cores", "int"),
    NumericSpec("ram", "ram_mb", "MB", "float"),
    NumericSpec("price", "price", "USD/hour", "float"),
    NumericSpec("upload-speed", "upload_mbps", "Mbps", "float"),
    NumericSpec("download-speed", "download_mbps", "Mbps", "float"),
    NumericSpec("disk-space-gb", "disk_gb", "GB", "float"),
    NumericSpec("disk-bw", "disk_bw_mbps", "MB/s", "float"),
)
DLPERF = NumericSpec("dlperf", "dlperf", "score", "float")
# Legacy docs list every shared numeric filter except disk-space-gb and disk-bw.
LEGACY_NUMERIC = tuple(s.name for s in SHARED_NUMERIC if s.name not in ("disk-space-gb", "disk-bw"))

CLOUD_TYPES = ("SECURE", "COMMUNITY")
ORDERINGS = ("price", "prefer-onprem")  # anex.sh/ordering; see rank.py
BOOL_WORDS = {"true": True, "false": False}


@dataclass(frozen=True)
class Range:
    """A numeric filter on ``column``. ``exact`` set: ``lo``/``hi`` are ignored (docs: exact vs range)."""

    name: str
    column: str
    unit: str
    exact: float | None
    lo: float | None
    hi: float | None
    sources: tuple[str, ...]  # the annotations that set it

    @property
    def bounds(self) -> tuple[float, float]:
        """Inclusive (low, high); infinities where open."""
        if self.exact is not None:
            return self.exact, self.exact
        return (-math.inf if self.lo is None else self.lo), (math.inf if self.hi is None else self.hi)


@dataclass(frozen=True)
class Filters:
    """Everything the annotations ask for. ``sources`` maps a filter name to its annotations."""

    ranges: tuple[Range, ...] = ()
    regions: tuple[str, ...] | None = None
    countries: frozenset[str] | None = None
    gpu_names: tuple[str, ...] | None = None  # as given, in priority order
    compute_caps: tuple[int, ...] | None = None  # capability x 100
    verified_only: bool = True  # Vast.AI; docs: default true
    datacenter_only: bool = False  # Vast.AI
    cloud_type: str | None = None  # RunPod; None = both tiers
    datacenter_ids: tuple[str, ...] | None = None  # RunPod, priority order
    keep_gpu_type_priority: bool = False  # RunPod
    sources: tuple[tuple[str, tuple[str, ...]], ...] = ()
    ignored: tuple[tuple[str, str], ...] = ()  # (annotation, why): -min/-max beside an exact value
    ordering: str | None = None  # anex.sh/ordering; None: the coordinator's default

    @property
    def gpu_keys(self) -> tuple[str, ...] | None:
        return None if self.gpu_names is None else tuple(normalize_gpu_name(n) for n in self.gpu_names)

    def range(self, name: str) -> Range | None:
        for r in self.ranges:
            if r.name == name:
                return r
        return None

    @property
    def disk_to_allocate_gb(self) -> float | None:
        """``anex.sh/disk-space-gb`` is also the container disk to allocate (exact, else -min)."""
        r = self.range("disk-space-gb")
        if r is None:
            return None
        return r.exact if r.exact is not None else r.lo

    def source_of(self, name: str) -> tuple[str, ...]:
        return dict(self.sources).get(name, ())


@dataclass(frozen=True)
class AnnotationProblem:
    annotation: str
    message: str


class AnnotationError(ConfigError):
    """Bad selection annotations. ``problems`` lists each one (annotation, what is wrong/accepted)."""

    def __init__(self, problems: list[AnnotationProblem]) -> None:
        self.problems = tuple(problems)
        first = problems[0]
        text = "; ".join(f"{p.annotation}: {p.message}" for p in problems[1:])
        super().__init__(first.annotation, first.message + (f"; {text}" if text else ""))


@dataclass
class _Collector:
    problems: list[AnnotationProblem] = field(default_factory=list)

    def add(self, annotation: str, message: str) -> None:
        self.problems.append(AnnotationProblem(annotation, message))


def _shared_names() -> set[str]:
    names = {"region", "gpu-names", "compute-cap"}
    for spec in SHARED_NUMERIC:
        names |= {spec.name, f"{spec.name}-min", f"{spec.name}-max"}
    return names


#: ``anex.sh/`` names the provisioning loop reads (its recovery policy:
#: :mod:`anex_agent.coordinator.provisioning.policy`); accepted here, not filters
PROVISIONING_NAMES = frozenset({"retry-on", "retry-for", "interruptible", "idle-release", "idle-threshold",
                                "deadline-rent", "deadline-running", "deadline-join", "deadline-heartbeat",
                                "deadline-workload"})
_SHARED_NAMES = _shared_names() | {"ordering"}
_VAST_NAMES = {"verified-only", "datacenter-only", "dlperf", "dlperf-min", "dlperf-max"}
_RUNPOD_NAMES = {"cloud-type", "datacenter-ids", "keep-gpu-type-priority"}
_LEGACY_MAP: dict[str, str] = {"region": SHARED + "region", "gpu-names": SHARED + "gpu-names",
                               "compute-cap": SHARED + "compute-cap",
                               "verified-only": VASTAI + "verified-only",
                               "datacenter-only": VASTAI + "datacenter-only"}
for _n in LEGACY_NUMERIC:
    for _suffix in ("", "-min", "-max"):
        _LEGACY_MAP[_n + _suffix] = SHARED + _n + _suffix
for _suffix in ("", "-min", "-max"):
    _LEGACY_MAP["vastai-dlperf" + _suffix] = VASTAI + "dlperf" + _suffix


def _canonical(annotations: Mapping[str, str], out: _Collector,
               conflicts: dict[str, AnnotationProblem]) -> dict[str, tuple[str, str]]:
    """Our annotations only, under current names: canonical name -> (value, annotation as written).

    The same filter set differently under the legacy and the current name goes to ``conflicts``
    (canonical name -> problem): it is an error unless the filter is ignored anyway (a
    ``-min``/``-max`` beside an exact value).
    """
    canon: dict[str, tuple[str, str]] = {}
    for key in sorted(annotations):
        value = annotations[key]
        prefix = next((p for p in OUR_PREFIXES if key.startswith(p)), None)
        if prefix is None:
            continue  # other prefixes are not ours: ignored
        name = key[len(prefix):]
        if prefix == LEGACY:
            target = _LEGACY_MAP.get(name)
            if target is None:
                out.add(key, f"unknown annotation; {LEGACY} accepts: {', '.join(sorted(_LEGACY_MAP))}")
                continue
        else:
            known = {SHARED: _SHARED_NAMES, VASTAI: _VAST_NAMES, RUNPOD: _RUNPOD_NAMES}[prefix]
            if prefix == SHARED and name in PROVISIONING_NAMES:
                continue  # the provisioning loop's, parsed there
            if name not in known:
                accepted = known | PROVISIONING_NAMES if prefix == SHARED else known
                out.add(key, f"unknown annotation; {prefix} accepts: {', '.join(sorted(accepted))}")
                continue
            target = key
        if not isinstance(value, str):
            out.add(key, "annotation values are strings")
            continue
        if target in canon and canon[target][0].strip() != value.strip():
            other = canon[target][1]
            conflicts.setdefault(target, AnnotationProblem(
                key, f"conflicts with {other}={canon[target][0]!r}: set the filter once (legacy and current "
                     f"names mean the same filter)"))
            continue
        canon.setdefault(target, (value, key))
    return canon


def _parse_list(raw: str) -> list[str]:
    return [item.strip() for item in raw.split(",") if item.strip()]


def _parse_bool(key: str, raw: str, out: _Collector) -> bool | None:
    value = BOOL_WORDS.get(raw.strip().lower())
    if value is None:
        out.add(key, f"{raw!r} is not a boolean; accepted: \"true\" or \"false\"")
    return value


def _parse_number(key: str, raw: str, spec: NumericSpec, out: _Collector) -> float | None:
    text = raw.strip()
    if spec.kind == "version":
        try:
            return float(versions.version_key(text))
        except ValueError as err:
            out.add(key, f"{err} (unit: {spec.unit})")
            return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value) or value < 0:
        if spec.kind == "int":
            out.add(key, f"{raw!r} is not a number; accepted: a non-negative whole number ({spec.unit}), e.g. \"2\"")
        else:
            out.add(key, f"{raw!r} is not a number; accepted: a non-negative number in {spec.unit}, e.g. \"1.5\"")
        return None
    if spec.kind == "int" and not text.isdigit():
        out.add(key, f"{raw!r} is not a whole number; accepted: a non-negative integer ({spec.unit})")
        return None
    return value


def _parse_range(prefix: str, spec: NumericSpec, canon: dict, out: _Collector,
                 ignored: list[tuple[str, str]]) -> Range | None:
    """The filter ``spec`` from its exact / ``-min`` / ``-max`` annotations.

    With an exact value the matching ``-min``/``-max`` are ignored entirely (docs: "If an exact
    value is set, the corresponding -min/-max are ignored"): not parsed, not compared, never an
    error; each lands in ``ignored`` as (annotation, why) for the explanation.
    """
    exact_entry = canon.get(f"{prefix}{spec.name}")
    if exact_entry is not None:
        raw, written = exact_entry
        for suffix in ("-min", "-max"):
            bound = canon.get(f"{prefix}{spec.name}{suffix}")
            if bound is not None:
                ignored.append((bound[1], f"{written} (an exact value) is set: the matching -min/-max are ignored"))
        exact = _parse_number(written, raw, spec, out)
        if exact is None:
            return None
        return Range(spec.name, spec.column, spec.unit, exact, None, None, (written,))
    parsed: dict[str, float | None] = {}
    sources: list[str] = []
    for suffix in ("-min", "-max"):
        entry = canon.get(f"{prefix}{spec.name}{suffix}")
        if entry is None:
            parsed[suffix] = None
            continue
        raw, written = entry
        sources.append(written)
        parsed[suffix] = _parse_number(written, raw, spec, out)
    if not sources or all(v is None for v in parsed.values()):
        return None
    lo, hi = parsed["-min"], parsed["-max"]
    if lo is not None and hi is not None and lo > hi:
        lo_name = canon[f"{prefix}{spec.name}-min"][1]
        hi_name = canon[f"{prefix}{spec.name}-max"][1]
        out.add(lo_name, f"minimum {canon[f'{prefix}{spec.name}-min'][0]!r} is greater than {hi_name}="
                         f"{canon[f'{prefix}{spec.name}-max'][0]!r}; accepted: -min <= -max")
        return None
    return Range(spec.name, spec.column, spec.unit, None, lo, hi, tuple(sources))


def _regions(raw: str, key: str, out: _Collector) -> tuple[str, ...] | None:
    names = [n.lower() for n in _parse_list(raw)]
    bad = [n for n in names if n not in REGION_NAMES]
    if not names or bad:
        out.add(key, f"unknown region {', '.join(map(repr, bad)) or repr(raw)}; accepted: a comma-separated list of "
                     f"{', '.join(REGION_NAMES)}")
        return None
    return tuple(dict.fromkeys(names))


def _gpu_names(raw: str, key: str, out: _Collector) -> tuple[str, ...] | None:
    names = _parse_list(raw)
    if not names:
        out.add(key, "empty list; accepted: comma-separated GPU names, e.g. \"RTX 4090,RTX 3090\"")
        return None
    return tuple(dict.fromkeys(names))


def _compute_caps(raw: str, key: str, out: _Collector) -> tuple[int, ...] | None:
    caps: list[int] = []
    for item in _parse_list(raw) or [raw]:
        try:
            caps.append(units.compute_cap_key(item))
        except ValueError as err:
            out.add(key, f"{err}; accepted: comma-separated capabilities, e.g. \"8.6,8.9\"")
            return None
    return tuple(dict.fromkeys(caps))


def _bool(raw: str, key: str, out: _Collector) -> bool | None:
    return _parse_bool(key, raw, out)


def _cloud_type(raw: str, key: str, out: _Collector) -> str | None:
    value = raw.strip().upper()
    if value not in CLOUD_TYPES:
        out.add(key, f"unknown cloud type {raw!r}; accepted: SECURE or COMMUNITY")
        return None
    return value


def _ordering(raw: str, key: str, out: _Collector) -> str | None:
    value = raw.strip().lower()
    if value not in ORDERINGS:
        out.add(key, f"unknown ordering {raw!r}; accepted: {' or '.join(ORDERINGS)}")
        return None
    return value


def _datacenter_ids(raw: str, key: str, out: _Collector) -> tuple[str, ...] | None:
    ids = _parse_list(raw)
    if not ids:
        out.add(key, "empty list; accepted: comma-separated RunPod data center ids in priority order, e.g. "
                     "\"EU-RO-1,US-CA-2\"")
        return None
    return tuple(dict.fromkeys(i.upper() for i in ids))


T = TypeVar("T")


@dataclass
class _Parse:
    """One parse: the canonical annotations, the problems found, and which annotations set which filter."""

    canon: dict[str, tuple[str, str]]
    out: _Collector
    sources: dict[str, tuple[str, ...]] = field(default_factory=dict)
    ignored: list[tuple[str, str]] = field(default_factory=list)

    def value(self, prefix: str, name: str, parse: Callable[[str, str, _Collector], T | None]) -> T | None:
        """The parsed value of annotation ``prefix + name`` (None when absent or bad: bad ones are collected)."""
        entry = self.canon.get(prefix + name)
        if entry is None:
            return None
        raw, key = entry
        value = parse(raw, key, self.out)
        if value is not None:
            self.sources[name] = (key,)
        return value

    def ranges(self) -> tuple[Range, ...]:
        """Every numeric filter that is set (shared ones, then Vast.AI's dlperf), in the documented order."""
        found = [_parse_range(prefix, spec, self.canon, self.out, self.ignored)
                 for prefix, spec in [*((SHARED, s) for s in SHARED_NUMERIC), (VASTAI, DLPERF)]]
        ranges = tuple(r for r in found if r is not None)
        self.sources.update((r.name, r.sources) for r in ranges)
        return ranges


def parse_annotations(annotations: Mapping[str, str]) -> Filters:
    """Parse pod annotations into :class:`Filters`; raise :class:`AnnotationError` on any problem."""
    out = _Collector()
    conflicts: dict[str, AnnotationProblem] = {}
    parse = _Parse(_canonical(annotations, out, conflicts), out)
    regions = parse.value(SHARED, "region", _regions)
    gpu_names = parse.value(SHARED, "gpu-names", _gpu_names)
    compute_caps = parse.value(SHARED, "compute-cap", _compute_caps)
    ranges = parse.ranges()
    ordering = parse.value(SHARED, "ordering", _ordering)
    verified_only = parse.value(VASTAI, "verified-only", _bool)
    datacenter_only = parse.value(VASTAI, "datacenter-only", _bool)
    if verified_only is None:
        parse.sources["verified-only"] = ("vastai.anex.sh/verified-only (default true)",)
    cloud_type = parse.value(RUNPOD, "cloud-type", _cloud_type)
    datacenter_ids = parse.value(RUNPOD, "datacenter-ids", _datacenter_ids)
    keep_gpu_type_priority = parse.value(RUNPOD, "keep-gpu-type-priority", _bool)
    for target, problem in conflicts.items():
        if not (target.endswith(("-min", "-max")) and target[:-4] in parse.canon):  # ignored beside an exact value
            out.add(problem.annotation, problem.message)
    if out.problems:
        raise AnnotationError(out.problems)
    return Filters(
        ranges=ranges,
        regions=regions,
        countries=countries_of(regions) if regions else None,
        gpu_names=gpu_names,
        compute_caps=compute_caps,
        verified_only=True if verified_only is None else verified_only,
        datacenter_only=bool(datacenter_only),
        cloud_type=cloud_type,
        datacenter_ids=datacenter_ids,
        keep_gpu_type_priority=bool(keep_gpu_type_priority),
        sources=tuple(parse.sources.items()),
        ignored=tuple(parse.ignored),
        ordering=ordering,
    )
