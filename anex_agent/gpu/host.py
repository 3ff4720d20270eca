"""Host telemetry through psutil: CPU, memory, the state dir's filesystem, network, load.

:class:`HostSampler` is created once (it remembers the previous counters so it can
report rates) and :meth:`HostSampler.sample` returns a JSON-able dict (blocking but
cheap: it reads /proc; call it in the sampler thread with the GPU sample):

=============================  ==================================================
``cpu_count``                   logical CPUs
``cpu_physical``                physical cores (absent where psutil cannot tell)
``cpu_util_pct``                CPU use since the previous sample, % of all CPUs
``load1`` ``load5`` ``load15``  load averages
``mem_total_bytes``             RAM
``mem_available_bytes``         RAM available without swapping
``disk``                        the state dir's filesystem: ``path``, ``total_bytes``,
                                ``free_bytes``, ``device`` and, when the device is a
                                block device psutil counts, ``read_bytes``,
                                ``write_bytes`` (since boot) and ``read_bps``,
                                ``write_bps`` (since the previous sample)
``net``                         all interfaces but loopback: ``rx_bytes``,
                                ``tx_bytes``, ``rx_bps``, ``tx_bps``, ``rx_errors``,
                                ``tx_errors``, ``rx_dropped``, ``tx_dropped``
=============================  ==================================================
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import psutil


def block_device_of(path: str) -> str | None:
    """Kernel name of the block device holding ``path`` (e.g. "sda1", "dm-0"), or None.

    Uses st_dev -> /sys/dev/block/MAJ:MIN, which also works for LVM and NVMe
    partitions. Overlay and tmpfs filesystems have no block device (None).
    """
    try:
        st = os.stat(path)
    except OSError:
        return None
    major, minor = os.major(st.st_dev), os.minor(st.st_dev)
    if major == 0:
        return None
    link = Path(f"/sys/dev/block/{major}:{minor}")
    try:
        return link.resolve().name
    except OSError:
        return None


class HostSampler:
    def __init__(self, state_dir: str | os.PathLike[str] = "/", *, clock: Callable[[], float] = time.monotonic) -> None:
        self.state_dir = str(state_dir)
        self._clock = clock
        self.cpu_count = psutil.cpu_count(logical=True) or 1
        self.cpu_physical = psutil.cpu_count(logical=False)
        self.device = block_device_of(self.state_dir)
        self._prev_time: float | None = None
        self._prev_disk: tuple[int, int] | None = None
        self._prev_net: tuple[int, int] | None = None
        psutil.cpu_percent(interval=None)  # prime: the first real call reports since now

    def _disk(self, dt: float | None) -> dict[str, Any]:
        out: dict[str, Any] = {"path": self.state_dir}
        try:
            usage = psutil.disk_usage(self.state_dir)
            out.update(total_bytes=usage.total, free_bytes=usage.free)
        except OSError:
            pass
        if self.device is None:
            return out
        out["device"] = self.device
        counters = psutil.disk_io_counters(perdisk=True) or {}
        io = counters.get(self.device)
        if io is None:
            return out
        out.update(read_bytes=io.read_bytes, write_bytes=io.write_bytes)
        if dt and self._prev_disk is not None:
            out["read_bps"] = round(max(0, io.read_bytes - self._prev_disk[0]) / dt, 1)
            out["write_bps"] = round(max(0, io.write_bytes - self._prev_disk[1]) / dt, 1)
        self._prev_disk = (io.read_bytes, io.write_bytes)
        return out

    def _net(self, dt: float | None) -> dict[str, Any]:
        totals = dict(rx_bytes=0, tx_bytes=0, rx_errors=0, tx_errors=0, rx_dropped=0, tx_dropped=0)
        for name, nic in (psutil.net_io_counters(pernic=True) or {}).items():
            if name == "lo":
                continue
            totals["rx_bytes"] += nic.bytes_recv
            totals["tx_bytes"] += nic.bytes_sent
            totals["rx_errors"] += nic.errin
            totals["tx_errors"] += nic.errout
            totals["rx_dropped"] += nic.dropin
            totals["tx_dropped"] += nic.dropout
        out: dict[str, Any] = dict(totals)
        if dt and self._prev_net is not None:
            out["rx_bps"] = round(max(0, totals["rx_bytes"] - self._prev_net[0]) / dt, 1)
            out["tx_bps"] = round(max(0, totals["tx_bytes"] - self._prev_net[1]) / dt, 1)
        self._prev_net = (totals["rx_bytes"], totals["tx_bytes"])
        return out

    def sample(self) -> dict[str, Any]:
        now = self._clock()
        dt = None if self._prev_time is None else max(now - self._prev_time, 1e-6)
        self._prev_time = now
        mem = psutil.virtual_memory()
        load1, load5, load15 = os.getloadavg()
        out: dict[str, Any] = {
            "cpu_count": self.cpu_count,
            "cpu_util_pct": psutil.cpu_percent(interval=None),
            "load1": round(load1, 2),
            "load5": round(load5, 2),
            "load15": round(load15, 2),
            "mem_total_bytes": mem.total,
            "mem_available_bytes": mem.available,
            "disk": self._disk(dt),
            "net": self._net(dt),
        }
        if self.cpu_physical:
            out["cpu_physical"] = self.cpu_physical
        return out
