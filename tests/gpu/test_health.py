"""The verdict rules (pure)."""

from __future__ import annotations

from anex_agent.gpu.health import assess
from anex_agent.gpu.inventory import GpuInfo, NodeInventory
from anex_agent.gpu.nvml import OK, NvmlState, NvmlStatus

GPU = GpuInfo(index=0, name="NVIDIA A100-PCIE-40GB", uuid="GPU-a", pci_bus_id="0:7:0", pcie_width=16, pcie_max_width=16)
INV = NodeInventory(driver_version="550", gpus=(GPU,))
GOOD = {"gpu_util_pct": 50, "ecc_dbe_vol": 0, "remap_failure": 0, "remap_pending": 0, "throttle": ["sw_power_cap"]}
HOST = {"disk": {"path": "/var/lib/anex", "total_bytes": 100, "free_bytes": 50}, "mem_total_bytes": 100,
        "mem_available_bytes": 60}


def test_healthy_node():
    verdict = assess(OK, INV, {0: GOOD}, expected_gpus=1, host=HOST)
    assert verdict.verdict == "healthy" and verdict.reasons == ()


def test_no_driver_is_degraded_and_says_why():
    status = NvmlStatus(NvmlState.no_driver, "no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found", 12)
    verdict = assess(status, None, {}, host=HOST)
    assert verdict.verdict == "degraded"
    assert "no NVIDIA driver" in verdict.reasons[0]


def test_version_mismatch_is_unhealthy_and_says_reboot():
    status = NvmlStatus(NvmlState.version_mismatch, "driver/library version mismatch: ... a reboot ...", 18)
    verdict = assess(status, None, {})
    assert verdict.verdict == "unhealthy" and "reboot" in verdict.reasons[0]


def test_hardware_xid_lost_gpu_and_dbe_are_unhealthy():
    assert assess(OK, INV, {0: GOOD}, hardware_xids={0: [79]}).verdict == "unhealthy"
    assert "GPU 0: gpu lost" in assess(OK, INV, {}, gpu_failures={0: "gpu_lost"}).reasons
    dbe = assess(OK, INV, {0: {**GOOD, "ecc_dbe_vol": 2}})
    assert dbe.verdict == "unhealthy" and "2 uncorrected ECC" in dbe.reasons[0]
    assert assess(OK, INV, {0: {**GOOD, "remap_failure": 1}}).verdict == "unhealthy"


def test_gpu_count_drop_is_unhealthy():
    verdict = assess(OK, INV, {0: GOOD}, expected_gpus=2)
    assert verdict.verdict == "unhealthy" and "2 GPUs at start, 1 now" in verdict.reasons[0]


def test_degraded_findings():
    narrow = NodeInventory(gpus=(GpuInfo(index=0, name="x", uuid="u", pci_bus_id="b", pcie_width=4, pcie_max_width=16),))
    assert "PCIe link x4" in assess(OK, narrow, {0: GOOD}).reasons[0]
    throttled = assess(OK, INV, {0: {**GOOD, "throttle": ["hw_thermal_slowdown"]}})
    assert throttled.verdict == "degraded" and "hw_thermal_slowdown" in throttled.reasons[0]
    assert assess(OK, INV, {0: {**GOOD, "remap_pending": 1}}).verdict == "degraded"
    low_disk = {**HOST, "disk": {"path": "/s", "total_bytes": 100, "free_bytes": 2}}
    assert "2.0% free" in assess(OK, INV, {0: GOOD}, host=low_disk).reasons[0]


def test_worst_finding_wins_and_all_reasons_are_kept():
    verdict = assess(OK, INV, {0: {**GOOD, "throttle": ["hw_slowdown"], "ecc_dbe_vol": 1}})
    assert verdict.verdict == "unhealthy" and len(verdict.reasons) == 2
    assert verdict.to_dict() == {"verdict": "unhealthy", "reasons": list(verdict.reasons)}
