"""The node's health verdict from NVML state, GPU samples, XIDs and host metrics (pure).

:func:`assess` returns a :class:`Verdict`: ``healthy``, ``degraded`` (works, but a
scheduler should prefer other nodes or an operator should look) or ``unhealthy``
(do not schedule GPU work here), with one human-readable reason per finding.
The coordinator copies it into the node's health (``telemetry["health"]``).

Rules (worst finding wins):

unhealthy
  * NVML driver/library version mismatch, GPU lost, reset required
  * a GPU listed at start is gone, or answers "lost"/"reset required"
  * a hardware XID (any XID but 13, 31, 43, 45, 68) since the agent started
  * uncorrected (double-bit) ECC errors since boot, or a failed row remap
degraded
  * no GPU telemetry: no driver, driver not loaded, no permission, other NVML errors
  * a row remap pending (needs a GPU reset to take effect)
  * hardware slowdown or thermal throttling (HW slowdown, HW thermal, HW power brake,
    SW thermal)
  * PCIe link narrower than the GPU's maximum (a badly seated card or riser)
  * the state dir's filesystem below 5 % free, or memory below 5 % available
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from anex_agent.gpu.inventory import NodeInventory
from anex_agent.gpu.nvml import NvmlState, NvmlStatus

HEALTHY, DEGRADED, UNHEALTHY = "healthy", "degraded", "unhealthy"
_RANK = {HEALTHY: 0, DEGRADED: 1, UNHEALTHY: 2}

UNHEALTHY_NVML = frozenset({NvmlState.version_mismatch, NvmlState.gpu_lost, NvmlState.reset_required})
BAD_THROTTLE = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
LOW_FREE_FRACTION = 0.05


@dataclass(frozen=True)
class Verdict:
    verdict: str = HEALTHY
    reasons: tuple[str, ...] = field(default_factory=tuple)

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "reasons": list(self.reasons)}


class _Findings:
    def __init__(self) -> None:
        self.level = HEALTHY
        self.reasons: list[str] = []

    def add(self, level: str, reason: str) -> None:
        if _RANK[level] > _RANK[self.level]:
            self.level = level
        self.reasons.append(reason)


def assess(
    nvml: NvmlStatus,
    inventory: NodeInventory | None,
    samples: Mapping[int, Mapping[str, Any]],
    *,
    gpu_failures: Mapping[int, str] | None = None,
    hardware_xids: Mapping[int, list[int]] | None = None,
    expected_gpus: int | None = None,
    host: Mapping[str, Any] | None = None,
) -> Verdict:
    """Judge the node. ``expected_gpus`` is how many GPUs the first inventory listed."""
    f = _Findings()
    if nvml.state is not NvmlState.ok:
        level = UNHEALTHY if nvml.state in UNHEALTHY_NVML else DEGRADED
        f.add(level, f"NVML {nvml.state.value}: {nvml.reason}")

    for index, state in sorted((gpu_failures or {}).items()):
        f.add(UNHEALTHY, f"GPU {index}: {state.replace('_', ' ')}")

    if inventory is not None and expected_gpus is not None and len(inventory.gpus) + len(gpu_failures or {}) < expected_gpus:
        f.add(UNHEALTHY, f"{expected_gpus} GPUs at start, {len(inventory.gpus)} now: a GPU fell off the bus")

    for index, xids in sorted((hardware_xids or {}).items()):
        shown = ", ".join(str(x) for x in sorted(set(xids)))
        f.add(UNHEALTHY, f"GPU {index}: hardware XID {shown} (needs a GPU reset or reboot)")

    gpus = {g.index: g for g in inventory.gpus} if inventory is not None else {}
    for index, sample in sorted(samples.items()):
        if sample.get("ecc_dbe_vol", 0) > 0:
            f.add(UNHEALTHY, f"GPU {index}: {sample['ecc_dbe_vol']} uncorrected ECC errors since boot")
        if sample.get("remap_failure"):
            f.add(UNHEALTHY, f"GPU {index}: row remapping failed (the GPU memory needs service)")
        elif sample.get("remap_pending"):
            f.add(DEGRADED, f"GPU {index}: a row remap is pending; reset the GPU to apply it")
        bad = [name for name in sample.get("throttle", ()) if name in BAD_THROTTLE]
        if bad:
            f.add(DEGRADED, f"GPU {index}: clocks throttled by {', '.join(bad)}")
        info = gpus.get(index)
        if info is not None and info.pcie_width and info.pcie_max_width and info.pcie_width < info.pcie_max_width:
            f.add(DEGRADED, f"GPU {index}: PCIe link x{info.pcie_width}, the GPU supports x{info.pcie_max_width}")

    if host:
        disk = host.get("disk") or {}
        total, free = disk.get("total_bytes"), disk.get("free_bytes")
        if total and free is not None and free < LOW_FREE_FRACTION * total:
            f.add(DEGRADED, f"state dir filesystem {disk.get('path', '')} has {free / total:.1%} free")
        mem_total, mem_avail = host.get("mem_total_bytes"), host.get("mem_available_bytes")
        if mem_total and mem_avail is not None and mem_avail < LOW_FREE_FRACTION * mem_total:
            f.add(DEGRADED, f"memory {mem_avail / mem_total:.1%} available")

    return Verdict(f.level, tuple(f.reasons))
