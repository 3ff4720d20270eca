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

QUERY = "index,uuid,name,pci.bus_id,memory.total,driver_version,pcie.link.width.max,memory.used,temperature.gpu"


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
    finally:
        nvml.shutdown()
