"""Probes of what this process may do: Linux capabilities and the TUN device.

Pure parsing (:func:`parse_capeff`) plus tiny probes that never raise; used by the
engines' ``is_supported()`` and by ``anex-agent detect``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

#: Capability numbers from include/uapi/linux/capability.h.
CAP_NET_ADMIN = 12
CAP_NET_RAW = 13

TUN_PATH = "/dev/net/tun"


def parse_capeff(status_text: str) -> int | None:
    """The effective capability mask from the text of /proc/<pid>/status (``CapEff:`` hex), or None."""
    for line in status_text.splitlines():
        if line.startswith("CapEff:"):
            try:
                return int(line.split(":", 1)[1].strip(), 16)
            except ValueError:
                return None
    return None


def has_capability(cap: int, status_path: str = "/proc/self/status") -> bool:
    """Whether this process holds capability ``cap`` in its effective set (False when unknown)."""
    try:
        with open(status_path, encoding="ascii", errors="replace") as handle:
            mask = parse_capeff(handle.read())
    except OSError:
        return False
    return mask is not None and bool(mask >> cap & 1)


def tun_usable(path: str = TUN_PATH) -> tuple[bool, str]:
    """Whether the TUN clone device can be opened read-write; the reason when not."""
    try:
        fd = os.open(path, os.O_RDWR)
    except FileNotFoundError:
        return False, f"{path} does not exist (the container has no TUN device; add --device /dev/net/tun)"
    except PermissionError:
        return False, f"{path} cannot be opened: permission denied"
    except OSError as err:
        if err.errno == errno.ENODEV:
            return False, f"{path}: the kernel has no TUN support"
        return False, f"{path} cannot be opened: {err.strerror}"
    os.close(fd)
    return True, f"{path} usable"


def call_off_loop(func: Callable[..., T], *args: object) -> T:
    """``func(*args)`` in a thread that runs no asyncio event loop; returns its result or raises its error.

    pyroute2 (0.9) implements its synchronous ``IPRoute``/``WireGuard`` on top of asyncio: it
    drives a loop of its own with ``run_until_complete``. In a thread whose loop is already
    running that fails ("This event loop is already running") after it has created the
    coroutine ``AsyncNetlinkSocket.setup_endpoint``, which is then never awaited (a
    RuntimeWarning) and the probe answers wrongly. Synchronous probes (``is_supported()``,
    called by ``detect`` from any context) therefore run netlink through this: directly
    when no loop runs in this thread, else in a short-lived worker thread that is joined
    (the caller blocks as any synchronous probe does).
    """
    import asyncio

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return func(*args)
    box: dict[str, object] = {}

    def work() -> None:
        try:
            box["result"] = func(*args)
        except BaseException as err:  # re-raised in the caller's thread
            box["error"] = err

    worker = threading.Thread(target=work, name="anex-netlink-probe", daemon=True)
    worker.start()
    worker.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]
