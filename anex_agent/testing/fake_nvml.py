"""A fake ``pynvml`` module for machines without a GPU, cut at the pynvml function boundary.

Built from the real nvidia-ml-py module: every constant (``NVML_*``, ``nvmlEventType*``,
``nvmlClocksEventReason*``), structure (``c_nvmlMemory_t``, ``c_nvmlMemory_v2_t``,
``c_nvmlUtilization_t``, ``nvmlPciInfo_t``, ``c_nvmlFieldValue_t``,
``c_nvmlEventData_t``...) and the ``NVMLError`` class tree is the real one; only the
``nvml*`` functions are replaced, with the real signatures and return shapes, backed
by :class:`FakeGpu` records. Errors are raised the way pynvml raises them,
``pynvml.NVMLError(code)``, which maps the code to its subclass
(``NVMLError_LibRmVersionMismatch``...). Device handles are real ``c_nvmlDevice_t``
pointers (with fake addresses), so event data carries them as NVML does.

Install with ``monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(...).module)``.
"""

from __future__ import annotations

import ctypes
import queue
import threading
import types
from dataclasses import dataclass, field
from typing import Any

import pynvml as real

_BASE_ADDRESS = 0x1000


@dataclass
class FakeGpu:
    name: str = "NVIDIA A100-SXM4-40GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:07:00.0"
    total: int = 40960 * 1024 * 1024  # bytes
    used: int = 1024 * 1024 * 1024
    reserved: int = 512 * 1024 * 1024
    cc: tuple[int, int] = (8, 0)
    bus_width: int = 5120
    max_mem_clock: int = 1215
    max_gen: int = 4
    max_width: int = 16
    gen: int = 4
    width: int = 16
    power_limit_mw: int = 400_000
    mig: int = 0
    util: tuple[int, int] = (37, 12)
    temp: int = 41
    mem_temp: int = 44
    power_mw: int = 85_123
    energy_mj: int = 123_456_789
    sm_clock: int = 1410
    mem_clock: int = 1215
    pcie_tx_kbps: int = 2000
    pcie_rx_kbps: int = 3000
    replay: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=lambda: {(0, 0): 3, (1, 0): 0, (0, 1): 10, (1, 1): 0})
    remapped: tuple[int, int, int, int] = (0, 0, 0, 0)
    throttle: int = 0x4  # sw power cap
    enc: int = 0
    dec: int = 0
    processes: list[tuple[int, int]] = field(default_factory=lambda: [(4242, 2 * 1024 * 1024 * 1024)])
    #: NVLink throughput counters since driver load, KiB, all links (NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX/RX
    #: with scopeId UINT_MAX); None: no NVLink (the fields answer NOT_SUPPORTED)
    nvlink_raw_kib: tuple[int, int] | None = None
    #: GPM (Hopper and newer): nvmlGpmQueryDeviceSupport says isSupportedDevice=1
    gpm: bool = False
    #: GPM metric id -> the value nvmlGpmMetricsGet reports (NVML's units: percent 0-100, MiB/s);
    #: an id not listed answers NOT_SUPPORTED in its nvmlReturn
    gpm_metrics: dict[int, float] = field(default_factory=lambda: {
        real.NVML_GPM_METRIC_GRAPHICS_UTIL: 81.5, real.NVML_GPM_METRIC_SM_UTIL: 64.0,
        real.NVML_GPM_METRIC_SM_OCCUPANCY: 32.25, real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: 42.0,
        real.NVML_GPM_METRIC_DRAM_BW_UTIL: 55.5, real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: 1500.0,
        real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: 2500.0, real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: 10000.0,
        real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: 12000.0})
    #: function name -> NVML error code raised by that function on this GPU
    errors: dict[str, int] = field(default_factory=dict)


