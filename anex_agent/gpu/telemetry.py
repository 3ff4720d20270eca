"""The compact telemetry block a node sends in every heartbeat (``Heartbeat.telemetry``).

:func:`build_telemetry` turns a :class:`~anex_agent.gpu.monitor.Snapshot` into a
JSON-serialisable dict (plain str/int/float/bool/None/list/dict). Shape, version 1::

    {
      "v": 1,
      "taken_at": 1763728245.123,               # Unix seconds of the sample
      "hostname": "gpu-node-1",
      "health": {"verdict": "healthy"|"degraded"|"unhealthy", "reasons": ["...", ...]},
      "nvml": {"state": "ok"|"no_driver"|"driver_not_loaded"|"version_mismatch"|
                        "gpu_lost"|"reset_required"|"no_permission"|"error"|"not_started",
               "reason": "...", "code": 18},    # code: the NVML error, when there is one
      "inventory": {"driver_version": "550.54.15", "cuda_version": "12.4", "nvml_version": "...",
                    "gpu_count": 8,
                    "gpus": [{"index": 0, "name": "...", "uuid": "GPU-...", "pci_bus_id": "...",
                              "memory_total_bytes": ..., "compute_capability": "9.0",
                              "memory_bus_width_bits": 5120, "max_memory_clock_mhz": 2619,
                              "memory_bandwidth_gbps": 3352.3, "pcie_max_gen": 5, "pcie_max_width": 16,
                              "pcie_gen": 5, "pcie_width": 16, "power_limit_w": 700.0,
                              "mig_mode": "disabled", "form_factor": "sxm"}]},
      "gpus": [{"index": 0, "uuid": "GPU-...", "state": "ok"|"gpu_lost"|"reset_required",
                "last_xid": 0, "xid_counts": {"79": 1},   # xid_counts only when XIDs were seen
                ...the sample fields of anex_agent.gpu.sampler and anex_agent.gpu.gpm...}],
      "xids": [{"gpu": 0, "uuid": "...", "xid": 79, "kind": "hardware", "at": 1763728240.0}],
      "host": {...the fields of anex_agent.gpu.host...},
      "sample_seconds": 0.0012,                 # what the last sample cost (wall time)
      "qualification": {...}                    # on-prem nodes only: anex_agent.gpu.qualify.Qualification.to_dict()
    }

Fields a GPU does not support are absent, not null. On the wire the block is the model
:class:`anex_agent.telemetry.models.Telemetry` (the agent validates it before sending, the
coordinator on intake); keep this builder and that model in step (a test checks that
every key built here is a field the model knows). At most ``MAX_XIDS`` recent XIDs and
``MAX_PROCESSES`` processes per GPU are sent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from anex_agent.telemetry.models import TELEMETRY_VERSION

if TYPE_CHECKING:
    from anex_agent.gpu.monitor import Snapshot

MAX_XIDS = 8
MAX_PROCESSES = 16


def build_telemetry(snapshot: "Snapshot", *, qualification: dict[str, Any] | None = None) -> dict[str, Any]:
    """The heartbeat block for ``snapshot`` (pure; cheap)."""
    inventory = snapshot.inventory
    gpus: list[dict[str, Any]] = []
    if inventory is not None:
        for info in inventory.gpus:
            entry: dict[str, Any] = {
                "index": info.index,
                "uuid": info.uuid,
                "state": snapshot.gpu_failures.get(info.index, "ok"),
                "last_xid": snapshot.xid_last.get(info.index, 0),
            }
            sample = dict(snapshot.samples.get(info.index, {}))
            if "processes" in sample:
                sample["processes"] = sample["processes"][:MAX_PROCESSES]
            entry.update(sample)
            xid_counts = {str(xid): n for (gpu, _uuid, xid, _kind), n in snapshot.xid_counts.items() if gpu == info.index}
            if xid_counts:
                entry["xid_counts"] = xid_counts
            gpus.append(entry)
    out: dict[str, Any] = {
        "v": TELEMETRY_VERSION,
        "taken_at": round(snapshot.taken_at, 3),
        "hostname": snapshot.hostname,
        "health": snapshot.verdict.to_dict(),
        "nvml": snapshot.nvml.to_dict(),
        "inventory": inventory.to_dict() if inventory is not None else {"gpu_count": 0, "gpus": []},
        "gpus": gpus,
        "xids": [event.to_dict() for event in snapshot.xid_recent[-MAX_XIDS:]],
        "host": dict(snapshot.host) if snapshot.host is not None else {},
        "sample_seconds": round(snapshot.sample_seconds, 6),
    }
    if qualification is not None:
        out["qualification"] = qualification
    return out
