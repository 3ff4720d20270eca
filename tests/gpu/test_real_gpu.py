"""On a machine with an NVIDIA GPU: inventory and one sample against nvidia-smi (skipped elsewhere)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pynvml as real_pynvml
import pytest

from anex_agent.gpu.inventory import read_inventory
from anex_agent.gpu.nvml import Nvml
from anex_agent.gpu.sampler import sample_gpu

from .test_nvml import _nvml_library_present

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(shutil.which("nvidia-smi") is None or not _nvml_library_present(),
                       reason="needs an NVIDIA GPU with its driver (nvidia-smi and libnvidia-ml.so.1)"),
]

QUERY = ("index,uuid,name,pci.bus_id,memory.total,driver_version,pcie.link.width.max,memory.used,temperature.gpu,"
         "temperature.memory")


def smi() -> list[dict[str, str]]:
    out = subprocess.run(["nvidia-smi", f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, check=True, timeout=30).stdout
    keys = QUERY.split(",")
    return [dict(zip(keys, (v.strip() for v in line.split(",")))) for line in out.strip().splitlines()]


def test_inventory_and_sample_match_nvidia_smi(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", real_pynvml)
    nvml = Nvml()
    assert nvml.ensure_ready(), nvml.status.reason
    try:
        inventory, handles, failures = read_inventory(nvml)
        rows = smi()
        assert failures == {}
        assert len(inventory.gpus) == len(rows)
        assert inventory.driver_version == rows[0]["driver_version"]
        for gpu, row, handle in zip(inventory.gpus, rows, handles):
            assert gpu.index == int(row["index"]) and gpu.uuid == row["uuid"] and gpu.name == row["name"]
            assert gpu.pci_bus_id.lower().endswith(row["pci.bus_id"].lower()[-12:])
            assert gpu.memory_total_bytes // (1024 * 1024) == int(row["memory.total"])
            if row["pcie.link.width.max"] not in ("[N/A]", ""):
                assert gpu.pcie_max_width == int(row["pcie.link.width.max"])
            sample = sample_gpu(nvml, handle)
            assert abs(sample["fb_used_mib"] - int(row["memory.used"])) <= 64  # moves between the two reads
            assert abs(sample["gpu_temp_c"] - int(row["temperature.gpu"])) <= 3
            assert 0 <= sample["gpu_util_pct"] <= 100
            # the field-values call also asks the NVLink counters: a GPU without NVLink must still give its
            # memory temperature (per-field status, not a failed call)
            if row["temperature.memory"] not in ("[N/A]", "N/A", ""):
                assert abs(sample["mem_temp_c"] - int(row["temperature.memory"])) <= 3
    finally:
        nvml.shutdown()


def smi_dmon_gpm(metric_ids: list[int]) -> dict[int, dict[int, float]] | None:
    """``nvidia-smi dmon --gpm-metrics`` (drivers with GPM): {gpu index: {metric id: value}}; None without it."""
    try:
        run = subprocess.run(["nvidia-smi", "dmon", "-c", "1", "--gpm-metrics", ",".join(map(str, metric_ids))],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    if run.returncode != 0:
        return None
    out: dict[int, dict[int, float]] = {}
    for line in run.stdout.splitlines():
        fields = line.split()
        if not fields or line.lstrip().startswith("#") or not fields[0].isdigit():
            continue
        values = fields[-len(metric_ids):]
        out[int(fields[0])] = {mid: float(v) for mid, v in zip(metric_ids, values) if v.replace(".", "", 1).isdigit()}
    return out


def test_gpm_profiling_metrics_match_nvidia_smi(monkeypatch):
    """On a GPU with GPM (compute capability 9.0 and newer): two cycles give DCGM-unit metrics that agree
    with ``nvidia-smi dmon --gpm-metrics`` (both read an idle GPU: within 10 points of each other)."""
    import time

    from anex_agent.gpu.gpm import SUPPORTED
    from anex_agent.gpu.monitor import TelemetryMonitor

    monkeypatch.setitem(sys.modules, "pynvml", real_pynvml)
    mon = TelemetryMonitor(hostname="gpu-test", watch_xids=False)
    try:
        mon.collect()
        inventory = mon.snapshot().inventory
        assert inventory is not None, mon.snapshot().nvml.reason
        caps = {g.index: g.compute_capability for g in inventory.gpus}
        supported = [g.index for g in inventory.gpus if g.gpm == SUPPORTED]
        for index in supported:  # GPM is Hopper (compute capability 9.0) and newer data-center GPUs
            assert float(caps[index] or 0) >= 9.0, (index, caps[index])
        if not supported:
            pytest.skip("no GPU with GPM here (needs Hopper or newer)")
        time.sleep(1.0)
        samples = mon.collect().samples
    finally:
        mon.close()
    ids = [real_pynvml.NVML_GPM_METRIC_GRAPHICS_UTIL, real_pynvml.NVML_GPM_METRIC_SM_UTIL,
           real_pynvml.NVML_GPM_METRIC_ANY_TENSOR_UTIL, real_pynvml.NVML_GPM_METRIC_DRAM_BW_UTIL]
    smi = smi_dmon_gpm(ids)
    for index in supported:
        sample = samples[index]
        for key in ("gr_engine_active", "sm_active", "sm_occupancy", "tensor_active", "dram_active"):
            assert 0.0 <= sample[key] <= 1.0, (key, sample[key])
        for key in ("pcie_tx_bps", "pcie_rx_bps"):
            assert sample[key] >= 0, key
        if smi and index in smi:
            for key, mid in zip(("gr_engine_active", "sm_active", "tensor_active", "dram_active"), ids):
                if mid in smi[index]:
                    assert abs(sample[key] * 100 - smi[index][mid]) <= 10, (key, sample[key], smi[index][mid])