class FakeNvml:
    """State behind the fake module. Mutate ``gpus``, ``init_error``, ``fail_all`` in tests."""

    def __init__(self, gpus: list[FakeGpu] | None = None, *, driver: str = "550.54.15", cuda: int = 12040) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.driver = driver
        self.cuda = cuda
        self.init_error: int | None = None  # nvmlInit raises this code
        self.fail_all: int | None = None  # every call after init raises this code
        self.initialised = 0
        self.init_calls = 0
        self.shutdown_calls = 0
        self.calls: dict[str, int] = {}
        self.events: "queue.Queue[tuple[int, int, int]]" = queue.Queue()  # (gpu index, event type, data)
        self.registered: dict[int, set[int]] = {}  # event set id -> gpu indexes
        self.freed_sets: list[int] = []
        self._lock = threading.Lock()
        #: GPM sample buffers: address -> (gpu index, sample number) once filled by nvmlGpmSampleGet, else None
        self.gpm_buffers: dict[int, tuple[int, int] | None] = {}
        self.gpm_freed: list[int] = []
        self._gpm_next = 0
        self.module = self._build()

    # ------------------------------------------------------------------ helpers

    def handle(self, index: int) -> Any:
        return ctypes.cast(ctypes.c_void_p(_BASE_ADDRESS + index), real.c_nvmlDevice_t)

    def _index(self, handle: Any) -> int:
        address = ctypes.cast(handle, ctypes.c_void_p).value or 0
        index = address - _BASE_ADDRESS
        if not 0 <= index < len(self.gpus):
            raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
        return index

    def push_xid(self, index: int, xid: int) -> None:
        self.events.put((index, real.nvmlEventTypeXidCriticalError, xid))

    def _enter(self, name: str, handle: Any = None) -> FakeGpu | None:
        with self._lock:
            self.calls[name] = self.calls.get(name, 0) + 1
        if not self.initialised:
            raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
        if self.fail_all is not None:
            raise real.NVMLError(self.fail_all)
        if handle is None:
            return None
        gpu = self.gpus[self._index(handle)]
        if name in gpu.errors:
            raise real.NVMLError(gpu.errors[name])
        return gpu

    # ------------------------------------------------------------------ the module

    def _build(self) -> types.ModuleType:
        m = types.ModuleType("pynvml")
        for key, value in vars(real).items():
            if key.startswith("__"):
                continue
            if callable(value) and not isinstance(value, type) and key.startswith("nvml"):
                continue  # functions are replaced below
            setattr(m, key, value)
        m.__fake__ = self
        s = self

        def nvmlInit() -> None:
            s.init_calls += 1
            if s.init_error is not None:
                raise real.NVMLError(s.init_error)
            s.initialised += 1

        def nvmlShutdown() -> None:
            s.shutdown_calls += 1
            if not s.initialised:
                raise real.NVMLError(real.NVML_ERROR_UNINITIALIZED)
            s.initialised -= 1

        def nvmlSystemGetDriverVersion() -> str:
            s._enter("nvmlSystemGetDriverVersion")
            return s.driver

        def nvmlSystemGetCudaDriverVersion() -> int:
            s._enter("nvmlSystemGetCudaDriverVersion")
            return s.cuda

        def nvmlSystemGetNVMLVersion() -> str:
            s._enter("nvmlSystemGetNVMLVersion")
            return "12." + s.driver

        def nvmlDeviceGetCount() -> int:
            s._enter("nvmlDeviceGetCount")
            return len(s.gpus)

        def nvmlDeviceGetHandleByIndex(index: int) -> Any:
            s._enter("nvmlDeviceGetHandleByIndex")
            if not 0 <= index < len(s.gpus):
                raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
            gpu = s.gpus[index]
            if "nvmlDeviceGetHandleByIndex" in gpu.errors:
                raise real.NVMLError(gpu.errors["nvmlDeviceGetHandleByIndex"])
            return s.handle(index)

        def simple(name: str, getter: Any) -> None:
            def fn(handle: Any, *args: Any) -> Any:
                gpu = s._enter(name, handle)
                return getter(gpu, *args)

            fn.__name__ = name
            setattr(m, name, fn)

        simple("nvmlDeviceGetName", lambda g: g.name)
        simple("nvmlDeviceGetUUID", lambda g: g.uuid)
        simple("nvmlDeviceGetPciInfo", lambda g: real.nvmlPciInfo_t(busId=g.bus_id.encode(),
                                                                     busIdLegacy=g.bus_id.encode()[:16]))
        simple("nvmlDeviceGetCudaComputeCapability", lambda g: g.cc)
        simple("nvmlDeviceGetMemoryBusWidth", lambda g: g.bus_width)
        simple("nvmlDeviceGetMaxClockInfo", lambda g, t: {real.NVML_CLOCK_MEM: g.max_mem_clock}.get(t, 1980))
        simple("nvmlDeviceGetGpuMaxPcieLinkGeneration", lambda g: g.max_gen)
        simple("nvmlDeviceGetMaxPcieLinkGeneration", lambda g: g.max_gen)
        simple("nvmlDeviceGetMaxPcieLinkWidth", lambda g: g.max_width)
        simple("nvmlDeviceGetCurrPcieLinkGeneration", lambda g: g.gen)
        simple("nvmlDeviceGetCurrPcieLinkWidth", lambda g: g.width)
        simple("nvmlDeviceGetEnforcedPowerLimit", lambda g: g.power_limit_mw)
        simple("nvmlDeviceGetPowerManagementLimit", lambda g: g.power_limit_mw)
        simple("nvmlDeviceGetMigMode", lambda g: [g.mig, g.mig])
        simple("nvmlDeviceGetUtilizationRates", lambda g: real.c_nvmlUtilization_t(gpu=g.util[0], memory=g.util[1]))

        def memory(g: FakeGpu, version: int | None = None) -> Any:
            if version:
                if version != real.nvmlMemory_v2:
                    raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
                mem = real.c_nvmlMemory_v2_t(total=g.total, reserved=g.reserved, used=g.used,
                                             free=g.total - g.reserved - g.used)
                mem.version = version
                return mem
            return real.c_nvmlMemory_t(total=g.total, used=g.used + g.reserved, free=g.total - g.used - g.reserved)

        simple("nvmlDeviceGetMemoryInfo", memory)
        simple("nvmlDeviceGetTemperature", lambda g, sensor: g.temp)

        def field_values(g: FakeGpu, ids: list[int]) -> Any:
            values = (real.c_nvmlFieldValue_t * len(ids))()
            for i, fid in enumerate(ids):
                if isinstance(fid, tuple):  # (fieldId, scopeId), as pynvml accepts
                    fid, values[i].scopeId = fid
                values[i].fieldId = fid
                if fid == real.NVML_FI_DEV_MEMORY_TEMP and g.mem_temp is not None:
                    values[i].valueType = real.NVML_VALUE_TYPE_UNSIGNED_INT
                    values[i].value.uiVal = g.mem_temp
                    values[i].nvmlReturn = real.NVML_SUCCESS
                elif fid in (real.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX, real.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_RX) \
                        and g.nvlink_raw_kib is not None and values[i].scopeId == 0xFFFFFFFF:
                    values[i].valueType = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
                    tx, rx = g.nvlink_raw_kib
                    values[i].value.ullVal = tx if fid == real.NVML_FI_DEV_NVLINK_THROUGHPUT_RAW_TX else rx
                    values[i].nvmlReturn = real.NVML_SUCCESS
                else:
                    values[i].nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
            return values

        simple("nvmlDeviceGetFieldValues", field_values)
        simple("nvmlDeviceGetPowerUsage", lambda g: g.power_mw)
        simple("nvmlDeviceGetTotalEnergyConsumption", lambda g: g.energy_mj)
        simple("nvmlDeviceGetClockInfo", lambda g, t: {real.NVML_CLOCK_SM: g.sm_clock, real.NVML_CLOCK_MEM: g.mem_clock}[t])
        simple("nvmlDeviceGetPcieThroughput",
               lambda g, c: {real.NVML_PCIE_UTIL_TX_BYTES: g.pcie_tx_kbps, real.NVML_PCIE_UTIL_RX_BYTES: g.pcie_rx_kbps}[c])
        simple("nvmlDeviceGetPcieReplayCounter", lambda g: g.replay)
        simple("nvmlDeviceGetTotalEccErrors", lambda g, err, counter: g.ecc[(err, counter)])
        simple("nvmlDeviceGetRemappedRows", lambda g: g.remapped)
        simple("nvmlDeviceGetCurrentClocksEventReasons", lambda g: g.throttle)
        simple("nvmlDeviceGetCurrentClocksThrottleReasons", lambda g: g.throttle)
        simple("nvmlDeviceGetEncoderUtilization", lambda g: [g.enc, 167000])
        simple("nvmlDeviceGetDecoderUtilization", lambda g: [g.dec, 167000])

        def processes(g: FakeGpu) -> list[Any]:
            return [real.nvmlStructToFriendlyObject(real.c_nvmlProcessInfo_v3_t(pid=pid, usedGpuMemory=used))
                    for pid, used in g.processes]

        simple("nvmlDeviceGetComputeRunningProcesses", processes)
        simple("nvmlDeviceGetGraphicsRunningProcesses", lambda g: [])

        def nvmlDeviceRegisterEvents(handle: Any, event_types: int, event_set: Any) -> None:
            s._enter("nvmlDeviceRegisterEvents", handle)
            s.registered.setdefault(id(event_set), set()).add(s._index(handle))

        simple("nvmlDeviceGetSupportedEventTypes", lambda g: real.nvmlEventTypeXidCriticalError)

        def nvmlEventSetCreate() -> Any:
            s._enter("nvmlEventSetCreate")
            return real.c_nvmlEventSet_t()

        def nvmlEventSetWait(event_set: Any, timeoutms: int) -> Any:
            s._enter("nvmlEventSetWait")
            try:
                index, event_type, data = s.events.get(timeout=timeoutms / 1000)
            except queue.Empty:
                raise real.NVMLError(real.NVML_ERROR_TIMEOUT) from None
            if index not in s.registered.get(id(event_set), set()):
                raise real.NVMLError(real.NVML_ERROR_UNKNOWN)
            return real.c_nvmlEventData_t(device=s.handle(index), eventType=event_type, eventData=data)

        def nvmlEventSetFree(event_set: Any) -> None:
            s.freed_sets.append(id(event_set))

        # ---- GPM (nvml.h "GPM Functions"): opaque sample buffers, metrics from two samples of one GPU

        def gpm_support(g: FakeGpu) -> Any:
            support = real.c_nvmlGpmSupport_t()
            support.version = real.NVML_GPM_SUPPORT_VERSION
            support.isSupportedDevice = 1 if g.gpm else 0
            return support

        simple("nvmlGpmQueryDeviceSupport", gpm_support)

        def address(sample: Any) -> int:
            return ctypes.cast(sample, ctypes.c_void_p).value or 0

        def nvmlGpmSampleAlloc() -> Any:
            s._enter("nvmlGpmSampleAlloc")
            with s._lock:
                s._gpm_next += 1
                addr = 0x7000_0000 + 0x100 * s._gpm_next
                s.gpm_buffers[addr] = None
            return ctypes.cast(ctypes.c_void_p(addr), real.c_nvmlGpmSample_t)

        def nvmlGpmSampleFree(sample: Any) -> None:
            s._enter("nvmlGpmSampleFree")
            addr = address(sample)
            if addr not in s.gpm_buffers:
                raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
            del s.gpm_buffers[addr]
            s.gpm_freed.append(addr)

        def nvmlGpmSampleGet(handle: Any, sample: Any) -> Any:
            g = s._enter("nvmlGpmSampleGet", handle)
            if not g.gpm:
                raise real.NVMLError(real.NVML_ERROR_NOT_SUPPORTED)
            addr = address(sample)
            if addr not in s.gpm_buffers:
                raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
            s.gpm_buffers[addr] = (s._index(handle), s.calls["nvmlGpmSampleGet"])
            return sample

        def nvmlGpmMetricsGet(request: Any) -> Any:
            s._enter("nvmlGpmMetricsGet")
            if request.version != real.NVML_GPM_METRICS_GET_VERSION:
                raise real.NVMLError(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
            first, second = s.gpm_buffers.get(address(request.sample1)), s.gpm_buffers.get(address(request.sample2))
            # two filled samples of the same GPU, the second one later: anything else is refused
            if first is None or second is None or first[0] != second[0] or second[1] <= first[1]:
                raise real.NVMLError(real.NVML_ERROR_INVALID_ARGUMENT)
            g = s.gpus[first[0]]
            if "nvmlGpmMetricsGet" in g.errors:
                raise real.NVMLError(g.errors["nvmlGpmMetricsGet"])
            for i in range(request.numMetrics):
                metric = request.metrics[i]
                if metric.metricId in g.gpm_metrics:
                    metric.value = g.gpm_metrics[metric.metricId]
                    metric.nvmlReturn = real.NVML_SUCCESS
                else:
                    metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
            return request

        for fn in (nvmlGpmSampleAlloc, nvmlGpmSampleFree, nvmlGpmSampleGet, nvmlGpmMetricsGet):
            setattr(m, fn.__name__, fn)

        for fn in (nvmlInit, nvmlShutdown, nvmlSystemGetDriverVersion, nvmlSystemGetCudaDriverVersion,
                   nvmlSystemGetNVMLVersion, nvmlDeviceGetCount, nvmlDeviceGetHandleByIndex,
                   nvmlDeviceRegisterEvents, nvmlEventSetCreate, nvmlEventSetWait, nvmlEventSetFree):
            setattr(m, fn.__name__, fn)
        return m
