"""Node telemetry -> the kubelet's ``/stats/summary`` and ``/metrics/resource`` (pure).

A pod on the virtual node is one rented machine running one workload, so each container's
usage is its machine's, from the telemetry block the machine's agent last sent (``host`` and
``gpus``, docs/telemetry.md):

* CPU: ``usageNanoCores`` = ``cpu_util_pct`` / 100 x ``cpu_count`` x 10^9; the cumulative
  ``usageCoreNanoSeconds`` is integrated here from those rates, sample to sample
  (:class:`CpuCounters`: telemetry carries no CPU-time counter), so it starts at 0 when the
  virtual node first sees the machine and only grows;
* memory: ``workingSetBytes`` = ``usageBytes`` = ``mem_total_bytes`` - ``mem_available_bytes``;
* accelerators: one per GPU (make ``nvidia``, model and memoryTotal from the inventory,
  memoryUsed from ``fb_used_mib``, dutyCycle from ``gpu_util_pct``);
* the Node's figures are the sums over its pods; its network the sums of the machines'.

Each figure carries the time of its sample (``taken_at``); a pod whose machine has sent no
usable telemetry is left out (``scrape_error`` stays 0: that is not an error of the scrape).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

MIB = 1024 * 1024


@dataclass(frozen=True)
class PodSample:
    """One pod and its machine's latest telemetry block (None: none yet)."""

    namespace: str
    name: str
    uid: str
    containers: tuple[str, ...]
    start_time: str | None  # the pod's status.startTime (RFC 3339), if set
    node_id: str
    telemetry: Mapping[str, Any] | None


@dataclass(frozen=True)
class Usage:
    taken_at: float  # Unix seconds of the sample
    nano_cores: int | None
    core_nano_seconds: int | None
    working_set_bytes: int | None
    accelerators: tuple[dict[str, Any], ...]
    rx_bytes: int | None
    tx_bytes: int | None


class CpuCounters:
    """Cumulative CPU time per machine, integrated from its samples' rates (not thread-safe; one
    event loop owns it). A sample older than or as old as the last one changes nothing."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, float, float]] = {}  # node id -> (taken_at, nano_cores, total ns)

    def update(self, node_id: str, taken_at: float, nano_cores: float) -> int:
        last = self._last.get(node_id)
        if last is None:
            self._last[node_id] = (taken_at, nano_cores, 0.0)
            return 0
        when, rate, total = last
        if taken_at <= when:
            return int(total)
        total += (taken_at - when) * (rate + nano_cores) / 2  # trapezoid between the two samples
        self._last[node_id] = (taken_at, nano_cores, total)
        return int(total)

    def forget_others(self, node_ids: set[str]) -> None:
        for gone in set(self._last) - node_ids:
            del self._last[gone]


def _num(block: Mapping[str, Any] | None, key: str) -> float | None:
    value = (block or {}).get(key)
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0 else None


def usage(sample: PodSample, counters: CpuCounters) -> Usage | None:
    """The machine's usage from its block, or None when the block has no time or no host figures."""
    block = sample.telemetry or {}
    taken_at = _num(block, "taken_at")
    host = block.get("host") if isinstance(block.get("host"), Mapping) else None
    if taken_at is None or host is None:
        return None
    util, count = _num(host, "cpu_util_pct"), _num(host, "cpu_count")
    nano = int(util / 100 * count * 1e9) if util is not None and count is not None else None
    total = counters.update(sample.node_id, taken_at, nano) if nano is not None else None
    mem_total, mem_free = _num(host, "mem_total_bytes"), _num(host, "mem_available_bytes")
    working = int(max(mem_total - mem_free, 0)) if mem_total is not None and mem_free is not None else None
    net = host.get("net") if isinstance(host.get("net"), Mapping) else {}
    rx, tx = _num(net, "rx_bytes"), _num(net, "tx_bytes")
    return Usage(taken_at, nano, total, working, _accelerators(block), None if rx is None else int(rx),
                 None if tx is None else int(tx))


