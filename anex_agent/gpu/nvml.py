"""NVML behind one small interface: lazy import, initialised once, failures classified.

:class:`Nvml` is the only object in the package that touches ``pynvml`` (the
``nvidia-ml-py`` distribution). Contract:

* ``pynvml`` is imported on the first :meth:`Nvml.ensure_ready` that finds the NVML
  library (``libnvidia-ml.so.1``), never at module import, so a node without the
  package or without a driver pays nothing and the tests can put a fake module in
  ``sys.modules["pynvml"]``.
* Every method blocks (NVML calls go into the kernel driver); async callers run
  them in a thread (``asyncio.to_thread``), never on the event loop.
* ``nvmlInit`` runs once. After a failure (no driver, driver/library mismatch...)
  :meth:`ensure_ready` tries again at most every ``retry_interval`` seconds, so a
  driver reload is picked up without restarting the agent and a broken driver does
  not cost an ``nvmlInit`` per sample.
* :meth:`call` returns :data:`ABSENT` when NVML says a field is not supported on
  this GPU (NOT_SUPPORTED, FUNCTION_NOT_FOUND with an older driver, NO_DATA...):
  the field is simply left out. Errors that concern one GPU (GPU lost, reset
  required) raise :class:`DeviceFailure`; errors that break NVML as a whole
  (version mismatch, driver unloaded) set :attr:`Nvml.status` and raise
  :class:`NvmlUnavailable`.
* A change of state is logged once (warning when it breaks, info when it comes
  back), never once per sample.

Error codes are NVML's ``nvmlReturn_t`` (nvml.h, "Device Queries" error list),
re-exported by pynvml as ``NVML_ERROR_*``; the values are fixed by the C ABI, so
they are spelled out here and the module can classify without importing pynvml.
"""

from __future__ import annotations

import enum
import importlib
import logging
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from anex_agent.errors import AnexError

log = logging.getLogger(__name__)

# nvmlReturn_t values (nvml.h). Stable ABI constants.
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_LIBRARY = "libnvidia-ml.so.1"  # the name pynvml loads on Linux
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_NO_DATA = 21
NVML_ERROR_DEPRECATED = 26


class NvmlState(str, enum.Enum):
    """Where NVML stands on this node (``telemetry["nvml"]["state"]``)."""

    not_started = "not_started"
    ok = "ok"
    no_driver = "no_driver"  # pynvml missing or libnvidia-ml.so.1 not found (12)
    driver_not_loaded = "driver_not_loaded"  # 9
    version_mismatch = "version_mismatch"  # 18
    gpu_lost = "gpu_lost"  # 15
    reset_required = "reset_required"  # 16
    no_permission = "no_permission"  # 4
    error = "error"  # anything else


@dataclass(frozen=True)
class NvmlStatus:
    state: NvmlState
    reason: str = ""
    code: int | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state.value, "reason": self.reason}
        if self.code is not None:
            out["code"] = self.code
        return out


OK = NvmlStatus(NvmlState.ok, "NVML initialised")

# code -> (state, reason). The reasons are what an operator reads on the dashboard.
_CLASSES: dict[int, tuple[NvmlState, str]] = {
    NVML_ERROR_LIBRARY_NOT_FOUND: (
        NvmlState.no_driver,
        "no NVIDIA driver: the NVML library libnvidia-ml.so.1 was not found",
    ),
    NVML_ERROR_DRIVER_NOT_LOADED: (
        NvmlState.driver_not_loaded,
        "the NVIDIA kernel driver is not loaded (modprobe nvidia, or check dmesg)",
    ),
    NVML_ERROR_LIB_RM_VERSION_MISMATCH: (
        NvmlState.version_mismatch,
        "NVIDIA driver/library version mismatch: the driver was updated under the running node; "
        "a reboot or a reload of the nvidia kernel modules is needed",
    ),
    NVML_ERROR_GPU_IS_LOST: (
        NvmlState.gpu_lost,
        "a GPU is lost (fell off the bus or stopped answering); it needs a reset or a reboot",
    ),
    NVML_ERROR_RESET_REQUIRED: (
        NvmlState.reset_required,
        "a GPU requires a reset (nvidia-smi -r) or a reboot before it can be used again",
    ),
    NVML_ERROR_NO_PERMISSION: (
        NvmlState.no_permission,
        "no permission to use NVML (the agent cannot open /dev/nvidiactl; run it with access to the GPU devices)",
    ),
}

#: Codes that mean "this field is not available here": the field is left out.
ABSENT_CODES = frozenset(
    {NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND, NVML_ERROR_NOT_FOUND, NVML_ERROR_NO_DATA, NVML_ERROR_DEPRECATED}
)
#: Codes that concern the one GPU a call was made on.
DEVICE_CODES = frozenset({NVML_ERROR_GPU_IS_LOST, NVML_ERROR_RESET_REQUIRED})
#: Codes that mean NVML as a whole stopped working: re-initialise later.
GLOBAL_CODES = frozenset(
    {NVML_ERROR_UNINITIALIZED, NVML_ERROR_DRIVER_NOT_LOADED, NVML_ERROR_LIBRARY_NOT_FOUND, NVML_ERROR_LIB_RM_VERSION_MISMATCH}
)


class _Absent:
    """The value of a field NVML does not support on this GPU."""

    _instance: "_Absent | None" = None

    def __new__(cls) -> "_Absent":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


class NvmlUnavailable(AnexError):
    """NVML cannot be used now; ``status`` says why."""

    def __init__(self, status: NvmlStatus) -> None:
        self.status = status
        super().__init__(status.reason)


