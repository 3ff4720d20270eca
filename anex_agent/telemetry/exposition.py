"""Prometheus rendering of telemetry blocks: dcgm-exporter's metric names and labels, plus ``anex_*`` metrics.

The agent's ``/metrics`` (:mod:`anex_agent.gpu.exposition`) and the coordinator's fleet
``/metrics`` (:mod:`anex_agent.coordinator.routes.fleet_metrics`) render the same telemetry
blocks (:class:`anex_agent.telemetry.models.Telemetry`) through :func:`metric_families`, so one
node looks the same in both places (the coordinator adds a ``node`` label). It lives beside
the wire models because both roles use it.

Names follow dcgm-exporter's ``etc/default-counters.csv`` (plus a few DCGM fields it
ships commented out: ECC totals, FB reserved, row-remap pending, throttle reasons, SM
active/occupancy, NVLink TX/RX bytes), with its labels ``gpu``, ``UUID``, ``pci_bus_id``,
``device``, ``modelName``, ``hostname`` (``Hostname`` by option, see
:mod:`anex_agent.telemetry.options`), so existing Grafana dashboards work unchanged. Units
are DCGM's: MiB, MHz, °C, W, mJ, %, ratios 0-1 for the profiling metrics, bytes/s.
``DCGM_FI_PROF_PCIE_{TX,RX}_BYTES`` come from GPM where the GPU has it, else from NVML's
PCIe throughput counter (KB/s over a 20 ms window, x 1024); the deprecated
``DCGM_FI_DEV_PCIE_{TX,RX}_THROUGHPUT`` (KB/s) only by option. The fields the CSV types as counters are
exposed as ``untyped``: prometheus_client would rename a counter to ``<name>_total``
and break the dashboards' queries; PromQL does not check types, so ``rate()`` works.

Input: a block's JSON form (``Telemetry.as_sent()``, which is what the coordinator
stores) or a :class:`~anex_agent.telemetry.models.Telemetry`. The coordinator renders the JSON it
cached without validating it again; a value not of the documented shape (a block stored by
an older coordinator) is skipped, not an error.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, UntypedMetricFamily

from anex_agent.telemetry.models import VERDICTS, Telemetry, classify_xid
from anex_agent.telemetry.options import DEFAULT as DEFAULT_OPTIONS
from anex_agent.telemetry.options import ExpositionOptions

#: dcgm-exporter's GPU labels (its current release; see :mod:`anex_agent.telemetry.options` for ``Hostname``)
GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "hostname")

# (DCGM name, sample key, "gauge"|"untyped", help) -- help texts after default-counters.csv and
# dcp-metrics-included.csv
DCGM_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("DCGM_FI_DEV_SM_CLOCK", "sm_clock_mhz", "gauge", "SM clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEM_CLOCK", "mem_clock_mhz", "gauge", "Memory clock frequency (in MHz)."),
    ("DCGM_FI_DEV_MEMORY_TEMP", "mem_temp_c", "gauge", "Memory temperature (in C)."),
    ("DCGM_FI_DEV_GPU_TEMP", "gpu_temp_c", "gauge", "GPU temperature (in C)."),
    ("DCGM_FI_DEV_POWER_USAGE", "power_w", "gauge", "Power draw (in W)."),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "energy_mj", "untyped", "Total energy consumption since boot (in mJ)."),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "pcie_replay", "untyped", "Total number of PCIe retries."),
    ("DCGM_FI_DEV_GPU_UTIL", "gpu_util_pct", "gauge", "GPU utilization (in %)."),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "mem_copy_util_pct", "gauge", "Memory utilization (in %)."),
    ("DCGM_FI_DEV_ENC_UTIL", "enc_util_pct", "gauge", "Encoder utilization (in %)."),
    ("DCGM_FI_DEV_DEC_UTIL", "dec_util_pct", "gauge", "Decoder utilization (in %)."),
    ("DCGM_FI_DEV_XID_ERRORS", "last_xid", "gauge", "Value of the last XID error encountered."),
    ("DCGM_FI_DEV_FB_FREE", "fb_free_mib", "gauge", "Framebuffer memory free (in MiB)."),
    ("DCGM_FI_DEV_FB_USED", "fb_used_mib", "gauge", "Framebuffer memory used (in MiB)."),
    ("DCGM_FI_DEV_FB_RESERVED", "fb_reserved_mib", "gauge", "Framebuffer memory reserved (in MiB)."),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "nvlink_bandwidth_mbps", "gauge",
     "Total NVLink bandwidth, TX + RX over all links (in MB/s)."),
    ("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "ecc_sbe_vol", "untyped", "Total number of single-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "ecc_dbe_vol", "untyped", "Total number of double-bit volatile ECC errors."),
    ("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "ecc_sbe_agg", "untyped", "Total number of single-bit persistent ECC errors."),
    ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "ecc_dbe_agg", "untyped", "Total number of double-bit persistent ECC errors."),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "remapped_rows_unc", "untyped",
     "Number of remapped rows for uncorrectable errors"),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "remapped_rows_corr", "untyped",
     "Number of remapped rows for correctable errors"),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "remap_failure", "gauge", "Whether remapping of rows has failed"),
    ("DCGM_FI_DEV_ROW_REMAP_PENDING", "remap_pending", "gauge", "Whether remapping of rows is pending a GPU reset"),
    ("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "throttle_mask", "gauge", "Current clock throttle reasons (bitmask)."),
    # profiling metrics (NVML GPM, Hopper and newer; see anex_agent.gpu.gpm for the unit conversions)
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gr_engine_active", "gauge", "Ratio of time the graphics engine is active."),
    ("DCGM_FI_PROF_SM_ACTIVE", "sm_active", "gauge", "The ratio of cycles an SM has at least 1 warp assigned."),
    ("DCGM_FI_PROF_SM_OCCUPANCY", "sm_occupancy", "gauge", "The ratio of number of warps resident on an SM."),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "tensor_active", "gauge", "Ratio of cycles the tensor (HMMA) pipe is active."),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "dram_active", "gauge",
     "Ratio of cycles the device memory interface is active sending or receiving data."),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "pcie_tx_bytes_per_s", "gauge",
     "The rate of data transmitted over the PCIe bus - including both protocol headers and data payloads - "
     "in bytes per second."),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "pcie_rx_bytes_per_s", "gauge",
     "The rate of data received over the PCIe bus - including both protocol headers and data payloads - "
     "in bytes per second."),
    ("DCGM_FI_PROF_NVLINK_TX_BYTES", "nvlink_tx_bps", "gauge", "The rate of data transmitted over NVLink, in bytes per second."),
    ("DCGM_FI_PROF_NVLINK_RX_BYTES", "nvlink_rx_bps", "gauge", "The rate of data received over NVLink, in bytes per second."),
)

#: deprecated in DCGM and dropped from dcgm-exporter's default counters: only with ExpositionOptions.pcie_throughput
LEGACY_PCIE_FIELDS: tuple[tuple[str, str, str, str], ...] = (
    ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "pcie_tx_kbps", "untyped", "PCIe TX throughput (in KB/s) via NVML."),
    ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", "pcie_rx_kbps", "untyped", "PCIe RX throughput (in KB/s) via NVML."),
)


def _pcie_bytes_per_s(gpu: Mapping[str, Any], direction: str) -> Any:
    """PCIe bytes/s: GPM's rate where the GPU has it, else NVML's throughput counter (KB/s over 20 ms) x 1024."""
    value = gpu.get(f"pcie_{direction}_bps")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    kbps = gpu.get(f"pcie_{direction}_kbps")
    if isinstance(kbps, (int, float)) and not isinstance(kbps, bool):
        return kbps * 1024
    return None


def _family(kind: str, name: str, doc: str, labels: list[str]) -> Metric:
    if kind == "gauge":
        return GaugeMetricFamily(name, doc, labels=labels)
    if kind == "counter":
        return CounterMetricFamily(name, doc, labels=labels)
    return UntypedMetricFamily(name, doc, labels=labels)


class _Families:
    """Metric families built lazily, in first-use order, all with the same extra label names."""

    def __init__(self) -> None:
        self.families: dict[str, Metric] = {}

    def add(self, kind: str, name: str, doc: str, labels: Mapping[str, str], value: float) -> None:
        family = self.families.get(name)
        if family is None:
            family = self.families[name] = _family(kind, name, doc, list(labels))
        family.add_metric([str(v) for v in labels.values()], float(value))


def metric_families(blocks: Iterable[tuple[Mapping[str, str], Mapping[str, Any] | Telemetry]],
                    options: ExpositionOptions = DEFAULT_OPTIONS) -> list[Metric]:
    """Metric families for telemetry blocks, each with extra labels (``{}`` on the agent, ``{"node": ...}`` on the coordinator).

    All blocks must carry the same extra label names. ``options`` picks the host label's spelling
    and whether the deprecated PCIe throughput pair is exposed too.
    """
    fields = DCGM_FIELDS + LEGACY_PCIE_FIELDS if options.pcie_throughput else DCGM_FIELDS
    blocks = [(extra, t.as_sent() if isinstance(t, Telemetry) else t) for extra, t in blocks]
    extra_names = list(blocks[0][0]) if blocks else []
    out = _Families()

    def add(kind: str, name: str, doc: str, labels: Mapping[str, str], value: Any, extra: Mapping[str, str]) -> None:
        if value is None or isinstance(value, (list, dict, str)):
            return
        out.add(kind, name, doc, {**labels, **extra}, value)

    for extra, t in blocks:
        extra = {k: extra[k] for k in extra_names}
        host_label = {options.host_label: str(t.get("hostname", ""))}
        inventory = t.get("inventory") or {}
        infos = {g.get("index"): g for g in inventory.get("gpus", [])}
        for gpu in t.get("gpus", []):
            info = infos.get(gpu.get("index"), {})
            labels = {
                "gpu": str(gpu.get("index", "")),
                "UUID": str(gpu.get("uuid", "")),
                "pci_bus_id": str(info.get("pci_bus_id", "")),
                "device": f"nvidia{gpu.get('index', '')}",
                "modelName": str(info.get("name", "")),
                **host_label,
            }
            values = {**gpu, "pcie_tx_bytes_per_s": _pcie_bytes_per_s(gpu, "tx"),
                      "pcie_rx_bytes_per_s": _pcie_bytes_per_s(gpu, "rx")}
            for name, key, kind, doc in fields:
                add(kind, name, doc, labels, values.get(key), extra)
            add("gauge", "anex_gpu_up", "1 when the GPU answers NVML, 0 when it is lost or needs a reset",
                labels, 1 if gpu.get("state", "ok") == "ok" else 0, extra)
            add("gauge", "anex_gpu_processes", "Processes using the GPU", labels, len(gpu.get("processes", [])), extra)
            for xid, count in sorted((gpu.get("xid_counts") or {}).items()):
                add("counter", "anex_gpu_xid_events", "XID events seen by the agent since it started",
                    {**labels, "xid": str(xid), "kind": classify_xid(int(xid))}, count, extra)
            if info:
                info_labels = {**labels,
                               "driver_version": str(inventory.get("driver_version", "")),
                               "cuda_version": str(inventory.get("cuda_version", "")),
                               "compute_capability": str(info.get("compute_capability", "")),
                               "form_factor": str(info.get("form_factor", "")),
                               "mig_mode": str(info.get("mig_mode", "")),
                               "gpm": str(info.get("gpm", ""))}
                add("gauge", "anex_gpu_info", "GPU inventory as labels (value 1)", info_labels, 1, extra)
                add("gauge", "anex_gpu_memory_total_bytes", "GPU memory (VRAM)", labels, info.get("memory_total_bytes"), extra)
                add("gauge", "anex_gpu_memory_bandwidth_gbps", "Peak memory bandwidth, GB/s (bus width x clock x 2)",
                    labels, info.get("memory_bandwidth_gbps"), extra)
                add("gauge", "anex_gpu_pcie_link_gen", "Current PCIe link generation", labels, info.get("pcie_gen"), extra)
                add("gauge", "anex_gpu_pcie_link_width", "Current PCIe link width (lanes)", labels, info.get("pcie_width"), extra)
                add("gauge", "anex_gpu_power_limit_watts", "Enforced power limit", labels, info.get("power_limit_w"), extra)

        nvml = t.get("nvml") or {}
        state = str(nvml.get("state", "not_started"))
        add("gauge", "anex_nvml_up", "1 when NVML works on this node", host_label, 1 if state == "ok" else 0, extra)
        add("gauge", "anex_nvml_state", "NVML state and reason (value 1)",
            {**host_label, "state": state, "reason": str(nvml.get("reason", ""))}, 1, extra)
        add("gauge", "anex_gpu_count", "GPUs NVML lists on this node", host_label, inventory.get("gpu_count", 0), extra)
        health = t.get("health") or {}
        verdict = health.get("verdict", "unknown")
        for v in VERDICTS:
            add("gauge", "anex_node_health", "Node health verdict (1 for the current one)",
                {**host_label, "verdict": v}, 1 if v == verdict else 0, extra)
        add("gauge", "anex_node_health_reasons", "Number of reasons behind the verdict", host_label,
            len(health.get("reasons", [])), extra)
        add("gauge", "anex_telemetry_sample_seconds", "Wall time of the last telemetry sample", host_label,
            t.get("sample_seconds"), extra)
        add("gauge", "anex_telemetry_timestamp_seconds", "Unix time of the last telemetry sample", host_label,
            t.get("taken_at"), extra)
        _host_families(add, host_label, t.get("host") or {}, extra)
    return list(out.families.values())


def _host_families(add: Any, labels: Mapping[str, str], host: Mapping[str, Any], extra: Mapping[str, str]) -> None:
    add("gauge", "anex_host_cpu_count", "Logical CPUs", labels, host.get("cpu_count"), extra)
    add("gauge", "anex_host_cpu_physical_cores", "Physical CPU cores", labels, host.get("cpu_physical"), extra)
    add("gauge", "anex_host_cpu_utilization_percent", "CPU use since the previous sample, % of all CPUs",
        labels, host.get("cpu_util_pct"), extra)
    for period in ("1", "5", "15"):
        add("gauge", "anex_host_load_average", "Load average", {**labels, "period": f"{period}m"},
            host.get(f"load{period}"), extra)
    add("gauge", "anex_host_memory_total_bytes", "RAM", labels, host.get("mem_total_bytes"), extra)
    add("gauge", "anex_host_memory_available_bytes", "RAM available", labels, host.get("mem_available_bytes"), extra)
    disk = host.get("disk") or {}
    dl = {**labels, "path": str(disk.get("path", "")), "device": str(disk.get("device", ""))}
    add("gauge", "anex_host_disk_total_bytes", "Size of the state dir's filesystem", dl, disk.get("total_bytes"), extra)
    add("gauge", "anex_host_disk_free_bytes", "Free space on the state dir's filesystem", dl, disk.get("free_bytes"), extra)
    add("counter", "anex_host_disk_read_bytes", "Bytes read from the state dir's device", dl, disk.get("read_bytes"), extra)
    add("counter", "anex_host_disk_written_bytes", "Bytes written to the state dir's device", dl,
        disk.get("write_bytes"), extra)
    net = host.get("net") or {}
    add("counter", "anex_host_network_receive_bytes", "Bytes received, all interfaces but lo", labels,
        net.get("rx_bytes"), extra)
    add("counter", "anex_host_network_transmit_bytes", "Bytes sent, all interfaces but lo", labels,
        net.get("tx_bytes"), extra)
    add("counter", "anex_host_network_receive_errors", "Receive errors", labels, net.get("rx_errors"), extra)
    add("counter", "anex_host_network_transmit_errors", "Transmit errors", labels, net.get("tx_errors"), extra)
