"""Table tests built from every example in the two reference documents.

001 (current Anex docs): allowed regions, gpu-names / compute-cap examples, the numeric
filter table (units), the Vast.AI and RunPod tables, the complete example pod.
000 (legacy gpu-provider.glami.cz docs): every row of every table has an example value;
each one is parsed and checked against offers just inside and just outside the bound,
plus the complete example pod.
"""

from __future__ import annotations

import pytest

from anex_agent.selection.annotations import parse_annotations
from anex_agent.selection.filters import apply_filters
from anex_agent.selection.versions import version_key
from tests.selection.helpers import offer, table

L = "gpu-provider.glami.cz/"


def matching_ids(annotations: dict, *offers) -> set[str]:
    t = table(*offers)
    return {t.offers[i].offer_id for i in apply_filters(t, parse_annotations(annotations)).rows}


# (annotation, value, column, values that must pass, values that must fail) -- legacy doc, every numeric row.
LEGACY_NUMERIC_EXAMPLES = [
    ("gpu-count", "2", "gpu_count", [2], [1, 3]),
    ("gpu-count-min", "1", "gpu_count", [1, 8], [0]),
    ("gpu-count-max", "4", "gpu_count", [1, 4], [5]),
    ("vram", "24576", "vram_mb", [24576], [24575, 24577]),
    ("vram-min", "16384", "vram_mb", [16384, 81920], [16383]),
    ("vram-max", "49152", "vram_mb", [49152, 8192], [49153]),
    ("vram-total", "49152", "vram_total_mb", [49152], [49151]),
    ("vram-total-min", "32768", "vram_total_mb", [32768], [32767]),
    ("vram-total-max", "98304", "vram_total_mb", [98304], [98305]),
    ("vram-bandwidth", "900.0", "vram_bw_gbps", [900.0], [899.9]),
    ("vram-bandwidth-min", "500.0", "vram_bw_gbps", [500.0, 3352.0], [499.9]),
    ("vram-bandwidth-max", "1000.0", "vram_bw_gbps", [1000.0], [1000.1]),
    ("tflops", "82.0", "tflops", [82.0], [82.6]),
    ("tflops-min", "50.0", "tflops", [50.0], [49.9]),
    ("tflops-max", "100.0", "tflops", [100.0], [100.5]),
    ("cpu", "8", "cpu_cores", [8], [16]),
    ("cpu-min", "4", "cpu_cores", [4, 64], [2]),
    ("cpu-max", "16", "cpu_cores", [16], [32]),
    ("ram", "32768", "ram_mb", [32768], [65536]),
    ("ram-min", "16384", "ram_mb", [16384], [8192]),
    ("ram-max", "65536", "ram_mb", [65536], [131072]),
    ("price", "0.50", "price", [0.5], [0.51]),
    ("price-min", "0.10", "price", [0.1, 3.0], [0.09]),
    ("price-max", "1.00", "price", [1.0, 0.2], [1.01]),
    ("upload-speed", "1000", "upload_mbps", [1000], [999]),
    ("upload-speed-min", "500", "upload_mbps", [500], [499]),
    ("upload-speed-max", "10000", "upload_mbps", [10000], [10001]),
    ("download-speed", "1000", "download_mbps", [1000], [1001]),
    ("download-speed-min", "500", "download_mbps", [500], [499]),
    ("download-speed-max", "10000", "download_mbps", [10000], [10001]),
    ("vastai-dlperf", "100.0", "dlperf", [100.0], [100.1]),
    ("vastai-dlperf-min", "50.0", "dlperf", [50.0], [49.9]),
    ("vastai-dlperf-max", "150.0", "dlperf", [150.0], [150.1]),
]


@pytest.mark.parametrize("name,value,column,good,bad", LEGACY_NUMERIC_EXAMPLES)
@pytest.mark.parametrize("prefix", [L, "anex.sh/"])
def test_numeric_examples_inclusive_bounds(prefix, name, value, column, good, bad):
    if prefix == "anex.sh/" and name.startswith("vastai-dlperf"):
        prefix, name = "vastai.anex.sh/", name.replace("vastai-", "")
    offers = [offer(offer_id=f"g{i}", **{column: float(v)}) for i, v in enumerate(good)]
    offers += [offer(offer_id=f"b{i}", **{column: float(v)}) for i, v in enumerate(bad)]
    assert matching_ids({prefix + name: value}, *offers) == {f"g{i}" for i in range(len(good))}


