"""Annotation parsing: errors name the annotation and say what is accepted; semantics."""

from __future__ import annotations

import pytest

from anex_agent.errors import ConfigError
from anex_agent.selection.annotations import AnnotationError, parse_annotations


def problems(annotations: dict) -> list[tuple[str, str]]:
    with pytest.raises(AnnotationError) as info:
        parse_annotations(annotations)
    assert isinstance(info.value, ConfigError)
    return [(p.annotation, p.message) for p in info.value.problems]


@pytest.mark.parametrize("key", ["anex.sh/gpu-cnt", "vastai.anex.sh/verified", "runpod.anex.sh/region",
                                 "gpu-provider.glami.cz/disk-bw", "anex.sh/vastai-dlperf"])
def test_unknown_key_under_our_prefix(key):
    [(name, message)] = problems({key: "1"})
    assert name == key
    assert "unknown annotation" in message and "accepts:" in message


def test_unknown_key_lists_what_is_accepted():
    [(_, message)] = problems({"runpod.anex.sh/cloud": "SECURE"})
    assert "cloud-type" in message and "datacenter-ids" in message and "keep-gpu-type-priority" in message


@pytest.mark.parametrize("key,value,expect", [
    ("anex.sh/gpu-count", "two", "non-negative"),
    ("anex.sh/gpu-count", "2.5", "whole number"),
    ("anex.sh/cpu-min", "-1", "non-negative"),
    ("anex.sh/price-max", "1,50", "USD/hour"),
    ("anex.sh/vram-min", "20GB", "MB"),
    ("anex.sh/price", "nan", "USD/hour"),
    ("anex.sh/tflops", "inf", "TFLOPS"),
    ("anex.sh/cuda-min", "12.x", "MAJOR[.MINOR[.PATCH]]"),
    ("anex.sh/compute-cap", "8.6,eight", "MAJOR.MINOR"),
    ("vastai.anex.sh/verified-only", "yes please", "\"true\" or \"false\""),
    ("runpod.anex.sh/keep-gpu-type-priority", "1", "\"true\" or \"false\""),
    ("anex.sh/gpu-names", " , ", "comma-separated GPU names"),
    ("runpod.anex.sh/datacenter-ids", "", "priority order"),
])
def test_unparsable_values(key, value, expect):
    [(name, message)] = problems({key: value})
    assert name == key and expect in message


def test_unknown_region_says_which_and_lists_all():
    [(name, message)] = problems({"anex.sh/region": "europe,mars"})
    assert name == "anex.sh/region" and "'mars'" in message
    for region in ("europe", "north-america", "asia-pacific", "africa", "south-america", "oceania"):
        assert region in message


def test_unknown_cloud_type():
    [(name, message)] = problems({"runpod.anex.sh/cloud-type": "SPOT"})
    assert name == "runpod.anex.sh/cloud-type" and "SECURE or COMMUNITY" in message


def test_cloud_type_case_insensitive():
    assert parse_annotations({"runpod.anex.sh/cloud-type": "secure"}).cloud_type == "SECURE"


def test_min_greater_than_max():
    [(name, message)] = problems({"anex.sh/vram-min": "49152", "anex.sh/vram-max": "16384"})
    assert name == "anex.sh/vram-min" and "anex.sh/vram-max" in message and "-min <= -max" in message


def test_min_greater_than_max_is_ignored_when_exact_is_set():
    f = parse_annotations({"anex.sh/gpu-count": "2", "anex.sh/gpu-count-min": "8", "anex.sh/gpu-count-max": "1"})
    r = f.range("gpu-count")
    assert (r.exact, r.lo, r.hi, r.bounds) == (2.0, None, None, (2.0, 2.0))
    assert r.sources == ("anex.sh/gpu-count",)


def test_all_problems_reported_together():
    found = problems({"anex.sh/gpu-count": "x", "anex.sh/region": "moon", "anex.sh/nope": "1",
                      "other.io/whatever": "ignored"})
    assert {name for name, _ in found} == {"anex.sh/gpu-count", "anex.sh/region", "anex.sh/nope"}


def test_other_prefixes_ignored():
    f = parse_annotations({"example.com/gpu-count": "x", "sh/region": "moon", "anex.shx/y": "1",
                           "notanex.sh/region": "moon"})
    assert f.ranges == () and f.regions is None


