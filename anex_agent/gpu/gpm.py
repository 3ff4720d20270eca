"""Profiling metrics through NVML's GPU Performance Monitoring (GPM) interface, Hopper and newer.

GPM computes its metrics from two samples of the GPU's counters taken some time apart
(``nvmlGpmSampleGet`` twice, then ``nvmlGpmMetricsGet`` on the pair). :class:`GpmSampler`
takes exactly one sample per GPU in each of the monitor's sampling cycles and keeps it:
the metrics of a cycle are computed between the previous cycle's sample and this one, so
the interval is the sampling interval itself (15 s by default). No second thread, no
sleep between two samples, two sample buffers per GPU allocated once and swapped.

Contract:

* Blocking (NVML); called from the monitor's sampler thread, like everything in
  :mod:`anex_agent.gpu.sampler`.
* :func:`query_support` (once per GPU per NVML init, with the inventory) says
  ``"supported"`` or ``"unsupported"`` (``nvmlGpmQueryDeviceSupport``: isSupportedDevice
  0, NOT_SUPPORTED, or a driver/pynvml without the function). The monitor samples only
  supported GPUs; an unsupported GPU gets no profiling field: nothing is made up for it.
* :meth:`GpmSampler.sample` returns the profiling fields of one GPU (keys below), or
  ``{}`` on the first cycle (one sample only), when the two samples are closer than
  :data:`MIN_INTERVAL` (NVML refreshes its counters about every 100 ms; a sooner call
  keeps the previous sample), or when NVML refuses the pair. A metric NVML reports as
  not available (its ``nvmlReturn`` is not SUCCESS, e.g. NVLink on a GPU without links)
  is left out.
* GPU-lost / reset-required raise :class:`~anex_agent.gpu.nvml.DeviceFailure` and a
  broken NVML :class:`~anex_agent.gpu.nvml.NvmlUnavailable`, through ``Nvml.call``.
* :meth:`GpmSampler.reset` frees every sample buffer (``nvmlGpmSampleFree``); call it
  on a new NVML generation and at shutdown, before ``nvmlShutdown``.

Keys and units (DCGM's units, converted here once):

======================  =================================  ==========================================
key                     NVML GPM metric                    unit
======================  =================================  ==========================================
``gr_engine_active``    NVML_GPM_METRIC_GRAPHICS_UTIL      ratio 0-1 (NVML: percent 0-100)
``sm_active``           NVML_GPM_METRIC_SM_UTIL            ratio 0-1
``sm_occupancy``        NVML_GPM_METRIC_SM_OCCUPANCY       ratio 0-1
``tensor_active``       NVML_GPM_METRIC_ANY_TENSOR_UTIL    ratio 0-1
``dram_active``         NVML_GPM_METRIC_DRAM_BW_UTIL       ratio 0-1
``pcie_tx_bps``         NVML_GPM_METRIC_PCIE_TX_PER_SEC    bytes/s (NVML: MiB/s)
``pcie_rx_bps``         NVML_GPM_METRIC_PCIE_RX_PER_SEC    bytes/s (NVML: MiB/s)
``nvlink_tx_bps``       NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC  bytes/s, all links (NVML: MiB/s)
``nvlink_rx_bps``       NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC  bytes/s, all links (NVML: MiB/s)
======================  =================================  ==========================================

Sources for the units: nvml.h / nvidia-ml-py ``pynvml.py`` comment every utilisation
metric "0.0 - 100.0" and every ``*_PER_SEC`` metric "in MiB/sec"; dcgm-exporter's
``etc/dcp-metrics-included.csv`` documents ``DCGM_FI_PROF_*_ACTIVE`` as "Ratio of ..."
and ``DCGM_FI_PROF_PCIE_TX_BYTES`` / ``DCGM_FI_PROF_NVLINK_TX_BYTES`` as "in bytes per
second". Hence /100 for the ratios and x 1024 x 1024 for the rates.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Callable

from anex_agent.gpu.nvml import ABSENT, Nvml

MIB = 1024 * 1024
#: NVML's documented minimum between the two samples of a pair (its counters refresh every ~100 ms)
MIN_INTERVAL = 0.1
SUPPORTED = "supported"
UNSUPPORTED = "unsupported"

_PERCENT = 0.01  # percent 0-100 -> ratio 0-1

#: (sample key, pynvml constant name, scale)
METRICS: tuple[tuple[str, str, float], ...] = (
    ("gr_engine_active", "NVML_GPM_METRIC_GRAPHICS_UTIL", _PERCENT),
    ("sm_active", "NVML_GPM_METRIC_SM_UTIL", _PERCENT),
    ("sm_occupancy", "NVML_GPM_METRIC_SM_OCCUPANCY", _PERCENT),
    ("tensor_active", "NVML_GPM_METRIC_ANY_TENSOR_UTIL", _PERCENT),
    ("dram_active", "NVML_GPM_METRIC_DRAM_BW_UTIL", _PERCENT),
    ("pcie_tx_bps", "NVML_GPM_METRIC_PCIE_TX_PER_SEC", MIB),
    ("pcie_rx_bps", "NVML_GPM_METRIC_PCIE_RX_PER_SEC", MIB),
    ("nvlink_tx_bps", "NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", MIB),
    ("nvlink_rx_bps", "NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", MIB),
)


@dataclass
class _GpuState:
    """Two sample buffers per GPU: ``previous`` holds the last cycle's sample, ``spare`` is filled next."""

    previous: Any = None
    spare: Any = None
    previous_at: float | None = None
    request: Any = None  # the c_nvmlGpmMetricsGet_t, allocated once (its metrics array is ~20 KB)
    generation: int = 0  # the NVML init the buffers were allocated under