@pytest.mark.parametrize("annotation,value,good,bad", [
    ("cuda", "12.1", ["12.1", "12.1.0"], ["12.0", "12.10", "12.2"]),
    ("cuda-min", "11.8", ["11.8", "12.0", "12.10"], ["11.7", "10.2"]),
    ("cuda-max", "12.4", ["12.4", "11.8", "12.3"], ["12.5", "12.10"]),
])
@pytest.mark.parametrize("prefix", [L, "anex.sh/"])
def test_cuda_examples_compare_as_versions(prefix, annotation, value, good, bad):
    offers = [offer(offer_id=f"g{v}", cuda=float(version_key(v))) for v in good]
    offers += [offer(offer_id=f"b{v}", cuda=float(version_key(v))) for v in bad]
    assert matching_ids({prefix + annotation: value}, *offers) == {f"g{v}" for v in good}


def test_cuda_12_10_is_newer_than_12_9():
    offers = [offer(offer_id="12.9", cuda=float(version_key("12.9"))),
              offer(offer_id="12.10", cuda=float(version_key("12.10")))]
    assert matching_ids({"anex.sh/cuda-min": "12.10"}, *offers) == {"12.10"}
    assert matching_ids({"anex.sh/cuda-max": "12.9"}, *offers) == {"12.9"}


@pytest.mark.parametrize("prefix", [L, "anex.sh/"])
def test_gpu_names_example_is_an_or_list(prefix):
    offers = [offer(offer_id="4090", gpu_name="RTX 4090"), offer(offer_id="3090", gpu_name="RTX 3090"),
              offer(offer_id="3080", gpu_name="RTX 3080"), offer(offer_id="nvml", gpu_name="NVIDIA GeForce RTX 4090")]
    assert matching_ids({prefix + "gpu-names": "RTX 4090,RTX 3090"}, *offers) == {"4090", "3090", "nvml"}


@pytest.mark.parametrize("prefix", [L, "anex.sh/"])
def test_compute_cap_example_is_an_or_list(prefix):
    offers = [offer(offer_id="86", compute_cap=860.0), offer(offer_id="89", compute_cap=890.0),
              offer(offer_id="80", compute_cap=800.0), offer(offer_id="90", compute_cap=900.0)]
    assert matching_ids({prefix + "compute-cap": "8.6,8.9"}, *offers) == {"86", "89"}


@pytest.mark.parametrize("region,inside,outside", [
    ("europe", ["DE", "CZ", "GB", "CY", "TR", "XK", "UA"], ["US", "JP", "RU"]),
    ("north-america", ["US", "CA", "MX", "PR"], ["BR", "DE"]),
    ("asia-pacific", ["JP", "SG", "IN", "KR", "RU", "IL"], ["AU", "DE", "TR"]),
    ("africa", ["ZA", "NG", "EG"], ["ES"]),
    ("south-america", ["BR", "AR", "CL"], ["MX"]),
    ("oceania", ["AU", "NZ", "FJ"], ["JP"]),
])
def test_each_allowed_region(region, inside, outside):
    offers = [offer(offer_id=c, country=c) for c in inside + outside]
    assert matching_ids({"anex.sh/region": region}, *offers) == set(inside)


def test_legacy_region_example_two_regions():
    offers = [offer(offer_id=c, country=c) for c in ("DE", "US", "JP", None)]
    assert matching_ids({L + "region": "europe,north-america"}, *offers) == {"DE", "US"}


@pytest.mark.parametrize("annotation", [L + "verified-only", "vastai.anex.sh/verified-only"])
def test_verified_only_example(annotation):
    offers = [offer(offer_id="v", verified=True), offer(offer_id="u", verified=False),
              offer(offer_id="rp", provider="runpod", verified=None)]
    assert matching_ids({annotation: "true"}, *offers) == {"v", "rp"}


def test_verified_only_defaults_to_true_and_false_allows_unverified():
    offers = [offer(offer_id="v", verified=True), offer(offer_id="u", verified=False)]
    assert matching_ids({}, *offers) == {"v"}
    assert matching_ids({"vastai.anex.sh/verified-only": "false"}, *offers) == {"v", "u"}


@pytest.mark.parametrize("annotation", [L + "datacenter-only", "vastai.anex.sh/datacenter-only"])
def test_datacenter_only_example(annotation):
    offers = [offer(offer_id="dc", datacenter=True), offer(offer_id="home", datacenter=False),
              offer(offer_id="op", provider="onprem", datacenter=None)]
    assert matching_ids({annotation: "true"}, *offers) == {"dc", "op"}