def test_legacy_and_current_conflict_is_an_error_same_value_is_fine():
    assert parse_annotations({"anex.sh/gpu-count": "2", "gpu-provider.glami.cz/gpu-count": "2"}).range(
        "gpu-count").exact == 2
    [(name, message)] = problems({"anex.sh/gpu-count": "2", "gpu-provider.glami.cz/gpu-count": "4"})
    assert "conflicts" in message and name in ("anex.sh/gpu-count", "gpu-provider.glami.cz/gpu-count")


def test_legacy_vast_names_map_to_vast_filters():
    f = parse_annotations({"gpu-provider.glami.cz/verified-only": "false",
                           "gpu-provider.glami.cz/datacenter-only": "true",
                           "gpu-provider.glami.cz/vastai-dlperf-min": "50.0"})
    assert (f.verified_only, f.datacenter_only, f.range("dlperf").lo) == (False, True, 50.0)
    assert f.range("dlperf").sources == ("gpu-provider.glami.cz/vastai-dlperf-min",)


def test_defaults():
    f = parse_annotations({})
    assert (f.verified_only, f.datacenter_only, f.cloud_type, f.keep_gpu_type_priority) == (True, False, None, False)


def test_runpod_fields_and_priority_order_kept():
    f = parse_annotations({"runpod.anex.sh/datacenter-ids": "US-CA-2, EU-RO-1,US-CA-2",
                           "runpod.anex.sh/keep-gpu-type-priority": "TRUE",
                           "anex.sh/gpu-names": "RTX 3090, RTX 4090"})
    assert f.datacenter_ids == ("US-CA-2", "EU-RO-1")
    assert f.keep_gpu_type_priority is True
    assert f.gpu_names == ("RTX 3090", "RTX 4090")


def test_disk_space_is_also_the_allocation():
    assert parse_annotations({"anex.sh/disk-space-gb": "50"}).disk_to_allocate_gb == 50
    assert parse_annotations({"anex.sh/disk-space-gb-min": "80"}).disk_to_allocate_gb == 80
    assert parse_annotations({}).disk_to_allocate_gb is None


def test_filters_are_frozen():
    f = parse_annotations({"anex.sh/gpu-count": "2"})
    with pytest.raises(Exception):
        f.verified_only = False  # type: ignore[misc]


@pytest.mark.parametrize("bounds", [
    {"anex.sh/gpu-count-min": "lots"},
    {"anex.sh/gpu-count-max": "-3"},
    {"anex.sh/gpu-count-min": "8", "anex.sh/gpu-count-max": "1"},
    {"anex.sh/gpu-count-min": "2.5", "anex.sh/gpu-count-max": "x"},
])
def test_bounds_beside_an_exact_value_are_ignored_entirely(bounds):
    """Docs: with an exact value the matching -min/-max are ignored -- even when they would not parse."""
    f = parse_annotations({"anex.sh/gpu-count": "2", **bounds})
    r = f.range("gpu-count")
    assert (r.exact, r.lo, r.hi, r.sources) == (2.0, None, None, ("anex.sh/gpu-count",))
    assert {name for name, _ in f.ignored} == set(bounds)
    assert all("anex.sh/gpu-count (an exact value) is set" in why for _, why in f.ignored)


def test_legacy_conflict_on_an_ignored_bound_is_no_error():
    f = parse_annotations({"anex.sh/vram": "24576", "anex.sh/vram-min": "1", "gpu-provider.glami.cz/vram-min": "2"})
    assert f.range("vram").exact == 24576 and {n for n, _ in f.ignored} >= {"anex.sh/vram-min"}
    [(name, message)] = problems({"anex.sh/vram-min": "1", "gpu-provider.glami.cz/vram-min": "2"})
    assert "conflicts" in message


def test_a_bad_exact_value_is_still_an_error_and_its_bounds_are_not_reported():
    [(name, message)] = problems({"anex.sh/gpu-count": "two", "anex.sh/gpu-count-min": "x"})
    assert name == "anex.sh/gpu-count" and "non-negative" in message


def test_nothing_ignored_without_an_exact_value():
    assert parse_annotations({"anex.sh/gpu-count-min": "1", "anex.sh/gpu-count-max": "4"}).ignored == ()


def test_ordering_annotation():
    assert parse_annotations({}).ordering is None
    assert parse_annotations({"anex.sh/ordering": " Prefer-OnPrem "}).ordering == "prefer-onprem"
    [(name, message)] = problems({"anex.sh/ordering": "fastest"})
    assert name == "anex.sh/ordering" and "price or prefer-onprem" in message
