"""Benchmark: filter and rank 1,000 / 10,000 / 100,000 synthetic offers with the reference
example pod's annotations (Anex docs "Example Pod"). Prints one JSON document.

Ours: the column-wise path (OfferTable built once per provider fetch, as the sources do;
then apply_filters + rank, which is what every selection pays). Reference, side by side in
the same run: a plain row-wise implementation (every predicate on every Offer object, then
sort), the straightforward design we compared against. Both must return the same ranking;
the benchmark checks that. Time per offer at each size shows the growth.
"""

from __future__ import annotations

import json
import math
import platform
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.selection.annotations import parse_annotations  # noqa: E402
from anex_agent.selection.filters import apply_filters  # noqa: E402
from anex_agent.selection.offers import Offer, OfferTable, normalize_gpu_name  # noqa: E402
from anex_agent.selection.rank import rank  # noqa: E402

EXAMPLE_POD = {
    "anex.sh/region": "europe",
    "anex.sh/gpu-names": "RTX 4090,RTX 3090",
    "anex.sh/gpu-count": "2",
    "anex.sh/vram-min": "20480",
    "anex.sh/cpu-min": "8",
    "anex.sh/ram-min": "32768",
    "anex.sh/price-max": "1.50",
    "anex.sh/download-speed-min": "1000",
    "vastai.anex.sh/verified-only": "true",
    "vastai.anex.sh/datacenter-only": "true",
}
GPUS = [("RTX 4090", 24576, 890), ("RTX 3090", 24576, 860), ("RTX 3080", 10240, 860), ("A100 SXM4", 81920, 800),
        ("H100 SXM", 81920, 900), ("RTX A6000", 49152, 860), ("Tesla V100", 16384, 700), ("RTX 4080", 16384, 890)]
COUNTRIES = ["US", "US", "DE", "CZ", "SE", "GB", "FR", "CA", "JP", "KR", "BR", "AU", "PL", "NL", "IN", "ZA"]


def synthetic(n: int, seed: int = 7) -> list[Offer]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        name, vram, cap = rng.choice(GPUS)
        count = rng.choice((1, 1, 2, 2, 4, 8))
        provider = rng.choice(("vastai", "vastai", "vastai", "runpod", "onprem"))
        out.append(Offer(
            provider=provider, offer_id=str(1_000_000 + i), machine_id=str(rng.randrange(n // 2 + 1)),
            gpu_name=name, gpu_count=float(count), vram_mb=float(vram), vram_total_mb=float(vram * count),
            compute_cap=float(cap), cpu_cores=float(rng.choice((4, 8, 16, 32, 64))),
            ram_mb=float(rng.choice((16384, 32768, 65536, 131072))), price=round(rng.uniform(0.1, 4.0) * count / 2, 4),
            download_mbps=float(rng.choice((100, 500, 1000, 2500, 10000))),
            upload_mbps=float(rng.choice((100, 500, 1000))),
            verified=rng.random() < 0.7 if provider == "vastai" else None,
            datacenter=rng.random() < 0.4 if provider == "vastai" else None,
            country=rng.choice(COUNTRIES),
        ))
    return out


def reference(offers: list[Offer], filters) -> list[str]:
    """Row-wise: each Offer object checked against each active filter, then sorted."""
    names = set(filters.gpu_keys)
    ranges = [(r.column, *r.bounds) for r in filters.ranges]
    order = {"onprem": 0, "vastai": 1, "runpod": 2}
    kept = []
    for o in offers:
        if o.provider == "vastai" and (filters.verified_only and o.verified is not True
                                       or filters.datacenter_only and o.datacenter is not True):
            continue
        if o.country not in filters.countries or normalize_gpu_name(o.gpu_name) not in names:
            continue
        if all(lo <= getattr(o, column) <= hi for column, lo, hi in ranges):
            kept.append(o)
    kept.sort(key=lambda o: (o.price if o.price == o.price else math.inf, order[o.provider], o.offer_id,
                             o.machine_id or ""))
    return [o.offer_id for o in kept]


def timed(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    filters = parse_annotations(EXAMPLE_POD)
    sizes = []
    for n in (1_000, 10_000, 100_000):
        offers = synthetic(n)
        repeat = 15 if n < 100_000 else 11
        build_s, table = timed(lambda: OfferTable(offers), 3 if n == 100_000 else 5)

        def ours():
            result = apply_filters(table, filters)
            return [table.col["offer_id"][i] for i in rank(table, result.rows, filters)]

        ours_s, ours_ids = timed(ours, repeat)
        ref_s, ref_ids = timed(lambda: reference(offers, filters), repeat)
        if ours_ids != ref_ids:
            raise SystemExit(f"ranking differs from the reference at n={n}")
        sizes.append({
            "offers": n, "matched": len(ours_ids),
            "ours_filter_rank_ms": round(ours_s * 1e3, 3),
            "ours_ns_per_offer": round(ours_s * 1e9 / n, 1),
            "reference_rowwise_ms": round(ref_s * 1e3, 3),
            "reference_ns_per_offer": round(ref_s * 1e9 / n, 1),
            "speedup": round(ref_s / ours_s, 2),
            "table_build_ms": round(build_s * 1e3, 3),
        })
    big = sizes[-1]
    print(json.dumps({
        "benchmark": "selection filter+rank, reference example pod annotations",
        "python": platform.python_version(), "machine": platform.machine(),
        "goal": "under 50 ms at 100,000 offers, linear or better growth",
        "goal_met": big["ours_filter_rank_ms"] < 50.0,
        "growth_ns_per_offer_1k_to_100k": [s["ours_ns_per_offer"] for s in sizes],
        "sizes": sizes,
        "notes": "median of repeats; table_build_ms is paid once per provider fetch (cached), not per selection",
    }, indent=2))


if __name__ == "__main__":
    main()
