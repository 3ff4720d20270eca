"""The telemetry a node sends in every heartbeat (``wire.Heartbeat.telemetry``), as wire models.

One typed model for both sides: the agent builds the block (:mod:`anex_agent.gpu.telemetry`
turns a GPU snapshot into this shape) and validates it through :class:`Telemetry` before
sending; the coordinator validates it again on intake (422 naming the field) and reads it
(the health verdict, the fleet ``/metrics``, machine selection's on-prem offers) without
importing the agent's GPU code. Shape, version 1 (docs/telemetry.md)::

    Telemetry                   v, taken_at, hostname, health, nvml, inventory, gpus[], xids[],
                                host, sample_seconds, qualification
    TelemetryHealth             verdict ("healthy" | "degraded" | "unhealthy"), reasons[]
    TelemetryNvml               state, reason, code
    TelemetryInventory          driver_version, cuda_version, nvml_version, gpu_count,
                                gpus[] (TelemetryInventoryGpu)
    TelemetryGpu                index, uuid, state, last_xid, xid_counts, processes[], and the
                                samples of anex_agent.gpu.sampler (units in the names: _pct,
                                _mib, _c, _w, _mhz, ...)
    TelemetryXid                gpu, uuid, xid, kind ("application" | "hardware"), at
    TelemetryHost               cpu, load, memory, disk (TelemetryDisk), net (TelemetryNet)
    TelemetryQualification      v, status, required_ok, marketplace_ok, checked_at, summary,
                                checks[] (TelemetryQualificationCheck)

Contract:

* Every field is optional: what a GPU or host does not support is absent, not null. A
  block serialises to exactly the fields it was given (:meth:`Block.as_sent`; ``Heartbeat``
  serialises its block so), so the coordinator stores and serves what the node sent.
* Bounds are model constraints (they show in the OpenAPI document): at most
  :data:`~anex_agent.telemetry.bounds.MAX_GPUS` GPUs in ``gpus`` and ``inventory.gpus``,
  :data:`~anex_agent.telemetry.bounds.MAX_LIST` items in any other list, strings of at most
  :data:`~anex_agent.telemetry.bounds.MAX_STRING` characters; counters and measures are
  finite and not negative. The generic walk of :mod:`anex_agent.telemetry.bounds` (keys,
  nesting) and ``wire.check_telemetry`` (NUL, finite numbers) run first, on the raw block.
* Forward compatible: a key this version does not know (a newer agent's) is kept, stored
  and served as is, under the same generic bounds; it is never an error. Values the
  coordinator interprets (``health.verdict``, ``nvml.state``, a GPU's ``state``) are bounded
  strings, not enums, so a newer agent's new value is stored and ignored by the reader
  (:meth:`Telemetry.verdict`) instead of refusing the whole heartbeat.
* No I/O, no import of any role: a leaf beside the wire models (:mod:`anex_agent.wire`).
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from anex_agent.telemetry.bounds import MAX_GPUS, MAX_KEYS, MAX_LIST, MAX_STRING

TELEMETRY_VERSION = 1
VERDICTS = ("healthy", "degraded", "unhealthy")  # what the agent sends
KNOWN_VERDICTS = (*VERDICTS, "unknown")  # what the coordinator takes over as the node's health
#: the on-prem hardware rules ``telemetry["qualification"]["checks"]`` reports, as (id, scope),
#: in the order anex_agent.gpu.qualify.RULES applies them (a test keeps the two equal)
QUALIFICATION_RULES: tuple[tuple[str, str], ...] = (
    ("gpu_model", "required"), ("nvme_drives", "required"), ("nvme_capacity", "required"), ("tpm", "required"),
    ("memory", "marketplace"), ("pcie_lanes", "marketplace"), ("cpu_cores", "marketplace"),
)
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68})  # caused by the workload; the GPU stays usable

Text = Annotated[str, Field(max_length=MAX_STRING)]
# a counter or a measure: finite (allow_inf_nan=False), not negative; an integer stays an integer
Measure = Annotated[int, Field(ge=0)] | Annotated[float, Field(ge=0)]
Reading = int | float  # a value that may be negative (a temperature)
Count = Annotated[int, Field(ge=0)]
TextList = Annotated[list[Text], Field(max_length=MAX_LIST)]


def classify_xid(xid: int) -> str:
    """``"application"`` for XIDs the workload causes (13, 31, 43, 45, 68), ``"hardware"`` for the rest."""
    return "application" if xid in APPLICATION_XIDS else "hardware"


class Block(BaseModel):
    """Base of every telemetry model: unknown keys kept, frozen, finite numbers.

    Serialise with :meth:`as_sent` (``model_dump(exclude_unset=True)``): the fields given and
    the unknown keys, nothing invented (a plain ``model_dump`` would add ``null`` for every
    field not sent)."""

    model_config = ConfigDict(extra="allow", frozen=True, allow_inf_nan=False, defer_build=True)

    def as_sent(self) -> dict[str, Any]:
        """The block as it was given: set fields and unknown keys, JSON types."""
        return self.model_dump(mode="json", exclude_unset=True)

    def as_sent_json(self) -> str:
        return self.model_dump_json(exclude_unset=True)


class TelemetryHealth(Block):
    verdict: Annotated[str, Field(max_length=32, description="healthy | degraded | unhealthy")] = "healthy"
    reasons: TextList = Field(default_factory=list)


class TelemetryNvml(Block):
    state: Annotated[str, Field(max_length=32, description=(
        "ok | no_driver | driver_not_loaded | version_mismatch | gpu_lost | reset_required | "
        "no_permission | error | not_started"))] = "not_started"
    reason: Text = ""
    code: int | None = Field(None, description="the NVML error code, when there is one")


class TelemetryInventoryGpu(Block):
    """One GPU of the inventory (what does not change while the agent runs)."""

    index: Count | None = None
    name: Text | None = None
    uuid: Text | None = None
    pci_bus_id: Text | None = None
    memory_total_bytes: Measure | None = None
    compute_capability: Text | None = None
    memory_bus_width_bits: Measure | None = None
    max_memory_clock_mhz: Measure | None = None
    memory_bandwidth_gbps: Measure | None = None
    pcie_max_gen: Count | None = None
    pcie_max_width: Count | None = None
    pcie_gen: Count | None = None
    pcie_width: Count | None = None
    power_limit_w: Measure | None = None
    mig_mode: Text | None = None
    form_factor: Text | None = None
    gpm: Annotated[str, Field(max_length=32, description="supported | unsupported (NVML GPM profiling metrics)")] | None = None


class TelemetryInventory(Block):
    driver_version: Text | None = None
    cuda_version: Text | None = None
    nvml_version: Text | None = None
    gpu_count: Count | None = None
    gpus: list[TelemetryInventoryGpu] = Field(default_factory=list, max_length=MAX_GPUS)


class TelemetryGpuProcess(Block):
    pid: Count | None = None
    used_mib: Measure | None = None
    type: Text | None = None


class TelemetryGpu(Block):
    """One GPU's latest sample (units in the names; see :mod:`anex_agent.gpu.sampler`)."""

    index: Count | None = None
    uuid: Text | None = None
    state: Annotated[str, Field(max_length=32, description="ok | gpu_lost | reset_required")] = "ok"
    last_xid: Count | None = None
    xid_counts: dict[Annotated[str, Field(max_length=16)], Count] | None = Field(
        None, max_length=MAX_KEYS, description="XID number -> events seen since the agent started")
    gpu_util_pct: Measure | None = None
    mem_copy_util_pct: Measure | None = None
    enc_util_pct: Measure | None = None
    dec_util_pct: Measure | None = None
    fb_total_mib: Measure | None = None
    fb_used_mib: Measure | None = None
    fb_free_mib: Measure | None = None
    fb_reserved_mib: Measure | None = None
    gpu_temp_c: Reading | None = None
    mem_temp_c: Reading | None = None
    power_w: Measure | None = None
    energy_mj: Measure | None = None
    sm_clock_mhz: Measure | None = None
    mem_clock_mhz: Measure | None = None
    pcie_tx_kbps: Measure | None = None
    pcie_rx_kbps: Measure | None = None
    pcie_replay: Measure | None = None
    nvlink_raw_tx_kib: Measure | None = None
    nvlink_raw_rx_kib: Measure | None = None
    nvlink_bandwidth_mbps: Measure | None = None
    # NVML GPM (Hopper and newer), since the previous sample: ratios 0-1 and bytes per second
    gr_engine_active: Measure | None = None
    sm_active: Measure | None = None
    sm_occupancy: Measure | None = None
    tensor_active: Measure | None = None
    dram_active: Measure | None = None
    pcie_tx_bps: Measure | None = None
    pcie_rx_bps: Measure | None = None
    nvlink_tx_bps: Measure | None = None
    nvlink_rx_bps: Measure | None = None
    ecc_sbe_vol: Measure | None = None
    ecc_dbe_vol: Measure | None = None
    ecc_sbe_agg: Measure | None = None
    ecc_dbe_agg: Measure | None = None
    remapped_rows_corr: Measure | None = None
    remapped_rows_unc: Measure | None = None
    remap_pending: Measure | None = None
    remap_failure: Measure | None = None
    throttle_mask: Count | None = None
    throttle: TextList | None = None
    processes: list[TelemetryGpuProcess] | None = Field(None, max_length=MAX_LIST)