class DeviceFailure(AnexError):
    """One GPU failed (lost, reset required); ``status`` says how."""

    def __init__(self, status: NvmlStatus) -> None:
        self.status = status
        super().__init__(status.reason)


def error_code(exc: BaseException) -> int | None:
    """The ``nvmlReturn_t`` carried by a ``pynvml.NVMLError`` (its ``value``), else None."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def classify(exc: BaseException) -> NvmlStatus:
    """Map an exception from pynvml (or its import) to a state with an operator-facing reason."""
    if isinstance(exc, ImportError):
        return NvmlStatus(NvmlState.no_driver, f"the pynvml module (nvidia-ml-py) cannot be imported: {exc}")
    code = error_code(exc)
    if code is None:
        return NvmlStatus(NvmlState.error, f"unexpected error from NVML: {type(exc).__name__}: {exc}")
    if code in _CLASSES:
        state, reason = _CLASSES[code]
        return NvmlStatus(state, reason, code)
    return NvmlStatus(NvmlState.error, f"NVML error {code}: {exc}", code)


class _LibraryNotFound(Exception):
    value = NVML_ERROR_LIBRARY_NOT_FOUND  # what pynvml's nvmlInit raises without the library


def _import_pynvml() -> Any:
    """pynvml, once the NVML library loads (_LibraryNotFound otherwise): a machine without the
    NVIDIA driver does not carry pynvml (about 2 MB of the agent's memory). A module already
    in ``sys.modules`` (a test's fake) is used as it is."""
    if "pynvml" not in sys.modules:
        import ctypes

        try:
            ctypes.CDLL(NVML_LIBRARY)
        except OSError:
            raise _LibraryNotFound(f"{NVML_LIBRARY} cannot be loaded") from None
    return importlib.import_module("pynvml")


class Nvml:
    """Owner of the pynvml module and of the NVML init state. Thread-safe; blocking."""

    def __init__(self, *, retry_interval: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.retry_interval = retry_interval
        self._clock = clock
        self._lock = threading.RLock()
        self._module: Any = None
        self._initialised = False
        self._last_attempt: float | None = None
        self._status = NvmlStatus(NvmlState.not_started, "NVML not initialised yet")
        #: bumped on every successful init: cached handles from an older generation are stale
        self.generation = 0

    @property
    def status(self) -> NvmlStatus:
        return self._status

    @property
    def module(self) -> Any:
        """The pynvml module (for its constants); only valid after :meth:`ensure_ready` returned True."""
        return self._module

    def _set_status(self, status: NvmlStatus) -> None:
        previous = self._status
        self._status = status
        if previous.state == status.state:
            return
        if status.state is NvmlState.ok:
            log.info("NVML ready (%s)", status.reason)
        elif status.state is NvmlState.no_driver and previous.state is NvmlState.not_started:
            log.info("GPU telemetry off: %s", status.reason)
        else:
            log.warning("NVML state %s -> %s: %s", previous.state.value, status.state.value, status.reason)

    def ensure_ready(self) -> bool:
        """Import pynvml and call ``nvmlInit`` if not done yet (rate-limited retries). True when usable."""
        with self._lock:
            if self._initialised:
                return True
            now = self._clock()
            if self._last_attempt is not None and now - self._last_attempt < self.retry_interval:
                return False
            self._last_attempt = now
            try:
                if self._module is None:
                    self._module = _import_pynvml()
                self._module.nvmlInit()
            except Exception as exc:  # NVMLError subclasses, ImportError, OSError from ctypes
                self._set_status(classify(exc))
                return False
            self._initialised = True
            self.generation += 1
            self._set_status(OK)
            return True

    def mark_broken(self, status: NvmlStatus) -> None:
        """NVML failed as a whole after init: shut it down and retry init later."""
        with self._lock:
            if self._initialised:
                self._initialised = False
                try:
                    self._module.nvmlShutdown()
                except Exception:  # it is already broken; shutting down is best effort
                    pass
            self._last_attempt = self._clock()
            self._set_status(status)

    def shutdown(self) -> None:
        """Release NVML (``nvmlShutdown``) if it was initialised."""
        with self._lock:
            if self._initialised:
                self._initialised = False
                try:
                    self._module.nvmlShutdown()
                except Exception as exc:
                    log.debug("nvmlShutdown failed: %s", exc)
            self._last_attempt = None

    def call(self, name: str, *args: Any) -> Any:
        """Call ``pynvml.<name>(*args)``.

        Returns the value, or :data:`ABSENT` when the GPU/driver does not support it.
        Raises :class:`DeviceFailure` for one-GPU failures and :class:`NvmlUnavailable`
        (after marking NVML broken) for failures of NVML as a whole.
        """
        module = self._module
        if module is None or not self._initialised:
            raise NvmlUnavailable(self._status)
        fn = getattr(module, name, None)
        if fn is None:  # a pynvml older than the function
            return ABSENT
        try:
            return fn(*args)
        except Exception as exc:
            code = error_code(exc)
            if code in ABSENT_CODES:
                return ABSENT
            status = classify(exc)
            if code in DEVICE_CODES:
                raise DeviceFailure(status) from None
            if code in GLOBAL_CODES:
                self.mark_broken(status)
                raise NvmlUnavailable(status) from None
            if code is None:
                raise
            # other codes (UNKNOWN, TIMEOUT, NO_PERMISSION on one query...): the field is absent
            log.debug("NVML %s failed: %s", name, status.reason)
            return ABSENT


def text(value: Any) -> str:
    """pynvml returns ``str`` or ``bytes`` depending on version and function; always give ``str``."""
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)
