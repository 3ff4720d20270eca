"""Inventory and per-GPU samples read through the fake pynvml."""

from __future__ import annotations

import pynvml as real_pynvml
import pytest

from anex_agent.gpu.inventory import guess_form_factor, memory_bandwidth_gbps, read_inventory
from anex_agent.gpu.nvml import Nvml
from anex_agent.gpu.sampler import sample_gpu, throttle_names

from anex_agent.testing.fake_nvml import FakeGpu

NS = real_pynvml.NVML_ERROR_NOT_SUPPORTED


def ready() -> Nvml:
    nvml = Nvml()
    assert nvml.ensure_ready()
    return nvml


@pytest.mark.parametrize(("bits", "mhz", "gbps"), [(5120, 1215, 1555.2), (384, 9751, 936.1), (None, 1215, None)])
def test_bandwidth_is_bus_width_times_clock_times_two(bits, mhz, gbps):
    assert memory_bandwidth_gbps(bits, mhz) == gbps


@pytest.mark.parametrize(("name", "form"), [
    ("NVIDIA A100-SXM4-80GB", "sxm"), ("NVIDIA A100-PCIE-40GB", "pcie"), ("NVIDIA H100 80GB HBM3", "sxm"),
    ("NVIDIA H100 PCIe", "pcie"), ("NVIDIA H200 NVL", "pcie"), ("NVIDIA GeForce RTX 4090", "pcie"),
])
def test_form_factor_guess(name, form):
    assert guess_form_factor(name) == form


def test_inventory_fields(fake):
    fake.gpus[1].mig = 1
    inventory, handles, failures = read_inventory(ready())
    assert failures == {} and len(handles) == 2
    assert inventory.driver_version == "550.54.15" and inventory.cuda_version == "12.4"
    first, second = inventory.gpus
    assert (first.index, first.name, first.uuid, first.pci_bus_id) == (0, "NVIDIA A100-SXM4-40GB", "GPU-aaaa",
                                                                      "00000000:07:00.0")
    assert first.memory_total_bytes == 40960 * 1024 * 1024
    assert first.compute_capability == "8.0"
    assert first.memory_bandwidth_gbps == 1555.2
    assert (first.pcie_max_gen, first.pcie_max_width, first.pcie_gen, first.pcie_width) == (4, 16, 4, 16)
    assert first.power_limit_w == 400.0
    assert first.mig_mode == "disabled" and second.mig_mode == "enabled"
    assert first.device == "nvidia0" and first.form_factor == "sxm"


def test_unsupported_inventory_fields_are_absent(install_fake):
    install_fake([FakeGpu(errors={"nvmlDeviceGetMemoryBusWidth": NS, "nvmlDeviceGetMigMode": NS,
                                  "nvmlDeviceGetGpuMaxPcieLinkGeneration": real_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND})])
    inventory, _, _ = read_inventory(ready())
    gpu = inventory.gpus[0].to_dict()
    assert "memory_bus_width_bits" not in gpu and "memory_bandwidth_gbps" not in gpu and "mig_mode" not in gpu
    assert gpu["pcie_max_gen"] == 4  # fell back to nvmlDeviceGetMaxPcieLinkGeneration


def test_lost_gpu_during_inventory_is_a_failure_not_an_exception(install_fake):
    install_fake([FakeGpu(uuid="GPU-ok"),
                  FakeGpu(uuid="GPU-gone", errors={"nvmlDeviceGetName": real_pynvml.NVML_ERROR_GPU_IS_LOST})])
    inventory, handles, failures = read_inventory(ready())
    assert [g.uuid for g in inventory.gpus] == ["GPU-ok"]
    assert failures == {1: "gpu_lost"}


def test_sample_values_and_units(fake):
    fake.gpus[0].processes = [(11, 3 * 1024 * 1024 * 1024), (12, 512 * 1024 * 1024)]
    fake.gpus[0].throttle = 0x4 | 0x40
    nvml = ready()
    sample = sample_gpu(nvml, nvml.call("nvmlDeviceGetHandleByIndex", 0))
    assert sample["gpu_util_pct"] == 37 and sample["mem_copy_util_pct"] == 12
    assert sample["fb_used_mib"] == 1024 and sample["fb_reserved_mib"] == 512
    assert sample["fb_free_mib"] == 40960 - 1024 - 512
    assert sample["gpu_temp_c"] == 41 and sample["mem_temp_c"] == 44
    assert sample["power_w"] == 85.123 and sample["energy_mj"] == 123_456_789
    assert sample["sm_clock_mhz"] == 1410 and sample["mem_clock_mhz"] == 1215
    assert (sample["pcie_tx_kbps"], sample["pcie_rx_kbps"], sample["pcie_replay"]) == (2000, 3000, 0)
    assert (sample["ecc_sbe_vol"], sample["ecc_dbe_vol"], sample["ecc_sbe_agg"], sample["ecc_dbe_agg"]) == (3, 0, 10, 0)
    assert sample["remapped_rows_unc"] == 0 and sample["remap_failure"] == 0
    assert sample["throttle"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert sample["processes"] == [{"pid": 11, "used_mib": 3072.0, "type": "compute"},
                                   {"pid": 12, "used_mib": 512.0, "type": "compute"}]


def test_unsupported_sample_fields_are_absent(install_fake):
    fake = install_fake([FakeGpu(mem_temp=None, errors={
        "nvmlDeviceGetTotalEccErrors": NS, "nvmlDeviceGetRemappedRows": NS, "nvmlDeviceGetEncoderUtilization": NS,
        "nvmlDeviceGetPowerUsage": NS, "nvmlDeviceGetCurrentClocksEventReasons": real_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND,
    })])
    nvml = ready()
    sample = sample_gpu(nvml, nvml.call("nvmlDeviceGetHandleByIndex", 0))
    for key in ("mem_temp_c", "ecc_sbe_vol", "ecc_dbe_vol", "remapped_rows_corr", "enc_util_pct", "power_w"):
        assert key not in sample
    assert sample["throttle"] == ["sw_power_cap"]  # from the older ...ThrottleReasons call
    assert sample["dec_util_pct"] == 0
    assert fake.calls["nvmlDeviceGetTotalEccErrors"] == 1  # ECC unsupported: the other three are skipped


def test_memory_info_v1_fallback_without_reserved(install_fake):
    install_fake([FakeGpu(errors={})])
    nvml = ready()
    handle = nvml.call("nvmlDeviceGetHandleByIndex", 0)
    original = nvml.module.nvmlDeviceGetMemoryInfo

    def v1_only(h, version=None):
        if version:
            raise real_pynvml.NVMLError(real_pynvml.NVML_ERROR_FUNCTION_NOT_FOUND)
        return original(h)

    nvml.module.nvmlDeviceGetMemoryInfo = v1_only
    sample = sample_gpu(nvml, handle)
    assert "fb_reserved_mib" not in sample
    assert sample["fb_used_mib"] == 1536 and sample["fb_total_mib"] == 40960


def test_throttle_names_follow_nvml_bits():
    mask = real_pynvml.nvmlClocksEventReasonGpuIdle | real_pynvml.nvmlClocksEventReasonHwSlowdown
    assert throttle_names(mask) == ["gpu_idle", "hw_slowdown"]
