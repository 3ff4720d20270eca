"""One sample of one GPU: a flat dict of what NVML could read, units in the key names.

:func:`sample_gpu` (blocking; call it in a thread) returns a dict with only the
fields the GPU supports (NOT_SUPPORTED -> key absent). Keys and units:

=====================  ==========================================================
``gpu_util_pct``        GPU utilisation, % (nvmlDeviceGetUtilizationRates.gpu)
``mem_copy_util_pct``   memory-copy utilisation, % (…UtilizationRates.memory)
``fb_total_mib``        framebuffer total, MiB
``fb_used_mib``         framebuffer used, MiB
``fb_free_mib``         framebuffer free, MiB
``fb_reserved_mib``     framebuffer reserved by the driver, MiB (memory info v2)
``gpu_temp_c``          GPU temperature, °C
``mem_temp_c``          memory (HBM) temperature, °C (field NVML_FI_DEV_MEMORY_TEMP)
``power_w``             power draw, W (NVML reports mW)
``energy_mj``           total energy since driver load, mJ
``sm_clock_mhz``        SM clock, MHz
``mem_clock_mhz``       memory clock, MHz
``pcie_tx_kbps``        PCIe TX throughput, KB/s (NVML samples it over 20 ms)
``pcie_rx_kbps``        PCIe RX throughput, KB/s
``pcie_replay``         PCIe replay counter
``nvlink_raw_tx_kib``   NVLink data + protocol bytes sent since driver load, KiB, all links
                        (field NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX; absent without NVLink)
``nvlink_raw_rx_kib``   the same, received (NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX)
``ecc_sbe_vol``         corrected (single-bit) ECC errors since boot
``ecc_dbe_vol``         uncorrected (double-bit) ECC errors since boot
``ecc_sbe_agg``         corrected ECC errors, lifetime
``ecc_dbe_agg``         uncorrected ECC errors, lifetime
``remapped_rows_corr``  rows remapped for correctable errors
``remapped_rows_unc``   rows remapped for uncorrectable errors
``remap_pending``       1 when a remap waits for a GPU reset
``remap_failure``       1 when a remap failed
``throttle_mask``       clock event (throttle) reasons bitmask
``throttle``            the names of the set reasons, e.g. ["sw_power_cap"]
``enc_util_pct``        encoder utilisation, %
``dec_util_pct``        decoder utilisation, %
``processes``           [{"pid": int, "used_mib": float|None, "type": "compute"|"graphics"}]
=====================  ==========================================================
"""

from __future__ import annotations

from typing import Any

from anex_agent.gpu.nvml import ABSENT, Nvml

MIB = 1024 * 1024
#: nvmlFieldValue_t.scopeId asking the NVLink throughput fields for the sum over every link (nvml.h:
#: "A scopeId of UINT_MAX returns aggregate value summed up across all links")
ALL_LINKS = 0xFFFFFFFF

