"""/metrics exposition: parses with prometheus_client's parser, DCGM names and labels, anex_* metrics."""

from __future__ import annotations

import sys

import pynvml as real_pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.gpu.exposition import DCGM_FIELDS, GPU_LABELS, metric_families, register_collectors
from anex_agent.gpu.monitor import TelemetryMonitor

from .test_nvml import no_library

DEFAULT_COUNTERS = {  # dcgm-exporter etc/default-counters.csv (enabled lines), GPU-level fields every GPU has
    "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_PROF_PCIE_TX_BYTES",
    "DCGM_FI_PROF_PCIE_RX_BYTES", "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_ENC_UTIL", "DCGM_FI_DEV_DEC_UTIL", "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_ROW_REMAP_FAILURE",
}


def scrape(source) -> dict:
    registry = CollectorRegistry(auto_describe=True)
    register_collectors(registry, source)
    text = generate_latest(registry).decode()
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_dcgm_names_and_labels(fake, tmp_path):
    fake.gpus[1].util = (99, 40)
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="node-a", watch_xids=False)
    mon.collect()
    families = scrape(mon)
    mon.close()
    for name in DEFAULT_COUNTERS:
        assert name in families, name
        assert len(families[name].samples) == 2
    util = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert util["1"].value == 99 and util["0"].value == 37
    labels = util["1"].labels
    assert set(labels) == set(GPU_LABELS)
    assert labels == {"gpu": "1", "UUID": "GPU-bbbb", "pci_bus_id": "00000000:0F:00.0", "device": "nvidia1",
                      "modelName": "NVIDIA A100-SXM4-40GB", "hostname": "node-a"}
    # names exactly as dcgm-exporter's: counters are untyped so no _total suffix is added
    replay = families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"]
    assert replay.type == "unknown" and replay.samples[0].name == "DCGM_FI_DEV_PCIE_REPLAY_COUNTER"
    assert families["DCGM_FI_DEV_FB_USED"].samples[0].value == 1024
    assert families["DCGM_FI_DEV_POWER_USAGE"].samples[0].value == 85.123
    assert families["anex_nvml_up"].samples[0].value == 1
    health = {s.labels["verdict"]: s.value for s in families["anex_node_health"].samples}
    assert health == {"healthy": 1, "degraded": 0, "unhealthy": 0}
    assert families["anex_gpu_info"].samples[0].labels["driver_version"] == "550.54.15"
    assert families["anex_host_cpu_count"].samples[0].value >= 1


def test_unsupported_fields_leave_no_sample(install_fake, tmp_path):
    from anex_agent.testing.fake_nvml import FakeGpu

    install_fake([FakeGpu(mem_temp=None, errors={"nvmlDeviceGetEncoderUtilization": real_pynvml.NVML_ERROR_NOT_SUPPORTED})])
    mon = TelemetryMonitor(state_dir=str(tmp_path), watch_xids=False)
    mon.collect()
    families = scrape(mon)
    mon.close()
    assert "DCGM_FI_DEV_MEMORY_TEMP" not in families and "DCGM_FI_DEV_ENC_UTIL" not in families
    assert "DCGM_FI_DEV_DEC_UTIL" in families


@no_library
def test_no_driver_metrics_say_so(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "pynvml", real_pynvml)
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="cpu-node")
    mon.collect()
    families = scrape(mon)
    mon.close()
    assert not any(name.startswith("DCGM_") for name in families)
    assert families["anex_nvml_up"].samples[0].value == 0
    state = families["anex_nvml_state"].samples[0].labels
    assert state["state"] == "no_driver" and "libnvidia-ml.so.1" in state["reason"]
    assert families["anex_gpu_count"].samples[0].value == 0
    health = {s.labels["verdict"]: s.value for s in families["anex_node_health"].samples}
    assert health["degraded"] == 1


def test_empty_before_first_sample(tmp_path):
    class Nothing:
        def telemetry(self):
            return None

    assert scrape(Nothing()) == {}


def test_extra_node_label_for_fleet_rendering(fake, tmp_path):
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="h1", watch_xids=False)
    mon.collect()
    block = mon.telemetry()
    mon.close()
    families = {f.name: f for f in metric_families([({"node": "n1"}, block), ({"node": "n2"}, block)])}
    samples = families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert sorted(s.labels["node"] for s in samples) == ["n1", "n1", "n2", "n2"]
    assert {name for name, *_ in DCGM_FIELDS} >= DEFAULT_COUNTERS
