"""What GPUs this node has: read once per NVML init, cheap to keep.

:func:`read_inventory` (blocking; call it in a thread) returns a :class:`NodeInventory`:
driver and CUDA versions plus one :class:`GpuInfo` per GPU. A field NVML does not
support on a GPU is ``None`` and left out of :meth:`GpuInfo.to_dict`.

Memory bandwidth (GB/s) is derived, as nvidia-smi and vendors do::

    bandwidth = bus_width_bits / 8 * max_memory_clock_MHz * 1e6 * 2 / 1e9

The factor 2 is the double data rate: NVML reports the memory clock at which data
moves on both edges (HBM, and GDDR6/6X as NVML reports it). Check: A100 40GB has a
5120-bit bus at 1215 MHz -> 1555 GB/s; RTX 3090 384 bits at 9751 MHz -> 936 GB/s,
the data-sheet figures.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from anex_agent.gpu.gpm import query_support as query_gpm_support
from anex_agent.gpu.nvml import ABSENT, DeviceFailure, Nvml, text

DDR_FACTOR = 2  # data transfers per memory clock (double data rate)

# Names of GPUs built as SXM modules whose NVML name does not say "SXM".
_SXM_NAMES = ("H100 80GB HBM3", "H100 SXM", "H200", "H20", "B200", "B100", "GB200", "GH200", "H800")
_PCIE_HINTS = ("PCIE", "NVL")


def memory_bandwidth_gbps(bus_width_bits: int | None, max_mem_clock_mhz: int | None) -> float | None:
    """Peak memory bandwidth in GB/s (10^9 bytes/s) from bus width and max memory clock; None if unknown."""
    if not bus_width_bits or not max_mem_clock_mhz:
        return None
    return round(bus_width_bits / 8 * max_mem_clock_mhz * 1e6 * DDR_FACTOR / 1e9, 1)


def guess_form_factor(name: str) -> str:
    """"sxm" or "pcie" from the NVML product name (NVML has no form-factor query)."""
    upper = name.upper()
    if "SXM" in upper:
        return "sxm"
    if any(hint in upper for hint in _PCIE_HINTS):
        return "pcie"
    if any(sxm.upper() in upper for sxm in _SXM_NAMES):
        return "sxm"
    return "pcie"


def cuda_version_text(value: int | None) -> str | None:
    """NVML's CUDA driver version integer (12040) as "12.4"."""
    if not value:
        return None
    return f"{value // 1000}.{(value % 1000) // 10}"


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str
    uuid: str
    pci_bus_id: str
    memory_total_bytes: int | None = None
    compute_capability: str | None = None
    memory_bus_width_bits: int | None = None
    max_memory_clock_mhz: int | None = None
    memory_bandwidth_gbps: float | None = None
    pcie_max_gen: int | None = None
    pcie_max_width: int | None = None
    pcie_gen: int | None = None
    pcie_width: int | None = None
    power_limit_w: float | None = None
    mig_mode: str | None = None  # "enabled" | "disabled"
    form_factor: str = "pcie"
    #: profiling metrics through NVML GPM: "supported" (Hopper and newer) | "unsupported"
    gpm: str | None = None

    @property
    def device(self) -> str:
        """dcgm-exporter's ``device`` label: the device node name."""
        return f"nvidia{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


@dataclass(frozen=True)
class NodeInventory:
    driver_version: str | None = None
    cuda_version: str | None = None
    nvml_version: str | None = None
    gpus: tuple[GpuInfo, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            k: v for k, v in (("driver_version", self.driver_version), ("cuda_version", self.cuda_version),
                              ("nvml_version", self.nvml_version)) if v is not None
        }
        out["gpu_count"] = len(self.gpus)
        out["gpus"] = [g.to_dict() for g in self.gpus]
        return out


def _opt(value: Any) -> Any:
    return None if value is ABSENT else value


def _read_gpu(nvml: Nvml, index: int, handle: Any) -> GpuInfo:
    m = nvml.module
    name = text(nvml.call("nvmlDeviceGetName", handle))
    uuid = text(nvml.call("nvmlDeviceGetUUID", handle))
    pci = nvml.call("nvmlDeviceGetPciInfo", handle)
    bus_id = text(pci.busId) if pci is not ABSENT else ""
    memory = nvml.call("nvmlDeviceGetMemoryInfo", handle)
    cc = nvml.call("nvmlDeviceGetCudaComputeCapability", handle)
    bus_width = _opt(nvml.call("nvmlDeviceGetMemoryBusWidth", handle))
    max_mem_clock = _opt(nvml.call("nvmlDeviceGetMaxClockInfo", handle, m.NVML_CLOCK_MEM))
    max_gen = _opt(nvml.call("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle))
    if max_gen is None:
        max_gen = _opt(nvml.call("nvmlDeviceGetMaxPcieLinkGeneration", handle))
    power_limit = _opt(nvml.call("nvmlDeviceGetEnforcedPowerLimit", handle))
    if power_limit is None:
        power_limit = _opt(nvml.call("nvmlDeviceGetPowerManagementLimit", handle))
    mig = nvml.call("nvmlDeviceGetMigMode", handle)
    return GpuInfo(
        index=index,
        name=name,
        uuid=uuid,
        pci_bus_id=bus_id,
        memory_total_bytes=None if memory is ABSENT else int(memory.total),
        compute_capability=None if cc is ABSENT else f"{cc[0]}.{cc[1]}",
        memory_bus_width_bits=bus_width,
        max_memory_clock_mhz=max_mem_clock,
        memory_bandwidth_gbps=memory_bandwidth_gbps(bus_width, max_mem_clock),
        pcie_max_gen=max_gen,
        pcie_max_width=_opt(nvml.call("nvmlDeviceGetMaxPcieLinkWidth", handle)),
        pcie_gen=_opt(nvml.call("nvmlDeviceGetCurrPcieLinkGeneration", handle)),
        pcie_width=_opt(nvml.call("nvmlDeviceGetCurrPcieLinkWidth", handle)),
        power_limit_w=None if power_limit is None else power_limit / 1000.0,  # NVML: milliwatts
        mig_mode=None if mig is ABSENT else ("enabled" if mig[0] == m.NVML_DEVICE_MIG_ENABLE else "disabled"),
        form_factor=guess_form_factor(name),
        gpm=query_gpm_support(nvml, handle),
    )


def read_inventory(nvml: Nvml) -> tuple[NodeInventory, list[Any], dict[int, str]]:
    """Read the inventory (blocking). Returns (inventory, handles by index, failures by index).

    A GPU whose queries fail with GPU-lost / reset-required is listed in failures
    (index -> reason) instead of the inventory. Raises ``NvmlUnavailable`` when NVML
    as a whole fails.
    """
    driver = nvml.call("nvmlSystemGetDriverVersion")
    cuda = nvml.call("nvmlSystemGetCudaDriverVersion")
    nvml_version = nvml.call("nvmlSystemGetNVMLVersion")
    count = nvml.call("nvmlDeviceGetCount")
    gpus: list[GpuInfo] = []
    handles: list[Any] = []
    failures: dict[int, str] = {}
    for index in range(0 if count is ABSENT else int(count)):
        try:
            handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
            gpus.append(_read_gpu(nvml, index, handle))
            handles.append(handle)
        except DeviceFailure as failure:
            failures[index] = failure.status.state.value
    inventory = NodeInventory(
        driver_version=None if driver is ABSENT else text(driver),
        cuda_version=cuda_version_text(_opt(cuda)),
        nvml_version=None if nvml_version is ABSENT else text(nvml_version),
        gpus=tuple(gpus),
    )
    return inventory, handles, failures