# nvmlClocksEventReason* bits (nvml.h "Clocks Event Reasons").
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x1, "gpu_idle"),
    (0x2, "applications_clocks_setting"),
    (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"),
    (0x10, "sync_boost"),
    (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"),
    (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def throttle_names(mask: int) -> list[str]:
    return [name for bit, name in THROTTLE_REASONS if mask & bit]


def _field_value(fv: Any) -> Any:
    """Value of a c_nvmlFieldValue_t according to its valueType (nvmlValueType_t), or ABSENT."""
    if fv.nvmlReturn != 0:
        return ABSENT
    kind = fv.valueType
    attr = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind)
    return ABSENT if attr is None else getattr(fv.value, attr)


def _put(out: dict[str, Any], key: str, value: Any, scale: float | None = None) -> None:
    if value is ABSENT or value is None:
        return
    out[key] = round(value / scale, 3) if scale else value


def sample_gpu(nvml: Nvml, handle: Any) -> dict[str, Any]:
    """Read one sample of one GPU (blocking). Raises DeviceFailure / NvmlUnavailable like Nvml.call."""
    m = nvml.module
    call = nvml.call
    out: dict[str, Any] = {}

    util = call("nvmlDeviceGetUtilizationRates", handle)
    if util is not ABSENT:
        out["gpu_util_pct"] = util.gpu
        out["mem_copy_util_pct"] = util.memory

    memory = call("nvmlDeviceGetMemoryInfo", handle, m.nvmlMemory_v2)
    if memory is ABSENT:
        memory = call("nvmlDeviceGetMemoryInfo", handle)
    if memory is not ABSENT:
        out["fb_total_mib"] = round(memory.total / MIB, 3)
        out["fb_used_mib"] = round(memory.used / MIB, 3)
        out["fb_free_mib"] = round(memory.free / MIB, 3)
        if hasattr(memory, "reserved"):
            out["fb_reserved_mib"] = round(memory.reserved / MIB, 3)

    _put(out, "gpu_temp_c", call("nvmlDeviceGetTemperature", handle, m.NVML_TEMPERATURE_GPU))
    fields = call("nvmlDeviceGetFieldValues", handle, [m.NVML_FI_DEV_MEMORY_TEMP,
                                                      (m.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, ALL_LINKS),
                                                      (m.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX, ALL_LINKS)])
    if fields is not ABSENT:
        _put(out, "mem_temp_c", _field_value(fields[0]))
        _put(out, "nvlink_raw_tx_kib", _field_value(fields[1]))
        _put(out, "nvlink_raw_rx_kib", _field_value(fields[2]))
    _put(out, "power_w", call("nvmlDeviceGetPowerUsage", handle), 1000.0)
    _put(out, "energy_mj", call("nvmlDeviceGetTotalEnergyConsumption", handle))
    _put(out, "sm_clock_mhz", call("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_SM))
    _put(out, "mem_clock_mhz", call("nvmlDeviceGetClockInfo", handle, m.NVML_CLOCK_MEM))
    _put(out, "pcie_tx_kbps", call("nvmlDeviceGetPcieThroughput", handle, m.NVML_PCIE_UTIL_TX_BYTES))
    _put(out, "pcie_rx_kbps", call("nvmlDeviceGetPcieThroughput", handle, m.NVML_PCIE_UTIL_RX_BYTES))
    _put(out, "pcie_replay", call("nvmlDeviceGetPcieReplayCounter", handle))

    for key, err, counter in (
        ("ecc_sbe_vol", m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_VOLATILE_ECC),
        ("ecc_dbe_vol", m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_VOLATILE_ECC),
        ("ecc_sbe_agg", m.NVML_MEMORY_ERROR_TYPE_CORRECTED, m.NVML_AGGREGATE_ECC),
        ("ecc_dbe_agg", m.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, m.NVML_AGGREGATE_ECC),
    ):
        value = call("nvmlDeviceGetTotalEccErrors", handle, err, counter)
        _put(out, key, value)
        if value is ABSENT and key == "ecc_sbe_vol":
            break  # ECC off or unsupported: the other three say the same, save three calls

    rows = call("nvmlDeviceGetRemappedRows", handle)
    if rows is not ABSENT:
        corr, unc, pending, failure = rows
        out.update(remapped_rows_corr=corr, remapped_rows_unc=unc, remap_pending=int(bool(pending)),
                   remap_failure=int(bool(failure)))

    mask = call("nvmlDeviceGetCurrentClocksEventReasons", handle)
    if mask is ABSENT:
        mask = call("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
    if mask is not ABSENT:
        out["throttle_mask"] = int(mask)
        out["throttle"] = throttle_names(int(mask))

    enc = call("nvmlDeviceGetEncoderUtilization", handle)
    if enc is not ABSENT:
        out["enc_util_pct"] = enc[0]
    dec = call("nvmlDeviceGetDecoderUtilization", handle)
    if dec is not ABSENT:
        out["dec_util_pct"] = dec[0]

    processes: list[dict[str, Any]] = []
    for kind, fn in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                     ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        procs = call(fn, handle)
        if procs is ABSENT:
            continue
        for proc in procs:
            used = getattr(proc, "usedGpuMemory", None)
            processes.append({"pid": int(proc.pid), "used_mib": None if used is None else round(used / MIB, 3),
                              "type": kind})
    out["processes"] = processes
    return out