def _accelerators(block: Mapping[str, Any]) -> tuple[dict[str, Any], ...]:
    inventory = block.get("inventory") if isinstance(block.get("inventory"), Mapping) else {}
    by_index = {g.get("index"): g for g in inventory.get("gpus") or () if isinstance(g, Mapping)}
    out = []
    for gpu in block.get("gpus") or ():
        if not isinstance(gpu, Mapping):
            continue
        info = by_index.get(gpu.get("index"), {})
        total = _num(gpu, "fb_total_mib")
        total_bytes = int(total * MIB) if total is not None else int(_num(info, "memory_total_bytes") or 0)
        out.append({"make": "nvidia", "model": str(info.get("name") or ""), "id": str(gpu.get("uuid") or info.get("uuid") or ""),
                    "memoryTotal": total_bytes, "memoryUsed": int((_num(gpu, "fb_used_mib") or 0) * MIB),
                    "dutyCycle": int(_num(gpu, "gpu_util_pct") or 0)})
    return tuple(out)


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cpu(u: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {"time": rfc3339(u.taken_at)}
    if u.nano_cores is not None:
        out["usageNanoCores"] = u.nano_cores
    if u.core_nano_seconds is not None:
        out["usageCoreNanoSeconds"] = u.core_nano_seconds
    return out


def _memory(u: Usage) -> dict[str, Any]:
    out: dict[str, Any] = {"time": rfc3339(u.taken_at)}
    if u.working_set_bytes is not None:
        out["workingSetBytes"] = out["usageBytes"] = u.working_set_bytes
    return out


def summary(node_name: str, node_start: str, samples: Sequence[PodSample], counters: CpuCounters,
            now: float) -> dict[str, Any]:
    """The ``/stats/summary`` document (the kubelet's stats API v1alpha1 shape)."""
    pods, usages = [], []
    for sample in samples:
        u = usage(sample, counters)
        if u is None:
            continue
        usages.append(u)
        start = sample.start_time or rfc3339(u.taken_at)
        containers = []
        for name in sample.containers:
            entry: dict[str, Any] = {"name": name, "startTime": start, "cpu": _cpu(u), "memory": _memory(u)}
            if u.accelerators:
                entry["accelerators"] = list(u.accelerators)
            containers.append(entry)
        pod: dict[str, Any] = {"podRef": {"name": sample.name, "namespace": sample.namespace, "uid": sample.uid},
                               "startTime": start, "containers": containers, "cpu": _cpu(u), "memory": _memory(u)}
        if u.rx_bytes is not None or u.tx_bytes is not None:
            pod["network"] = {"time": rfc3339(u.taken_at), "rxBytes": u.rx_bytes or 0, "txBytes": u.tx_bytes or 0}
        pods.append(pod)
    when = max((u.taken_at for u in usages), default=now)
    node: dict[str, Any] = {
        "nodeName": node_name, "startTime": node_start, "systemContainers": [],
        "cpu": {"time": rfc3339(when), "usageNanoCores": sum(u.nano_cores or 0 for u in usages),
                "usageCoreNanoSeconds": sum(u.core_nano_seconds or 0 for u in usages)},
        "memory": {"time": rfc3339(when), "workingSetBytes": sum(u.working_set_bytes or 0 for u in usages),
                   "usageBytes": sum(u.working_set_bytes or 0 for u in usages)},
        "network": {"time": rfc3339(when), "rxBytes": sum(u.rx_bytes or 0 for u in usages),
                    "txBytes": sum(u.tx_bytes or 0 for u in usages)},
    }
    return {"node": node, "pods": pods}


def _labels(**labels: str) -> str:
    def esc(value: str) -> str:
        return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')
    return "{" + ",".join(f'{k}="{esc(v)}"' for k, v in labels.items()) + "}"


_HELP = {
    "container_cpu_usage_seconds_total": ("counter", "Cumulative cpu time consumed by the container in core-seconds"),
    "container_memory_working_set_bytes": ("gauge", "Current working set of the container in bytes"),
    "container_start_time_seconds": ("gauge", "Start time of the container since unix epoch in seconds"),
    "node_cpu_usage_seconds_total": ("counter", "Cumulative cpu time consumed by the node in core-seconds"),
    "node_memory_working_set_bytes": ("gauge", "Current working set of the node in bytes"),
    "pod_cpu_usage_seconds_total": ("counter", "Cumulative cpu time consumed by the pod in core-seconds"),
    "pod_memory_working_set_bytes": ("gauge", "Current working set of the pod in bytes"),
    "scrape_error": ("gauge", "1 if there was an error while getting container metrics, 0 otherwise"),
}


def _start_seconds(text: str | None, fallback: float) -> float:
    if not text:
        return fallback
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return fallback


def resource_metrics(samples: Sequence[PodSample], counters: CpuCounters, now: float, *,
                     scrape_error: bool = False) -> str:
    """The ``/metrics/resource`` text (Prometheus exposition 0.0.4, timestamps in milliseconds)."""
    rows: dict[str, list[str]] = {name: [] for name in _HELP}
    node_cpu = node_mem = 0.0
    latest = None
    for sample in samples:
        u = usage(sample, counters)
        if u is None:
            continue
        ms = int(u.taken_at * 1000)
        latest = max(latest or 0, u.taken_at)
        pod = {"namespace": sample.namespace, "pod": sample.name}
        start = _start_seconds(sample.start_time, u.taken_at)
        for name in sample.containers:
            labels = _labels(container=name, **pod)
            rows["container_start_time_seconds"].append(f"container_start_time_seconds{labels} {start:.3f} {ms}")
            if u.core_nano_seconds is not None:
                rows["container_cpu_usage_seconds_total"].append(
                    f"container_cpu_usage_seconds_total{labels} {u.core_nano_seconds / 1e9:.9f} {ms}")
            if u.working_set_bytes is not None:
                rows["container_memory_working_set_bytes"].append(
                    f"container_memory_working_set_bytes{labels} {u.working_set_bytes} {ms}")
        if u.core_nano_seconds is not None:
            node_cpu += u.core_nano_seconds / 1e9
            rows["pod_cpu_usage_seconds_total"].append(
                f"pod_cpu_usage_seconds_total{_labels(**pod)} {u.core_nano_seconds / 1e9:.9f} {ms}")
        if u.working_set_bytes is not None:
            node_mem += u.working_set_bytes
            rows["pod_memory_working_set_bytes"].append(
                f"pod_memory_working_set_bytes{_labels(**pod)} {u.working_set_bytes} {ms}")
    node_ms = int((latest if latest is not None else now) * 1000)
    rows["node_cpu_usage_seconds_total"].append(f"node_cpu_usage_seconds_total {node_cpu:.9f} {node_ms}")
    rows["node_memory_working_set_bytes"].append(f"node_memory_working_set_bytes {int(node_mem)} {node_ms}")
    rows["scrape_error"].append(f"scrape_error {1 if scrape_error else 0}")
    lines = []
    for name, (kind, text) in _HELP.items():
        if rows[name]:
            lines += [f"# HELP {name} [STABLE] {text}" if name != "scrape_error" else f"# HELP {name} [ALPHA] {text}",
                      f"# TYPE {name} {kind}", *rows[name]]
    return "\n".join(lines) + "\n"
