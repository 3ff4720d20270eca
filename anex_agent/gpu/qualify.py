"""On-prem server qualification against the CloudBender hardware rules.

Rules (trainML CloudBender docs, "Compute > Hardware Requirements"; reference
``002_4a9f9274645beb94.txt``). ``scope`` says which list a rule comes from:

required (all systems):
  * ``gpu_model``      all GPUs in the system are the same model
  * ``nvme_drives``    2 or more NVMe drives
  * ``nvme_capacity``  NVMe total at least 1 TB per 2 GPUs, rounded up (1 TB for 1 or 2
                       GPUs, 2 TB for 3 or 4...); TB = 10^12 bytes, as drives are sold
  * ``tpm``            a TPM 2.0 (or fTPM 2.0)
marketplace (to sell spare capacity):
  * ``memory``         system memory at least 2x the total GPU VRAM. MemTotal excludes
                       what firmware and kernel reserve (1-3 % of the DIMMs), so a value
                       within ``MEMORY_TOLERANCE`` (3 %) below the target passes
  * ``pcie_lanes``     at least 8 PCIe lanes per GPU (current link width), not
                       applicable to SXM GPUs
  * ``cpu_cores``      at least 2 physical cores per GPU for PCIe 3.0 GPUs, 4 for PCIe
                       4.0; the rules stop at 4.0, we apply 4 to newer generations and 2
                       to older ones; the GPU's generation is its maximum link generation

Not covered: the 3 x 2 TB SATA drives of local storage mode and the 10/100 GbE of
central storage mode depend on the region's configuration, which the node cannot see.

:func:`evaluate` is pure (facts in, :class:`Qualification` out). :func:`gather_facts`
reads this machine (NVML, psutil, /sys). A rule whose inputs cannot be read is
``not_checked`` with the reason ("no NVIDIA driver: ..."). ``Qualification.status``
is ``fail`` when any rule fails, else ``incomplete`` when any rule was not checked,
else ``pass``. The agent sends ``Qualification.to_dict()`` as
``telemetry["qualification"]`` from on-prem nodes.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from anex_agent.gpu.inventory import GpuInfo
from anex_agent.gpu.nvml import Nvml, NvmlState, NvmlStatus, NvmlUnavailable

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not_checked"
TB = 10**12
GIB = 1024**3
MEMORY_TOLERANCE = 0.03
MIN_NVME_DRIVES = 2
MIN_LANES = 8


@dataclass(frozen=True)
class NvmeDrive:
    name: str
    model: str
    size_bytes: int


@dataclass(frozen=True)
class ServerFacts:
    """What :func:`evaluate` needs. ``gpus`` is None when NVML could not list them (see ``nvml``)."""

    nvml: NvmlStatus
    gpus: tuple[GpuInfo, ...] | None
    mem_total_bytes: int
    cpu_physical: int | None
    cpu_logical: int
    nvme: tuple[NvmeDrive, ...] | None  # None: /sys/class/nvme unreadable
    tpm_version: int | None  # major version; None: no TPM or unknown
    tpm_note: str = ""
    form_factor: str | None = None  # "sxm" / "pcie" overrides the name-based guess


@dataclass(frozen=True)
class Check:
    id: str
    scope: str  # "required" | "marketplace"
    status: str  # pass | fail | not_checked
    measured: str
    required: str
    detail: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "scope": self.scope, "status": self.status, "measured": self.measured,
                "required": self.required, "detail": self.detail}


@dataclass(frozen=True)
class Qualification:
    checks: tuple[Check, ...]
    checked_at: float = field(default_factory=time.time)
    summary: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        statuses = {c.status for c in self.checks}
        if FAIL in statuses:
            return FAIL
        return "incomplete" if NOT_CHECKED in statuses else PASS

    def scope_ok(self, scope: str) -> bool | None:
        """True/False for the rules of one scope; None when some of them were not checked."""
        statuses = {c.status for c in self.checks if c.scope == scope}
        if FAIL in statuses:
            return False
        return None if NOT_CHECKED in statuses else True

    def to_dict(self) -> dict[str, Any]:
        return {
            "v": 1,
            "status": self.status,
            "required_ok": self.scope_ok("required"),
            "marketplace_ok": self.scope_ok("marketplace"),
            "checked_at": round(self.checked_at, 3),
            "summary": self.summary,
            "checks": [c.to_dict() for c in self.checks],
        }


def _gib(n: float) -> str:
    return f"{n / GIB:.1f} GiB"


def _no_gpu_reason(facts: ServerFacts) -> str:
    state = facts.nvml.state
    if state is NvmlState.no_driver:
        return f"not checked: {facts.nvml.reason}"
    return f"not checked: NVML {state.value} ({facts.nvml.reason})"


# A rule's verdict: (status, measured, required, detail).
Verdict = tuple[str, str, str, str]


def _gpu_model(facts: ServerFacts, gpus: tuple[GpuInfo, ...]) -> Verdict:
    if not gpus:
        return FAIL, "no GPU", "all GPUs one model", "NVML lists no GPU"
    models = sorted({g.name for g in gpus})
    ok = len(models) == 1
    return (PASS if ok else FAIL, f"{len(gpus)} x " + " / ".join(models), "all GPUs one model",
            "" if ok else f"{len(models)} different models")


def _nvme_drives(facts: ServerFacts, nvme: tuple[NvmeDrive, ...]) -> Verdict:
    count = len(nvme)
    return (PASS if count >= MIN_NVME_DRIVES else FAIL, f"{count} NVMe drive(s)", f">= {MIN_NVME_DRIVES} NVMe drives",
            ", ".join(f"{d.name} {d.model} {d.size_bytes / TB:.2f} TB" for d in nvme))


def _nvme_capacity(facts: ServerFacts, nvme: tuple[NvmeDrive, ...], gpus: tuple[GpuInfo, ...]) -> Verdict:
    total = sum(d.size_bytes for d in nvme)
    need = max(1, math.ceil(len(gpus) / 2)) * TB
    return PASS if total >= need else FAIL, f"{total / TB:.2f} TB", f">= {need / TB:.0f} TB for {len(gpus)} GPU(s)", ""


def _tpm(facts: ServerFacts) -> Verdict:
    if facts.tpm_version is None:
        status = NOT_CHECKED if facts.tpm_note.startswith("not checked") else FAIL
        return status, "no TPM" if status == FAIL else "-", "TPM 2.0", facts.tpm_note
    return PASS if facts.tpm_version >= 2 else FAIL, f"TPM {facts.tpm_version}.x", "TPM 2.0", facts.tpm_note


def _memory(facts: ServerFacts, gpus: tuple[GpuInfo, ...]) -> Verdict:
    vram = sum(g.memory_total_bytes or 0 for g in gpus)
    need = 2 * vram
    ok = facts.mem_total_bytes >= need * (1 - MEMORY_TOLERANCE)
    return (PASS if ok else FAIL, _gib(facts.mem_total_bytes), f">= {_gib(need)} (2 x {_gib(vram)} VRAM)",
            "" if ok else f"short by {_gib(need - facts.mem_total_bytes)}")


def _pcie_lanes(facts: ServerFacts, gpus: tuple[GpuInfo, ...]) -> Verdict:
    narrow, unknown, widths, sxm = [], [], [], 0
    for g in gpus:
        if (facts.form_factor or g.form_factor) == "sxm":
            sxm += 1
            widths.append(f"{g.index}:SXM")
        elif g.pcie_width is None:
            unknown.append(g.index)
            widths.append(f"{g.index}:?")
        else:
            widths.append(f"{g.index}:x{g.pcie_width}")
            if g.pcie_width < MIN_LANES:
                narrow.append(g.index)
    if narrow:
        status, detail = FAIL, "GPU(s) " + ", ".join(map(str, narrow)) + f" below x{MIN_LANES}"
    elif unknown:
        status = NOT_CHECKED
        detail = "not checked: NVML does not report the link width of GPU(s) " + ", ".join(map(str, unknown))
    else:
        status, detail = PASS, "SXM GPUs are exempt" if sxm else ""
    return status if gpus else FAIL, " ".join(widths) or "no GPU", f">= x{MIN_LANES} per GPU (not SXM)", detail


def _cores(facts: ServerFacts) -> str:
    return f"{facts.cpu_physical or facts.cpu_logical} {'physical' if facts.cpu_physical else 'logical'} cores"


def _cpu_cores(facts: ServerFacts, gpus: tuple[GpuInfo, ...]) -> Verdict:
    generations = [g.pcie_max_gen or g.pcie_gen for g in gpus]  # the GPU's generation: its maximum link generation
    need = sum(4 if gen is None or gen >= 4 else 2 for gen in generations)
    cores = facts.cpu_physical or facts.cpu_logical
    return (PASS if cores >= need else FAIL, _cores(facts), f">= {need} for {len(gpus)} GPU(s)",
            "PCIe gen " + ",".join(str(gen or "?") for gen in generations))


_NVME_UNREADABLE = "not checked: /sys/class/nvme cannot be read"


@dataclass(frozen=True)
class Rule:
    """One hardware rule. ``judge`` gets the facts plus the inputs named in ``needs`` ("gpus", "nvme"),
    and runs only when all of them could be read; otherwise the rule is ``not_checked`` with
    ``unmeasured(facts)`` as measured value, ``unknown_required`` as requirement and the reason
    of the first missing input."""

    id: str
    scope: str  # "required" | "marketplace"
    needs: tuple[str, ...]
    judge: Callable[..., Verdict]
    unknown_required: str
    unmeasured: Callable[[ServerFacts], str] = lambda facts: "-"


RULES: tuple[Rule, ...] = (
    Rule("gpu_model", "required", ("gpus",), _gpu_model, "all GPUs one model"),
    Rule("nvme_drives", "required", ("nvme",), _nvme_drives, f">= {MIN_NVME_DRIVES} NVMe drives"),
    Rule("nvme_capacity", "required", ("nvme", "gpus"), _nvme_capacity, "1 TB per 2 GPUs",
         lambda f: "-" if f.nvme is None else f"{sum(d.size_bytes for d in f.nvme) / TB:.2f} TB"),
    Rule("tpm", "required", (), _tpm, "TPM 2.0"),
    Rule("memory", "marketplace", ("gpus",), _memory, "2 x total VRAM", lambda f: _gib(f.mem_total_bytes)),
    Rule("pcie_lanes", "marketplace", ("gpus",), _pcie_lanes, f">= x{MIN_LANES} per GPU"),
    Rule("cpu_cores", "marketplace", ("gpus",), _cpu_cores, "2 per PCIe 3.0 GPU, 4 per PCIe 4.0 GPU", _cores),
)


def _check(rule: Rule, facts: ServerFacts) -> Check:
    inputs = {"gpus": facts.gpus, "nvme": facts.nvme}
    for name in rule.needs:
        if inputs[name] is None:
            reason = _no_gpu_reason(facts) if name == "gpus" else _NVME_UNREADABLE
            return Check(rule.id, rule.scope, NOT_CHECKED, rule.unmeasured(facts), rule.unknown_required, reason)
    status, measured, required, detail = rule.judge(facts, *(inputs[name] for name in rule.needs))
    return Check(rule.id, rule.scope, status, measured, required, detail)


def evaluate(facts: ServerFacts) -> Qualification:
    """Apply :data:`RULES` to ``facts`` (pure), in their order."""
    gpus, nvme = facts.gpus, facts.nvme
    summary = {
        "gpu_count": len(gpus) if gpus is not None else None,
        "gpu_models": sorted({g.name for g in gpus}) if gpus else [],
        "vram_total_bytes": sum(g.memory_total_bytes or 0 for g in gpus) if gpus else None,
        "mem_total_bytes": facts.mem_total_bytes,
        "cpu_physical": facts.cpu_physical,
        "cpu_logical": facts.cpu_logical,
        "nvme_count": len(nvme) if nvme is not None else None,
        "nvme_total_bytes": sum(d.size_bytes for d in nvme) if nvme is not None else None,
        "tpm_version": facts.tpm_version,
        "nvml": facts.nvml.to_dict(),
        # profiling metrics (DCGM_FI_PROF_*) through NVML GPM, per GPU index: "supported" | "unsupported"
        "gpm": {str(g.index): g.gpm or "unsupported" for g in gpus} if gpus else {},
    }
    return Qualification(tuple(_check(rule, facts) for rule in RULES), summary=summary)


# ---------------------------------------------------------------------------- reading this machine

_NAMESPACE = re.compile(r"^(nvme\d+)n\d+$")


def read_nvme(sys_root: str = "/sys") -> tuple[NvmeDrive, ...] | None:
    """NVMe controllers (drives) with the total size of their namespaces; None if sysfs is unreadable."""
    root = Path(sys_root)
    if not (root / "class").is_dir():
        return None
    sizes: dict[str, int] = {}
    block = root / "block"
    if block.is_dir():
        for dev in block.iterdir():
            match = _NAMESPACE.match(dev.name)
            if match:
                try:
                    sectors = int((dev / "size").read_text().strip())
                except (OSError, ValueError):
                    continue
                sizes[match.group(1)] = sizes.get(match.group(1), 0) + sectors * 512  # sysfs size: 512-byte units
    drives = []
    nvme_class = root / "class" / "nvme"
    names = sorted(p.name for p in nvme_class.iterdir()) if nvme_class.is_dir() else sorted(sizes)
    for name in names:
        try:
            model = (nvme_class / name / "model").read_text().strip()
        except OSError:
            model = ""
        drives.append(NvmeDrive(name, model, sizes.get(name, 0)))
    return tuple(drives)


def read_tpm(sys_root: str = "/sys") -> tuple[int | None, str]:
    """(TPM major version, note). Version from /sys/class/tpm/tpm*/tpm_version_major (Linux >= 5.6)."""
    tpm_class = Path(sys_root) / "class" / "tpm"
    if not (Path(sys_root) / "class").is_dir():
        return None, "not checked: /sys/class cannot be read"
    devices = sorted(tpm_class.iterdir()) if tpm_class.is_dir() else []
    if not devices:
        return None, "no TPM device in /sys/class/tpm (enable the TPM or fTPM in the firmware)"
    for dev in devices:
        try:
            return int((dev / "tpm_version_major").read_text().strip()), dev.name
        except (OSError, ValueError):
            continue
    return None, f"not checked: {devices[0].name} present but its version is not readable (kernel < 5.6?)"


def gather_facts(nvml: Nvml | None = None, *, sys_root: str = "/sys", form_factor: str | None = None) -> ServerFacts:
    """Read this machine (blocking). Uses ``nvml`` if given (left initialised), else a private one (shut down)."""
    from anex_agent.gpu.inventory import read_inventory

    own = nvml is None
    nvml = nvml or Nvml()
    gpus: tuple[GpuInfo, ...] | None = None
    try:
        if nvml.ensure_ready():
            inventory, _handles, failures = read_inventory(nvml)
            gpus = inventory.gpus
            if failures:
                nvml_status = NvmlStatus(NvmlState.gpu_lost, "GPU(s) " + ", ".join(map(str, failures)) + " failed")
            else:
                nvml_status = nvml.status
        else:
            nvml_status = nvml.status
    except NvmlUnavailable as exc:
        gpus, nvml_status = None, exc.status
    finally:
        if own:
            nvml.shutdown()
    tpm_version, tpm_note = read_tpm(sys_root)
    return ServerFacts(
        nvml=nvml_status,
        gpus=gpus,
        mem_total_bytes=psutil.virtual_memory().total,
        cpu_physical=psutil.cpu_count(logical=False),
        cpu_logical=psutil.cpu_count(logical=True) or 1,
        nvme=read_nvme(sys_root),
        tpm_version=tpm_version,
        tpm_note=tpm_note,
        form_factor=form_factor,
    )


def qualify(nvml: Nvml | None = None, **kwargs: Any) -> dict[str, Any]:
    """Gather and evaluate; the JSON-able result for ``telemetry["qualification"]`` (blocking)."""
    return evaluate(gather_facts(nvml, **kwargs)).to_dict()
