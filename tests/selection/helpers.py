"""Offer builders shared by the selection tests."""

from __future__ import annotations

from anex_agent.selection.offers import Offer, OfferTable

# A Vast.AI offer that satisfies the reference example pod (both docs).
GOOD = dict(provider="vastai", offer_id="1", machine_id="m1", gpu_name="RTX 4090", gpu_count=2.0, vram_mb=24576.0,
            vram_total_mb=49152.0, vram_bw_gbps=1008.0, tflops=82.6, compute_cap=890.0, cuda=12004000.0,
            cpu_cores=16.0, ram_mb=65536.0, price=1.2, upload_mbps=1000.0, download_mbps=2000.0, disk_gb=200.0,
            disk_bw_mbps=3000.0, dlperf=100.0, verified=True, datacenter=True, country="DE")


def offer(**changes) -> Offer:
    return Offer(**{**GOOD, **changes})


def table(*offers: Offer) -> OfferTable:
    return OfferTable(list(offers))
