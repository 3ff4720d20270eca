"""Telemetry blocks shaped into /stats/summary and /metrics/resource."""

from datetime import datetime, timezone

from anex_agent.virtualnode.kubelet import statshape

GIB = 1024 ** 3


def block(taken_at, util=50.0, cpus=8, total=64 * GIB, available=48 * GIB, gpus=True):
    out = {"v": 1, "taken_at": taken_at,
           "host": {"cpu_count": cpus, "cpu_util_pct": util, "mem_total_bytes": total, "mem_available_bytes": available,
                    "net": {"rx_bytes": 1000, "tx_bytes": 2000}}}
    if gpus:
        out["inventory"] = {"gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": "GPU-1"}]}
        out["gpus"] = [{"index": 0, "uuid": "GPU-1", "gpu_util_pct": 87.0, "fb_total_mib": 81559.0,
                        "fb_used_mib": 1024.0}]
    return out


def sample(telemetry, name="train", node_id="n1"):
    return statshape.PodSample(namespace="ml", name=name, uid=f"uid-{name}", containers=("training",),
                               start_time="2026-11-27T10:00:00Z", node_id=node_id, telemetry=telemetry)


def test_cpu_time_is_integrated_from_the_rates_and_never_goes_back():
    counters = statshape.CpuCounters()
    assert counters.update("n1", 100.0, 4e9) == 0
    assert counters.update("n1", 110.0, 2e9) == 30e9  # 10 s at a mean of 3 cores
    assert counters.update("n1", 105.0, 8e9) == 30e9  # an older sample changes nothing
    assert counters.update("n1", 110.0, 8e9) == 30e9


def test_summary_has_the_kubelets_shape():
    counters = statshape.CpuCounters()
    statshape.summary("anex-vastai", "2026-11-27T09:00:00Z", [sample(block(1000.0))], counters, 1001.0)
    doc = statshape.summary("anex-vastai", "2026-11-27T09:00:00Z", [sample(block(1010.0, util=50.0))], counters,
                            1011.0)
    (pod,) = doc["pods"]
    assert pod["podRef"] == {"name": "train", "namespace": "ml", "uid": "uid-train"}
    (container,) = pod["containers"]
    assert container["name"] == "training"
    assert container["cpu"]["usageNanoCores"] == 4_000_000_000  # 50 % of 8 cores
    assert container["cpu"]["usageCoreNanoSeconds"] == 40_000_000_000
    assert container["memory"]["workingSetBytes"] == 16 * GIB == container["memory"]["usageBytes"]
    assert container["accelerators"] == [{"make": "nvidia", "model": "NVIDIA H100 80GB HBM3", "id": "GPU-1",
                                          "memoryTotal": 81559 * 1024 * 1024, "memoryUsed": GIB, "dutyCycle": 87}]
    node = doc["node"]
    assert node["nodeName"] == "anex-vastai"
    assert node["cpu"]["usageNanoCores"] == 4_000_000_000
    assert node["memory"]["workingSetBytes"] == 16 * GIB
    assert node["network"]["rxBytes"] == 1000 and node["network"]["txBytes"] == 2000
    assert container["cpu"]["time"] == "1970-01-01T00:16:50Z"


def test_node_figures_sum_the_pods_and_a_pod_without_telemetry_is_left_out():
    counters = statshape.CpuCounters()
    doc = statshape.summary("n", "t", [sample(block(50.0, util=25.0, gpus=False), "a", "n1"),
                                       sample(block(50.0, util=100.0, cpus=2, gpus=False), "b", "n2"),
                                       sample(None, "c", "n3"), sample({"taken_at": 5.0}, "d", "n4")],
                            counters, 60.0)
    assert [p["podRef"]["name"] for p in doc["pods"]] == ["a", "b"]
    assert doc["node"]["cpu"]["usageNanoCores"] == 2_000_000_000 + 2_000_000_000
    assert "accelerators" not in doc["pods"][0]["containers"][0]


def test_resource_metrics_are_prometheus_text_with_timestamps():
    counters = statshape.CpuCounters()
    statshape.resource_metrics([sample(block(1000.0))], counters, 1000.5)
    text = statshape.resource_metrics([sample(block(1002.0))], counters, 1003.0)
    lines = text.splitlines()
    assert "# TYPE container_cpu_usage_seconds_total counter" in lines
    assert 'container_cpu_usage_seconds_total{container="training",namespace="ml",pod="train"} 8.000000000 1002000' \
        in lines
    assert f'container_memory_working_set_bytes{{container="training",namespace="ml",pod="train"}} {16 * GIB} 1002000' \
        in lines
    assert 'pod_cpu_usage_seconds_total{namespace="ml",pod="train"} 8.000000000 1002000' in lines
    assert f'pod_memory_working_set_bytes{{namespace="ml",pod="train"}} {16 * GIB} 1002000' in lines
    assert "node_cpu_usage_seconds_total 8.000000000 1002000" in lines
    assert f"node_memory_working_set_bytes {16 * GIB} 1002000" in lines
    start = datetime(2026, 11, 27, 10, tzinfo=timezone.utc).timestamp()
    assert f'container_start_time_seconds{{container="training",namespace="ml",pod="train"}} {start:.3f} 1002000' \
        in lines
    assert lines[-1] == "scrape_error 0"


def test_a_failed_scrape_says_so_and_label_values_are_escaped():
    counters = statshape.CpuCounters()
    odd = statshape.PodSample(namespace="ml", name='a"b', uid="u", containers=("c\\d",), start_time=None,
                              node_id="n", telemetry=block(10.0))
    text = statshape.resource_metrics([odd], counters, 11.0, scrape_error=True)
    assert 'container="c\\\\d",namespace="ml",pod="a\\"b"' in text
    assert text.endswith("scrape_error 1\n")
