"""The telemetry source the agent owns: samples on an interval, keeps the latest snapshot.

Usage in the agent (one owned task in its TaskGroup)::

    monitor = TelemetryMonitor(state_dir=settings.state_dir, qualify=provider == "onprem")
    register_collectors(api.registry, monitor)          # /metrics reads monitor.snapshot()
    tg.create_task(monitor.run(), name="gpu-telemetry")
    ...
    heartbeat.telemetry = monitor.telemetry()           # compact block, see telemetry/models.py
    ...
    monitor.close()                                     # at shutdown (stops the XID thread)

Contracts:

* :meth:`collect` blocks (NVML, /proc) and is serialised by a lock; :meth:`sample_once`
  and :meth:`run` call it through ``asyncio.to_thread`` so the event loop never waits
  on the driver.
* :meth:`snapshot` and :meth:`telemetry` never call NVML: they return what the last
  sample saw, so a Prometheus scrape or a heartbeat costs microseconds.
* Nothing here raises because of NVML: failures become ``snapshot().nvml`` states and
  reasons in the verdict. Unexpected errors in a sample are logged once per distinct
  message and the loop keeps going.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from anex_agent.gpu.gpm import SUPPORTED, GpmSampler
from anex_agent.gpu.health import Verdict, assess
from anex_agent.gpu.host import HostSampler
from anex_agent.gpu.inventory import NodeInventory, read_inventory
from anex_agent.gpu.nvml import DeviceFailure, Nvml, NvmlState, NvmlStatus, NvmlUnavailable
from anex_agent.gpu.sampler import sample_gpu
from anex_agent.gpu.xid import XidEvent, XidLog, XidWatcher

log = logging.getLogger(__name__)

#: seconds between samples; dcgm-exporter collects every 30 s, Prometheus scrapes every 15 s by default
DEFAULT_INTERVAL = 15.0


@dataclass(frozen=True)
class Snapshot:
    """Everything one sample saw. Immutable: readers on other threads get a consistent view."""

    taken_at: float
    hostname: str
    nvml: NvmlStatus
    inventory: NodeInventory | None
    samples: dict[int, dict[str, Any]]
    gpu_failures: dict[int, str]
    host: dict[str, Any] | None
    verdict: Verdict
    xid_recent: tuple[XidEvent, ...] = ()
    xid_counts: dict[tuple[int, str, int, str], int] = field(default_factory=dict)
    xid_last: dict[int, int] = field(default_factory=dict)
    xid_watching: bool = False
    sample_seconds: float = 0.0


class TelemetryMonitor:
    def __init__(
        self,
        *,
        state_dir: str = "/",
        interval: float = DEFAULT_INTERVAL,
        hostname: str | None = None,
        nvml: Nvml | None = None,
        watch_xids: bool = True,
        xid_timeout_ms: int = 500,
        qualify: bool = False,
    ) -> None:
        self.interval = interval
        self.hostname = hostname or socket.gethostname()
        self.nvml = nvml or Nvml()
        self.host = HostSampler(state_dir)
        self.xid_log = XidLog()
        self._watch_xids = watch_xids
        self._xid_timeout_ms = xid_timeout_ms
        self._watcher: XidWatcher | None = None
        self._lock = threading.Lock()
        self._generation = 0
        self._inventory: NodeInventory | None = None
        self._handles: list[Any] = []
        self._failures_at_start: dict[int, str] = {}
        self._expected_gpus: int | None = None
        self._latest: Snapshot | None = None
        self._logged_errors: set[str] = set()
        self._gpu_states: dict[int, str] = {}
        #: the on-prem qualification (qualify.Qualification.to_dict()), sent as telemetry["qualification"];
        #: with ``qualify=True`` (on-prem nodes) the monitor computes it in the sampler thread at the first
        #: sample and again after each NVML re-initialisation; callers may also set it themselves
        self.qualification: dict[str, Any] | None = None
        self.qualify = qualify
        self._qualified_generation: int | None = None
        #: GPM profiling metrics: one sample per supported GPU per cycle, against the previous cycle's
        self.gpm = GpmSampler(self.nvml)
        #: per GPU: (monotonic time, NVLink raw TX KiB, RX KiB) of the previous cycle, for the bandwidth rate
        self._nvlink_prev: dict[int, tuple[float, int, int]] = {}
        self._monotonic = time.monotonic

    # ------------------------------------------------------------------ blocking side

    def _refresh_inventory(self) -> None:
        self.gpm.reset()
        self._nvlink_prev = {}
        inventory, handles, failures = read_inventory(self.nvml)
        self._inventory, self._handles, self._failures_at_start = inventory, handles, failures
        self._generation = self.nvml.generation
        count = len(inventory.gpus) + len(failures)
        if self._expected_gpus is None or count > self._expected_gpus:
            self._expected_gpus = count
        self._stop_watcher()
        if self._watch_xids and handles:
            uuids = {g.uuid: g.index for g in inventory.gpus}
            watcher = XidWatcher(self.nvml, handles, uuids, self.xid_log, timeout_ms=self._xid_timeout_ms)
            if watcher.start():
                self._watcher = watcher
            else:
                log.info("XID events not watched: %s", watcher.error)

    def _stop_watcher(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _sample_gpus(self) -> tuple[dict[int, dict[str, Any]], dict[int, str]]:
        samples: dict[int, dict[str, Any]] = {}
        failures: dict[int, str] = dict(self._failures_at_start)
        assert self._inventory is not None
        for info, handle in zip(self._inventory.gpus, self._handles):
            try:
                sample = sample_gpu(self.nvml, handle)
                if info.gpm == SUPPORTED:
                    sample.update(self.gpm.sample(info.index, handle))
                self._nvlink_bandwidth(info.index, sample)
                samples[info.index] = sample
            except DeviceFailure as failure:
                failures[info.index] = failure.status.state.value
                self.gpm.forget(info.index)
                self._nvlink_prev.pop(info.index, None)
        for info in self._inventory.gpus:  # log per-GPU state changes once, not per sample
            state = failures.get(info.index, "ok")
            if self._gpu_states.get(info.index, "ok") != state:
                if state == "ok":
                    log.info("GPU %d (%s) answers again", info.index, info.uuid)
                else:
                    log.warning("GPU %d (%s): %s", info.index, info.uuid, state.replace("_", " "))
            self._gpu_states[info.index] = state
        return samples, failures

    def _nvlink_bandwidth(self, index: int, sample: dict[str, Any]) -> None:
        """``nvlink_bandwidth_mbps`` (TX + RX, all links, 10^6 bytes/s, DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL).

        From GPM's per-second rates where the GPU has them, else from the growth of NVML's raw
        throughput counters since the previous cycle; absent on the first cycle and without NVLink."""
        now = self._monotonic()
        tx, rx = sample.get("nvlink_raw_tx_kib"), sample.get("nvlink_raw_rx_kib")
        previous = self._nvlink_prev.get(index)
        if tx is not None and rx is not None:
            self._nvlink_prev[index] = (now, tx, rx)
        if "nvlink_tx_bps" in sample and "nvlink_rx_bps" in sample:
            sample["nvlink_bandwidth_mbps"] = round((sample["nvlink_tx_bps"] + sample["nvlink_rx_bps"]) / 1e6, 3)
        elif tx is not None and rx is not None and previous is not None:
            seconds, grown = now - previous[0], (tx - previous[1]) + (rx - previous[2])
            if seconds > 0 and grown >= 0:  # a counter that went back (driver reload) gives no rate this cycle
                sample["nvlink_bandwidth_mbps"] = round(grown * 1024 / seconds / 1e6, 3)

    def collect(self) -> Snapshot:
        """Take one sample now (blocking) and make it the latest snapshot."""
        with self._lock:
            started = time.perf_counter()
            samples: dict[int, dict[str, Any]] = {}
            failures: dict[int, str] = {}
            try:
                if self.nvml.ensure_ready():
                    if self._inventory is None or self._generation != self.nvml.generation:
                        self._refresh_inventory()
                    samples, failures = self._sample_gpus()
            except NvmlUnavailable:
                samples, failures = {}, {}
                self._stop_watcher()
                self.gpm.reset()
            except Exception as exc:  # never let telemetry take the agent down
                self._log_once(f"GPU sample failed: {type(exc).__name__}: {exc}")
            if self.qualify and self._qualified_generation != self.nvml.generation:
                self._qualify()
            host: dict[str, Any] | None = None
            try:
                host = self.host.sample()
            except Exception as exc:
                self._log_once(f"host sample failed: {type(exc).__name__}: {exc}")
            inventory = self._inventory if self.nvml.status.state is NvmlState.ok else None
            verdict = assess(
                self.nvml.status,
                inventory,
                samples,
                gpu_failures=failures,
                hardware_xids=self.xid_log.hardware_xids(),
                expected_gpus=self._expected_gpus if inventory is not None else None,
                host=host,
            )
            snapshot = Snapshot(
                taken_at=time.time(),
                hostname=self.hostname,
                nvml=self.nvml.status,
                inventory=inventory,
                samples=samples,
                gpu_failures=failures,
                host=host,
                verdict=verdict,
                xid_recent=tuple(self.xid_log.recent()),
                xid_counts=self.xid_log.counts(),
                xid_last={g.index: self.xid_log.last_xid(g.index) for g in (inventory.gpus if inventory else ())},
                xid_watching=self._watcher is not None and self._watcher.running,
                sample_seconds=time.perf_counter() - started,
            )
            self._latest = snapshot
            return snapshot

    def _qualify(self) -> None:
        from anex_agent.gpu.qualify import qualify

        try:
            self.qualification = qualify(self.nvml)
        except Exception as exc:
            self._log_once(f"qualification failed: {type(exc).__name__}: {exc}")
        self._qualified_generation = self.nvml.generation

    def _log_once(self, message: str) -> None:
        if message not in self._logged_errors:
            self._logged_errors.add(message)
            log.warning("%s (logged once)", message)

    def close(self) -> None:
        """Stop the XID thread and release NVML."""
        with self._lock:
            self._stop_watcher()
            self.gpm.reset()
            self.nvml.shutdown()

    # ------------------------------------------------------------------ async side / readers

    async def sample_once(self) -> Snapshot:
        return await asyncio.to_thread(self.collect)

    async def wait_first_sample(self, timeout: float) -> bool:
        """Wait (at most ``timeout`` s) until a snapshot exists; True when one does.

        Lets the first heartbeat carry telemetry instead of arriving one interval late.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while self._latest is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        return self._latest is not None

    async def run(self) -> None:
        """Sample every ``interval`` seconds until cancelled (run it as a named TaskGroup task)."""
        try:
            while True:
                await self.sample_once()
                await asyncio.sleep(self.interval)
        finally:
            await asyncio.to_thread(self.close)

    def snapshot(self) -> Snapshot | None:
        """The latest snapshot (None before the first sample). Never calls NVML."""
        return self._latest

    def telemetry(self) -> dict[str, Any] | None:
        """The compact heartbeat block of the latest snapshot (see :mod:`anex_agent.gpu.telemetry`)."""
        from anex_agent.gpu.telemetry import build_telemetry

        snapshot = self._latest
        return None if snapshot is None else build_telemetry(snapshot, qualification=self.qualification)
