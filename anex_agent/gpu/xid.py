"""XID events: a background thread waiting on NVML's event set, and their classification.

An XID is the driver's error report for a GPU (NVIDIA "XID Errors" catalogue).
NVML delivers them as events of type ``nvmlEventTypeXidCriticalError`` with the XID
number in ``eventData``. :class:`XidWatcher` registers every GPU for that type on
one event set and loops on ``nvmlEventSetWait(set, timeout_ms)``; the timeout keeps
the loop responsive to :meth:`XidWatcher.stop` (an NVML wait cannot be interrupted).

Classification (:func:`anex_agent.telemetry.models.classify_xid`, shared with the coordinator): 13 (graphics engine exception), 31 (GPU memory
page fault), 43 (GPU stopped processing), 45 (preemptive cleanup), 68 (video
processor exception) are caused by the application and leave the GPU usable
("application"); every other XID is a hardware, driver or bus fault that makes the
GPU unhealthy ("hardware"). A hardware XID keeps the GPU unhealthy until the agent
restarts (after the GPU reset or reboot that such faults need).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from anex_agent.gpu.nvml import (
    ABSENT,
    NVML_ERROR_TIMEOUT,
    DeviceFailure,
    Nvml,
    NvmlUnavailable,
    error_code,
    text,
)
from anex_agent.telemetry.models import APPLICATION_XIDS, classify_xid  # the classification is part of the wire vocabulary

log = logging.getLogger(__name__)

__all__ = ["APPLICATION_XIDS", "XidEvent", "XidLog", "XidWatcher", "classify_xid"]

WAIT_TIMEOUT_MS = 500
MAX_RECENT = 64


@dataclass(frozen=True)
class XidEvent:
    gpu: int
    uuid: str
    xid: int
    kind: str  # "application" | "hardware"
    at: float  # wall-clock seconds (time.time())

    def to_dict(self) -> dict[str, Any]:
        return {"gpu": self.gpu, "uuid": self.uuid, "xid": self.xid, "kind": self.kind, "at": round(self.at, 3)}


class XidLog:
    """Thread-safe record of XID events: recent ones, counts and last XID per GPU."""

    def __init__(self, max_recent: int = MAX_RECENT) -> None:
        self._lock = threading.Lock()
        self._recent: collections.deque[XidEvent] = collections.deque(maxlen=max_recent)
        self._counts: collections.Counter[tuple[int, str, int, str]] = collections.Counter()
        self._last: dict[int, int] = {}
        self._hardware: dict[int, list[int]] = {}

    def record(self, event: XidEvent) -> None:
        with self._lock:
            self._recent.append(event)
            self._counts[(event.gpu, event.uuid, event.xid, event.kind)] += 1
            self._last[event.gpu] = event.xid
            if event.kind == "hardware":
                self._hardware.setdefault(event.gpu, []).append(event.xid)

    def recent(self) -> list[XidEvent]:
        with self._lock:
            return list(self._recent)

    def counts(self) -> dict[tuple[int, str, int, str], int]:
        """(gpu, uuid, xid, kind) -> number of events."""
        with self._lock:
            return dict(self._counts)

    def last_xid(self, gpu: int) -> int:
        """The last XID seen on a GPU, 0 if none (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS)."""
        with self._lock:
            return self._last.get(gpu, 0)

    def hardware_xids(self) -> dict[int, list[int]]:
        """GPU index -> the hardware XIDs seen on it (these make the GPU unhealthy)."""
        with self._lock:
            return {gpu: list(xids) for gpu, xids in self._hardware.items()}


class XidWatcher:
    """Owns the event-set thread. ``start`` after NVML init; ``stop`` joins within ~timeout."""

    def __init__(self, nvml: Nvml, handles: list[Any], uuids: dict[str, int], xid_log: XidLog, *,
                 timeout_ms: int = WAIT_TIMEOUT_MS, clock: Callable[[], float] = time.time) -> None:
        self._nvml = nvml
        self._handles = handles
        self._uuids = uuids  # uuid -> gpu index
        self._log = xid_log
        self._timeout_ms = timeout_ms
        self._clock = clock
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.registered: list[int] = []
        self.error: str | None = None

    def start(self) -> bool:
        """Create the event set and register GPUs; start the thread. False (with ``error``) if impossible."""
        m = self._nvml.module
        try:
            event_set = self._nvml.call("nvmlEventSetCreate")
        except (NvmlUnavailable, DeviceFailure) as exc:
            self.error = f"cannot watch XID events: {exc}"
            return False
        if event_set is ABSENT:
            self.error = "NVML event sets are not supported here"
            return False
        for index, handle in enumerate(self._handles):
            try:
                ok = self._nvml.call("nvmlDeviceRegisterEvents", handle, m.nvmlEventTypeXidCriticalError, event_set)
            except DeviceFailure as exc:  # this GPU is lost or needs a reset: watch the others
                log.warning("GPU %d: not watching XID events: %s", index, exc)
                continue
            except NvmlUnavailable as exc:
                self._free(event_set)
                self.error = f"cannot watch XID events: {exc}"
                return False
            if ok is not ABSENT:
                self.registered.append(index)
        if not self.registered:
            self._free(event_set)
            self.error = "no GPU supports XID events"
            return False
        self._thread = threading.Thread(target=self._run, args=(event_set,), name="anex-xid-events", daemon=True)
        self._thread.start()
        return True

    def stop(self, timeout: float | None = None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout if timeout is not None else self._timeout_ms / 1000 * 4 + 1)
            self._thread = None

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _free(self, event_set: Any) -> None:
        try:
            self._nvml.module.nvmlEventSetFree(event_set)
        except Exception:  # freeing a set of a broken NVML: nothing more to do
            pass

    def _run(self, event_set: Any) -> None:
        module = self._nvml.module
        try:
            while not self._stop.is_set():
                try:
                    data = module.nvmlEventSetWait(event_set, self._timeout_ms)
                except Exception as exc:
                    if error_code(exc) == NVML_ERROR_TIMEOUT:
                        continue
                    self.error = f"XID event wait failed: {exc}"
                    log.warning("%s; XID watching stopped until NVML is re-initialised", self.error)
                    return
                self._handle(data)
        finally:
            self._free(event_set)

    def _handle(self, data: Any) -> None:
        if not data.eventType & self._nvml.module.nvmlEventTypeXidCriticalError:
            return
        xid = int(data.eventData)
        try:
            uuid = text(self._nvml.module.nvmlDeviceGetUUID(data.device))
        except Exception:
            uuid = ""
        gpu = self._uuids.get(uuid, -1)
        event = XidEvent(gpu=gpu, uuid=uuid, xid=xid, kind=classify_xid(xid), at=self._clock())
        self._log.record(event)
        if event.kind == "hardware":
            log.error("GPU %d (%s): XID %d, a hardware/driver fault: the GPU is unhealthy", gpu, uuid, xid)
        else:
            log.info("GPU %d (%s): XID %d, an application fault", gpu, uuid, xid)
