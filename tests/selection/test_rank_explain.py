"""Ranking tie-breaks, RunPod priorities, explanations and bans in filtering."""

from __future__ import annotations

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.service import choose
from tests.selection.helpers import offer, table


def ids(selection) -> list[str]:
    return [c["offer_id"] for c in selection.candidates]


def test_price_ascending_then_onprem_vastai_runpod_then_offer_id():
    t = table(offer(offer_id="b", price=1.0), offer(offer_id="a", price=1.0),
              offer(offer_id="rp", provider="runpod", price=1.0), offer(offer_id="op", provider="onprem", price=1.0),
              offer(offer_id="cheap", provider="runpod", price=0.3), offer(offer_id="nan", price=float("nan")))
    assert ids(choose(t, parse_annotations({}))) == ["cheap", "op", "a", "b", "rp", "nan"]


def test_cheaper_onprem_node_wins():
    t = table(offer(offer_id="vast", price=0.9), offer(offer_id="node-1", provider="onprem", price=0.4))
    assert ids(choose(t, parse_annotations({"anex.sh/gpu-names": "RTX 4090"})))[0] == "node-1"


def test_limit():
    t = table(*[offer(offer_id=f"o{i}", price=float(i)) for i in range(20)])
    s = choose(t, parse_annotations({}), limit=3)
    assert ids(s) == ["o0", "o1", "o2"]
    assert (s.explanation["matched"], s.explanation["returned"]) == (20, 3)


def test_keep_gpu_type_priority_orders_runpod_among_themselves():
    t = table(offer(offer_id="rp-4090", provider="runpod", gpu_name="RTX 4090", price=0.7),
              offer(offer_id="rp-3090", provider="runpod", gpu_name="RTX 3090", price=0.4),
              offer(offer_id="vast", price=0.5))
    plain = {"anex.sh/gpu-names": "RTX 4090,RTX 3090"}
    assert ids(choose(t, parse_annotations(plain))) == ["rp-3090", "vast", "rp-4090"]
    kept = {**plain, "runpod.anex.sh/keep-gpu-type-priority": "true"}
    # RunPod slots (positions 0 and 2) are refilled in gpu-names order; the Vast.AI offer keeps its place
    assert ids(choose(t, parse_annotations(kept))) == ["rp-4090", "vast", "rp-3090"]


def test_datacenter_ids_are_priority_ordered():
    t = table(offer(offer_id="ca", provider="runpod", datacenter_id="US-CA-2", price=0.4),
              offer(offer_id="ro", provider="runpod", datacenter_id="EU-RO-1", price=0.6),
              offer(offer_id="ks", provider="runpod", datacenter_id="US-KS-2", price=0.1))
    s = choose(t, parse_annotations({"runpod.anex.sh/datacenter-ids": "EU-RO-1,US-CA-2"}))
    assert ids(s) == ["ro", "ca"]


def test_explanation_counts_each_filter():
    t = table(offer(offer_id="ok"), offer(offer_id="us", country="US"), offer(offer_id="us2", country="US"),
              offer(offer_id="a100", gpu_name="A100"), offer(offer_id="unverified", verified=False))
    s = choose(t, parse_annotations({"anex.sh/region": "europe", "anex.sh/gpu-names": "RTX 4090"}))
    steps = {f["filter"]: (f["removed"], f["remaining"]) for f in s.explanation["filters"]}
    assert steps == {"region": (2, 3), "gpu-names": (1, 2), "verified-only": (1, 1)}
    assert [f["filter"] for f in s.explanation["filters"]] == ["region", "gpu-names", "verified-only"]
    assert s.explanation["offers_considered"] == 5 and ids(s) == ["ok"]
    assert "emptied_by" not in s.explanation
    assert s.explanation["filters"][0]["annotations"] == ["anex.sh/region"]


def test_explanation_when_nothing_is_left():
    t = table(offer(offer_id="a", price=2.0), offer(offer_id="b", price=3.0, country="US"))
    s = choose(t, parse_annotations({"anex.sh/price-max": "1.50", "anex.sh/region": "europe"}))
    assert s.candidates == []
    assert s.explanation["emptied_by"] == "price"
    # dropping the price filter alone would let "a" through; "b" fails two filters
    assert s.explanation["blocking"] == [{"filter": "price", "would_match_without": 1}]


def test_explanation_with_no_offers_at_all():
    s = choose(table(), parse_annotations({"anex.sh/gpu-count": "2"}))
    assert s.candidates == [] and s.explanation["emptied_by"] == "no offers from any provider"


def test_bans_skip_vast_machines_only():
    t = table(offer(offer_id="1", machine_id="m1"), offer(offer_id="2", machine_id="m2"),
              offer(offer_id="3", provider="runpod", machine_id="m1"))
    s = choose(t, parse_annotations({}), banned=frozenset({"m1"}))
    assert ids(s) == ["2", "3"]
    assert s.explanation["filters"][-1] == {"filter": "banned", "annotations": ["machine bans (Vast.AI)"],
                                           "removed": 1, "remaining": 2}


def test_candidate_reports_matched_specs_in_annotation_units():
    t = table(offer(offer_id="1", cuda=12010000.0, compute_cap=890.0))
    s = choose(t, parse_annotations({"anex.sh/cuda-min": "12.9", "anex.sh/compute-cap": "8.9",
                                     "anex.sh/vram-min": "20480", "anex.sh/disk-space-gb": "100"}))
    [c] = s.candidates
    assert c["matched"]["cuda"] == "12.10" and c["matched"]["compute-cap"] == "8.9"
    assert c["matched"]["vram"] == 24576 and c["matched"]["verified-only"] is True
    assert c["disk_to_allocate_gb"] == 100 and c["machine_id"] == "m1" and c["price_per_hour"] == 1.2


def test_unknown_values_never_match():
    t = table(offer(offer_id="unknown", download_mbps=float("nan")), offer(offer_id="known"))
    assert ids(choose(t, parse_annotations({"anex.sh/download-speed-max": "100000"}))) == ["known"]


def test_explanation_lists_the_bounds_ignored_beside_an_exact_value():
    from anex_agent.selection.annotations import parse_annotations
    from anex_agent.selection.service import choose
    from tests.selection.helpers import offer, table

    filters = parse_annotations({"anex.sh/gpu-count": "2", "anex.sh/gpu-count-min": "not-a-number"})
    selection = choose(table(offer(offer_id="a", gpu_count=2.0), offer(offer_id="b", gpu_count=3.0)), filters)
    assert [c["offer_id"] for c in selection.candidates] == ["a"]
    [ignored] = selection.explanation["ignored"]
    assert ignored["annotation"] == "anex.sh/gpu-count-min" and "ignored" in ignored["because"]
