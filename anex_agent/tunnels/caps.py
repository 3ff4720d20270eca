"""Probes of what this process may do: Linux capabilities and the TUN device.

Pure parsing (:func:`parse_capeff`) plus tiny probes that never raise; used by the
engines' ``is_supported()`` and by ``anex-agent detect``.
"""

from __future__ import annotations

import errno
import os

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