class TelemetryXid(Block):
    gpu: Count | None = None
    uuid: Text | None = None
    xid: Count | None = None
    kind: Annotated[str, Field(max_length=32, description="application | hardware")] | None = None
    at: Measure | None = None


class TelemetryDisk(Block):
    path: Text | None = None
    device: Text | None = None
    total_bytes: Measure | None = None
    free_bytes: Measure | None = None
    read_bytes: Measure | None = None
    write_bytes: Measure | None = None
    read_bps: Measure | None = None
    write_bps: Measure | None = None


class TelemetryNet(Block):
    rx_bytes: Measure | None = None
    tx_bytes: Measure | None = None
    rx_errors: Measure | None = None
    tx_errors: Measure | None = None
    rx_dropped: Measure | None = None
    tx_dropped: Measure | None = None
    rx_bps: Measure | None = None
    tx_bps: Measure | None = None


class TelemetryHost(Block):
    cpu_count: Count | None = None
    cpu_physical: Count | None = None
    cpu_util_pct: Measure | None = None
    load1: Measure | None = None
    load5: Measure | None = None
    load15: Measure | None = None
    mem_total_bytes: Measure | None = None
    mem_available_bytes: Measure | None = None
    disk: TelemetryDisk | None = None
    net: TelemetryNet | None = None


