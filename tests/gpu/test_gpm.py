"""Profiling metrics through NVML GPM (fake pynvml shaped from NVML's GPM structures and error codes)."""

from __future__ import annotations

import json

import pynvml as real
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from anex_agent.errors import ConfigError
from anex_agent.gpu.exposition import register_collectors
from anex_agent.gpu.monitor import TelemetryMonitor
from anex_agent.gpu.qualify import gather_facts, evaluate
from anex_agent.gpu.qualify_cli import render_table
from anex_agent.telemetry.models import Telemetry
from anex_agent.telemetry.options import ExpositionOptions, exposition_options
from anex_agent.wire.heartbeat import Heartbeat

from anex_agent.testing.fake_nvml import FakeGpu

MIB = 1024 * 1024


class Clock:
    """A hand-moved monotonic clock: a sampling cycle "15 s later" without sleeping."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def monitor_with_clock(tmp_path) -> tuple[TelemetryMonitor, Clock]:
    clock = Clock()
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="node-a", watch_xids=False)
    mon.gpm._clock = clock
    mon._monotonic = clock
    return mon, clock


def scrape(mon, options=None) -> dict:
    registry = CollectorRegistry(auto_describe=True)
    register_collectors(registry, mon, options)
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def h100(**kw) -> FakeGpu:
    return FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-h100", cc=(9, 0), gpm=True, **kw)


def test_metrics_come_from_two_cycles_with_dcgm_units(install_fake, tmp_path):
    fake = install_fake([h100(), FakeGpu(uuid="GPU-a100", bus_id="00000000:0F:00.0")])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        first = mon.collect()
        assert not {"sm_active", "tensor_active"} & set(first.samples[0])  # one sample: no pair yet
        clock.now += 15
        second = mon.collect()
        block = mon.telemetry()
    finally:
        mon.close()
    gpm = second.samples[0]
    # NVML percent -> DCGM ratio; NVML MiB/s -> bytes/s
    assert gpm["gr_engine_active"] == 0.815 and gpm["sm_active"] == 0.64 and gpm["sm_occupancy"] == 0.3225
    assert gpm["tensor_active"] == 0.42 and gpm["dram_active"] == 0.555
    assert gpm["pcie_tx_bps"] == 1500 * MIB and gpm["pcie_rx_bps"] == 2500 * MIB
    assert gpm["nvlink_tx_bps"] == 10000 * MIB and gpm["nvlink_rx_bps"] == 12000 * MIB
    assert gpm["nvlink_bandwidth_mbps"] == round(22000 * MIB / 1e6, 3)
    assert not {"sm_active", "pcie_tx_bps"} & set(second.samples[1])  # the A100: nothing made up
    # one GPM sample per supported GPU per cycle; two buffers allocated once; none on the A100
    assert fake.calls["nvmlGpmSampleGet"] == 2 and fake.calls["nvmlGpmSampleAlloc"] == 2
    assert fake.calls["nvmlGpmMetricsGet"] == 1
    assert fake.gpm_buffers == {} and len(fake.gpm_freed) == 2  # freed at close
    Heartbeat(telemetry=block)  # the new fields fit the wire model
    assert Telemetry.model_validate(block).gpus[0].sm_active == 0.64


def test_buffers_are_swapped_not_reallocated(install_fake, tmp_path):
    fake = install_fake([h100()])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        for _ in range(5):
            mon.collect()
            clock.now += 15
    finally:
        mon.close()
    assert fake.calls["nvmlGpmSampleAlloc"] == 2 and fake.calls["nvmlGpmSampleGet"] == 5
    assert fake.calls["nvmlGpmMetricsGet"] == 4


def test_a_cycle_sooner_than_nvml_refresh_keeps_the_previous_sample(install_fake, tmp_path):
    fake = install_fake([h100()])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 0.05  # NVML needs > 100 ms between the two samples of a pair
        soon = mon.collect()
        clock.now += 15
        later = mon.collect()
    finally:
        mon.close()
    assert "sm_active" not in soon.samples[0] and fake.calls["nvmlGpmSampleGet"] == 2
    assert later.samples[0]["sm_active"] == 0.64


@pytest.mark.parametrize("gpu", [
    FakeGpu(gpm=False),  # isSupportedDevice = 0 (before Hopper)
    FakeGpu(gpm=True, errors={"nvmlGpmQueryDeviceSupport": real.NVML_ERROR_NOT_SUPPORTED}),
    FakeGpu(gpm=True, errors={"nvmlGpmQueryDeviceSupport": real.NVML_ERROR_FUNCTION_NOT_FOUND}),  # older driver
])
def test_unsupported_is_said_once_and_nothing_is_exposed(install_fake, tmp_path, gpu):
    fake = install_fake([gpu])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        mon.collect()
        families = scrape(mon)
    finally:
        mon.close()
    assert fake.calls.get("nvmlGpmQueryDeviceSupport") == 1  # once per NVML init, with the inventory
    assert "nvmlGpmSampleGet" not in fake.calls and "nvmlGpmSampleAlloc" not in fake.calls
    assert families["anex_gpu_info"].samples[0].labels["gpm"] == "unsupported"
    assert not [name for name in families if name.startswith("DCGM_FI_PROF_") and "PCIE" not in name]
    assert "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in families


def test_metric_nvml_does_not_report_is_left_out(install_fake, tmp_path):
    metrics = dict(h100().gpm_metrics)
    del metrics[real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC], metrics[real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC]
    install_fake([h100(gpm_metrics=metrics)])  # a GPU without NVLink: nvmlReturn NOT_SUPPORTED for those
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        sample = mon.collect().samples[0]
        families = scrape(mon)
    finally:
        mon.close()
    assert sample["tensor_active"] == 0.42
    assert not {"nvlink_tx_bps", "nvlink_rx_bps", "nvlink_bandwidth_mbps"} & set(sample)
    assert "DCGM_FI_PROF_NVLINK_TX_BYTES" not in families and "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL" not in families
    assert families["anex_gpu_info"].samples[0].labels["gpm"] == "supported"


def test_refused_pair_gives_no_metrics_and_no_error(install_fake, tmp_path):
    install_fake([h100(errors={"nvmlGpmMetricsGet": real.NVML_ERROR_INSUFFICIENT_SIZE})])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        snapshot = mon.collect()
    finally:
        mon.close()
    assert "sm_active" not in snapshot.samples[0] and snapshot.samples[0]["gpu_util_pct"] == 37
    assert snapshot.verdict.verdict == "healthy"


def test_a_failed_cycle_starts_a_new_pair(install_fake, tmp_path):
    fake = install_fake([h100()])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        fake.gpus[0].errors["nvmlDeviceGetUtilizationRates"] = real.NVML_ERROR_GPU_IS_LOST
        lost = mon.collect()
        del fake.gpus[0].errors["nvmlDeviceGetUtilizationRates"]
        clock.now += 15
        back = mon.collect()  # the sample before the loss is not paired with this one
        clock.now += 15
        again = mon.collect()
    finally:
        mon.close()
    assert lost.gpu_failures == {0: "gpu_lost"}
    assert "sm_active" not in back.samples[0] and again.samples[0]["sm_active"] == 0.64


def test_nvlink_bandwidth_from_nvml_counters_without_gpm(install_fake, tmp_path):
    fake = install_fake([FakeGpu(nvlink_raw_kib=(1_000_000, 2_000_000))])  # an A100 SXM with NVLink
    mon, clock = monitor_with_clock(tmp_path)
    try:
        first = mon.collect()
        fake.gpus[0].nvlink_raw_kib = (1_000_000 + 15 * 4000, 2_000_000 + 15 * 6000)  # 10000 KiB/s in all
        clock.now += 15
        second = mon.collect()
        families = scrape(mon)
    finally:
        mon.close()
    assert "nvlink_bandwidth_mbps" not in first.samples[0]
    assert second.samples[0]["nvlink_bandwidth_mbps"] == round(10000 * 1024 / 1e6, 3)
    assert families["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].samples[0].value == pytest.approx(10.24)


def test_pcie_bytes_by_default_deprecated_pair_by_option(install_fake, tmp_path):
    install_fake([h100(), FakeGpu(uuid="GPU-a100", bus_id="00000000:0F:00.0")])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        mon.collect()
        default = scrape(mon)
        legacy = scrape(mon, ExpositionOptions(pcie_throughput=True))
    finally:
        mon.close()
    tx = {s.labels["gpu"]: s.value for s in default["DCGM_FI_PROF_PCIE_TX_BYTES"].samples}
    assert tx == {"0": 1500 * MIB, "1": 2000 * 1024}  # GPM on the H100; NVML's KB/s x 1024 on the A100
    assert "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" not in default and "DCGM_FI_DEV_PCIE_RX_THROUGHPUT" not in default
    old = {s.labels["gpu"]: s.value for s in legacy["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"].samples}
    assert old == {"0": 3000, "1": 3000} and legacy["DCGM_FI_DEV_PCIE_RX_THROUGHPUT"].type == "unknown"


def test_options_parsed_at_the_edge_name_the_variable():
    assert exposition_options({}) == ExpositionOptions("hostname", False)
    assert exposition_options({"ANEX_METRICS_HOST_LABEL": "Hostname", "ANEX_METRICS_PCIE_THROUGHPUT": "1"}) == \
        ExpositionOptions("Hostname", True)
    with pytest.raises(ConfigError, match="ANEX_METRICS_HOST_LABEL"):
        exposition_options({"ANEX_METRICS_HOST_LABEL": "host"})
    with pytest.raises(ConfigError, match="ANEX_METRICS_PCIE_THROUGHPUT"):
        exposition_options({"ANEX_METRICS_PCIE_THROUGHPUT": "maybe"})


def test_qualify_says_which_gpus_have_profiling_metrics(install_fake, tmp_path):
    install_fake([h100(), FakeGpu(uuid="GPU-a100", bus_id="00000000:0F:00.0")])
    result = evaluate(gather_facts(sys_root=str(tmp_path))).to_dict()
    assert result["summary"]["gpm"] == {"0": "supported", "1": "unsupported"}
    table = render_table(result)
    assert table.count("NVML GPM") == 1
    assert "not supported on GPU 1" in table and "supported on GPU 0" in table
    json.dumps(result)


def test_qualify_all_supported(install_fake, tmp_path):
    install_fake([h100()])
    table = render_table(evaluate(gather_facts(sys_root=str(tmp_path))).to_dict())
    assert "supported on every GPU" in table and "not supported" not in table


def test_both_roles_read_the_options_at_their_edge(tmp_path):
    import argparse

    from anex_agent.agent import settings as agent_settings
    from anex_agent.coordinator import cli as coordinator_cli

    env = {"ANEX_COORDINATOR_URL": "https://coordinator.example", "ANEX_STATE_DIR": str(tmp_path),
           "ANEX_METRICS_HOST_LABEL": "Hostname", "ANEX_METRICS_PCIE_THROUGHPUT": "1"}
    parser = argparse.ArgumentParser()
    agent_settings.add_arguments(parser)
    assert agent_settings.from_args(parser.parse_args([]), env).gpu_metrics == ExpositionOptions("Hostname", True)
    assert agent_settings.from_args(parser.parse_args([]), {**env, "ANEX_METRICS_HOST_LABEL": ""}).gpu_metrics.host_label \
        == "hostname"
    with pytest.raises(ConfigError, match="ANEX_METRICS_PCIE_THROUGHPUT"):
        agent_settings.from_args(parser.parse_args([]), {**env, "ANEX_METRICS_PCIE_THROUGHPUT": "2"})
    parser = argparse.ArgumentParser()
    coordinator_cli.configure(parser)
    settings = coordinator_cli.settings_from(parser.parse_args(["--state-dir", str(tmp_path)]), environ=env)
    assert settings.gpu_metrics == ExpositionOptions("Hostname", True)
    assert coordinator_cli.settings_from(parser.parse_args(["--state-dir", str(tmp_path)]), environ={}).gpu_metrics \
        == ExpositionOptions()


def test_fleet_view_follows_the_options(install_fake, tmp_path):
    from anex_agent.coordinator.routes.fleet_metrics import exposition

    install_fake([h100()])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        mon.collect()
        block = mon.telemetry()
    finally:
        mon.close()

    class Fleet:
        _clock = staticmethod(lambda: 2e9)

        def parsed(self):
            yield "id-1", "node-1", block

    old = {f.name: f for f in text_string_to_metric_families(
        exposition(Fleet(), ExpositionOptions("Hostname", True)).decode())}
    new = {f.name: f for f in text_string_to_metric_families(exposition(Fleet()).decode())}
    assert old["DCGM_FI_DEV_GPU_TEMP"].samples[0].labels["Hostname"] == "node-a"
    assert "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" in old and "DCGM_FI_DEV_PCIE_TX_THROUGHPUT" not in new
    sample = new["DCGM_FI_PROF_SM_ACTIVE"].samples[0]
    assert sample.value == 0.64 and sample.labels["hostname"] == "node-a" and sample.labels["node"] == "node-1"


def test_nvml_reinitialised_buffers_of_the_old_session_are_not_freed(install_fake, tmp_path):
    from anex_agent.gpu.nvml import Nvml

    fake = install_fake([h100()])
    clock = Clock()
    mon = TelemetryMonitor(state_dir=str(tmp_path), hostname="node-a", watch_xids=False,
                           nvml=Nvml(retry_interval=0.0))
    mon.gpm._clock = clock
    try:
        mon.collect()
        clock.now += 15
        assert mon.collect().samples[0]["sm_active"] == 0.64
        old = set(fake.gpm_buffers)
        fake.fail_all = real.NVML_ERROR_LIB_RM_VERSION_MISMATCH  # the driver was updated under the node
        assert mon.collect().nvml.state.value == "version_mismatch"
        fake.fail_all = None  # reloaded: NVML comes back, a new session
        clock.now += 15
        back = mon.collect()
        clock.now += 15
        again = mon.collect()
    finally:
        mon.close()
    assert "sm_active" not in back.samples[0] and again.samples[0]["sm_active"] == 0.64
    assert not old & set(fake.gpm_freed)  # never handed to the new session
    assert fake.gpm_buffers.keys() == old  # only the old session's remain (the new ones were freed at close)


def test_a_reading_that_is_not_a_number_is_left_out(install_fake, tmp_path):
    metrics = {**h100().gpm_metrics, real.NVML_GPM_METRIC_SM_UTIL: float("inf"),
               real.NVML_GPM_METRIC_DRAM_BW_UTIL: float("nan"), real.NVML_GPM_METRIC_SM_OCCUPANCY: -1.0}
    install_fake([h100(gpm_metrics=metrics)])
    mon, clock = monitor_with_clock(tmp_path)
    try:
        mon.collect()
        clock.now += 15
        sample = mon.collect().samples[0]
        block = mon.telemetry()
    finally:
        mon.close()
    assert not {"sm_active", "dram_active", "sm_occupancy"} & set(sample) and sample["tensor_active"] == 0.42
    Heartbeat(telemetry=block)  # the block stays valid: the heartbeat keeps its telemetry