def test_runpod_examples_cloud_type_and_datacenter_ids():
    offers = [offer(offer_id="s-ro", provider="runpod", cloud_type="SECURE", datacenter_id="EU-RO-1"),
              offer(offer_id="c-ro", provider="runpod", cloud_type="COMMUNITY", datacenter_id="EU-RO-1"),
              offer(offer_id="s-ca", provider="runpod", cloud_type="SECURE", datacenter_id="US-CA-2"),
              offer(offer_id="s-ks", provider="runpod", cloud_type="SECURE", datacenter_id="US-KS-2"),
              offer(offer_id="vast")]
    assert matching_ids({"runpod.anex.sh/cloud-type": "SECURE"}, *offers) == {"s-ro", "s-ca", "s-ks", "vast"}
    assert matching_ids({"runpod.anex.sh/cloud-type": "COMMUNITY"}, *offers) == {"c-ro", "vast"}
    assert matching_ids({"runpod.anex.sh/datacenter-ids": "EU-RO-1,US-CA-2"}, *offers) == {"s-ro", "c-ro", "s-ca",
                                                                                           "vast"}


def test_disk_space_and_disk_bw_units():
    offers = [offer(offer_id="big", disk_gb=200.0, disk_bw_mbps=3000.0), offer(offer_id="small", disk_gb=20.0,
                                                                                   disk_bw_mbps=3000.0),
              offer(offer_id="slow", disk_gb=200.0, disk_bw_mbps=100.0)]
    assert matching_ids({"anex.sh/disk-space-gb-min": "50", "anex.sh/disk-bw-min": "500"}, *offers) == {"big"}


CURRENT_EXAMPLE_POD = {
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
LEGACY_EXAMPLE_POD = {
    L + "verified-only": "true",
    L + "datacenter-only": "true",
    L + "region": "europe",
    L + "gpu-names": "RTX 4090,RTX 3090",
    L + "gpu-count": "2",
    L + "vram-min": "20480",
    L + "cpu-min": "8",
    L + "ram-min": "32768",
    L + "price-max": "1.50",
    L + "download-speed-min": "1000",
}
# one offer per requirement of the example pod, each breaking exactly that requirement
EXAMPLE_POD_OFFERS = [
    offer(offer_id="ok-4090"),
    offer(offer_id="ok-3090", gpu_name="RTX 3090", compute_cap=860.0, price=0.9),
    offer(offer_id="us", country="US"),
    offer(offer_id="a100", gpu_name="A100 SXM4"),
    offer(offer_id="one-gpu", gpu_count=1.0),
    offer(offer_id="four-gpus", gpu_count=4.0),
    offer(offer_id="16gb", vram_mb=16384.0),
    offer(offer_id="4-cpus", cpu_cores=4.0),
    offer(offer_id="16gb-ram", ram_mb=16384.0),
    offer(offer_id="pricey", price=1.51),
    offer(offer_id="slow-net", download_mbps=999.0),
    offer(offer_id="unverified", verified=False),
    offer(offer_id="consumer", datacenter=False),
    offer(offer_id="exactly-at-bounds", vram_mb=20480.0, cpu_cores=8.0, ram_mb=32768.0, price=1.5,
          download_mbps=1000.0),
]


@pytest.mark.parametrize("pod", [CURRENT_EXAMPLE_POD, LEGACY_EXAMPLE_POD], ids=["current", "legacy"])
def test_complete_example_pod(pod):
    assert matching_ids(pod, *EXAMPLE_POD_OFFERS) == {"ok-4090", "ok-3090", "exactly-at-bounds"}


def test_both_example_pods_parse_to_the_same_filters():
    current, legacy = parse_annotations(CURRENT_EXAMPLE_POD), parse_annotations(LEGACY_EXAMPLE_POD)
    assert current.ranges == tuple(r.__class__(**{**r.__dict__, "sources": c.sources})
                                   for r, c in zip(legacy.ranges, current.ranges))
    assert (current.countries, current.gpu_names, current.verified_only, current.datacenter_only) == \
           (legacy.countries, legacy.gpu_names, legacy.verified_only, legacy.datacenter_only)


def test_example_pod_spec_annotations_of_other_prefixes_are_ignored():
    pod = {**CURRENT_EXAMPLE_POD, "kubectl.kubernetes.io/last-applied-configuration": "{}",
           "virtual-kubelet.io/provider": "vastai", "example.com/gpu-count": "nonsense"}
    assert matching_ids(pod, *EXAMPLE_POD_OFFERS) == {"ok-4090", "ok-3090", "exactly-at-bounds"}