class TelemetryQualificationCheck(Block):
    id: Text | None = None
    scope: Text | None = None
    status: Text | None = None
    measured: Text | None = None
    required: Text | None = None
    detail: Text | None = None


class TelemetryQualification(Block):
    """An on-prem node's ``anex-agent qualify`` result (``anex_agent.gpu.qualify.Qualification.to_dict()``)."""

    v: int | None = None
    status: Annotated[str, Field(max_length=32, description="pass | fail | incomplete")] | None = None
    required_ok: bool | None = None
    marketplace_ok: bool | None = None
    checked_at: Measure | None = None
    summary: dict[Text, Any] | None = Field(None, max_length=MAX_KEYS)
    checks: list[TelemetryQualificationCheck] | None = Field(None, max_length=MAX_LIST)


class Telemetry(Block):
    """The heartbeat's telemetry block (version :data:`TELEMETRY_VERSION`)."""

    v: int | None = None
    taken_at: Measure | None = Field(None, description="Unix seconds of the sample")
    hostname: Text | None = None
    health: TelemetryHealth | None = None
    nvml: TelemetryNvml | None = None
    inventory: TelemetryInventory | None = None
    gpus: list[TelemetryGpu] | None = Field(None, max_length=MAX_GPUS)
    xids: list[TelemetryXid] | None = Field(None, max_length=MAX_LIST, description="the latest XID events")
    host: TelemetryHost | None = None
    sample_seconds: Measure | None = Field(None, description="wall time the last sample cost")
    qualification: TelemetryQualification | None = Field(None, description="on-prem nodes only")

    def verdict(self) -> tuple[str | None, list[str] | None]:
        """``(verdict, reasons)`` of ``health``; ``(None, None)`` when it carries no verdict this version knows."""
        if self.health is None or "verdict" not in self.health.model_fields_set:
            return None, None
        if self.health.verdict not in KNOWN_VERDICTS:
            return None, None
        return self.health.verdict, list(self.health.reasons)