def query_support(nvml: Nvml, handle: Any) -> str:
    """``"supported"`` or ``"unsupported"``: ``nvmlGpmQueryDeviceSupport`` (read once, with the inventory).

    Unsupported: isSupportedDevice 0 (before Hopper), NOT_SUPPORTED, or a driver or pynvml
    without GPM (FUNCTION_NOT_FOUND / no such function)."""
    result = nvml.call("nvmlGpmQueryDeviceSupport", handle)
    return SUPPORTED if result is not ABSENT and bool(getattr(result, "isSupportedDevice", 0)) else UNSUPPORTED


class GpmSampler:
    """One GPM sample per GPU per cycle, metrics against the previous cycle's sample."""

    def __init__(self, nvml: Nvml, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.nvml = nvml
        self._clock = clock
        self._states: dict[int, _GpuState] = {}
        self._disabled: set[int] = set()  # sampling answered "not supported" after all: not asked again

    # ------------------------------------------------------------------ the cycle

    def sample(self, index: int, handle: Any) -> dict[str, float]:
        """This cycle's GPM sample of GPU ``index``; the metrics since the previous cycle, or ``{}``."""
        if index in self._disabled:
            return {}
        state = self._states.get(index)
        if state is None:
            state = self._states[index] = _GpuState(generation=self.nvml.generation)
        now = self._clock()
        if state.previous_at is not None and now - state.previous_at < MIN_INTERVAL:
            return {}  # too soon for a meaningful pair: keep the previous sample for the next cycle
        if state.spare is None:
            spare = self.nvml.call("nvmlGpmSampleAlloc")
            if spare is ABSENT:
                self._disabled.add(index)
                return {}
            state.spare = spare
        taken = self.nvml.call("nvmlGpmSampleGet", handle, state.spare)
        if taken is ABSENT:
            self._disabled.add(index)
            return {}
        out: dict[str, float] = {}
        if state.previous is not None and state.previous_at is not None:
            out = self._metrics(state, state.previous, state.spare)
        state.previous, state.spare, state.previous_at = state.spare, state.previous, now
        return out

    def _metrics(self, state: _GpuState, first: Any, second: Any) -> dict[str, float]:
        m = self.nvml.module
        if state.request is None:
            request = m.c_nvmlGpmMetricsGet_t()
            request.version = m.NVML_GPM_METRICS_GET_VERSION
            ids = [(key, getattr(m, name, None), scale) for key, name, scale in METRICS]
            ids = [(key, metric_id, scale) for key, metric_id, scale in ids if metric_id is not None]
            request.numMetrics = len(ids)
            for i, (_key, metric_id, _scale) in enumerate(ids):
                request.metrics[i].metricId = metric_id
            state.request = (request, ids)
        request, ids = state.request
        request.sample1, request.sample2 = first, second
        result = self.nvml.call("nvmlGpmMetricsGet", request)
        if result is ABSENT:
            return {}
        out: dict[str, float] = {}
        for i, (key, _metric_id, scale) in enumerate(ids):
            metric = result.metrics[i]
            if metric.nvmlReturn != 0:
                continue
            value = float(metric.value)
            if not math.isfinite(value) or value < 0:  # NaN, infinite or negative: not a reading
                continue
            out[key] = round(value * scale, 4) if scale < 1 else round(value * scale)
        return out

    # ------------------------------------------------------------------ lifetime

    def reset(self) -> None:
        """Free every sample buffer (new NVML generation or shutdown).

        Buffers allocated under an earlier NVML init (NVML failed and was initialised again) are
        dropped, not handed back to an NVML session that did not allocate them."""
        states, self._states = self._states, {}
        self._disabled = set()
        for state in states.values():
            if state.generation != self.nvml.generation:
                continue
            for buffer in (state.previous, state.spare):
                if buffer is None:
                    continue
                try:
                    self.nvml.call("nvmlGpmSampleFree", buffer)
                except Exception:  # best effort: NVML may already be gone
                    pass

    def forget(self, index: int) -> None:
        """Drop GPU ``index``'s previous sample (it failed this cycle): the next cycle starts a new pair."""
        state = self._states.get(index)
        if state is not None:
            state.previous_at = None
