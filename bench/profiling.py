"""What a benchmark scenario is limited by, taken while it runs: py-spy samples of a Python
process, the kernel's SNMP counters of a network namespace, ``ss -tin`` of its TCP connections.

Used by ``bench_longpipe.py --profile DIR``. Each helper is a no-op that says why (``None`` or a
``skipped`` entry) when its tool is missing, so a bench run never fails for want of a profiler.
"""

from __future__ import annotations

import re
import shutil
import signal
import statistics
import subprocess
import threading
from pathlib import Path

# the counters that say where datagrams and segments were lost (deltas are reported)
SNMP_KEYS = {
    "Udp": ("InDatagrams", "OutDatagrams", "RcvbufErrors", "SndbufErrors", "InErrors"),
    "Tcp": ("InSegs", "OutSegs", "RetransSegs"),
    "TcpExt": ("TCPLossProbes", "TCPSackRecovery", "TCPLostRetransmit", "TCPDSACKRecv", "TCPDSACKOldSent",
               "TCPOFOQueue", "TCPRcvQDrop", "TCPSACKReorder", "TCPTimeouts", "TCPSpuriousRTOs"),
}


def snmp(ns) -> dict[str, int]:
    """``Group.Key`` -> value of :data:`SNMP_KEYS` in ``ns`` (/proc/net/snmp and /proc/net/netstat)."""
    out = ns.run(["cat", "/proc/net/snmp", "/proc/net/netstat"], check=False).stdout.splitlines()
    values: dict[str, int] = {}
    for names, nums in zip(out[::2], out[1::2]):
        group, _, names = names.partition(":")
        wanted = SNMP_KEYS.get(group, ())
        for name, num in zip(names.split(), nums.partition(":")[2].split()):
            if name in wanted:
                values[f"{group}.{name}"] = int(num)
    return values


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}


_SS_CC = re.compile(r"^\s*(?:ts\s+)?(?:sack\s+)?(?:ecn\s+)?(?:ecnseen\s+)?(\w+)\s+wscale")
_SS_FIELDS = {"cwnd": re.compile(r"\bcwnd:(\d+)"), "rtt_ms": re.compile(r"\brtt:([\d.]+)/"),
              "retrans": re.compile(r"\bretrans:\d+/(\d+)"), "pacing_mbit": re.compile(r"pacing_rate ([\d.]+)Mbps"),
              "delivery_mbit": re.compile(r"delivery_rate ([\d.]+)Mbps")}


class SsSampler:
    """``ss -tin`` of the TCP connections to or from ``port`` in ``ns``, every ``interval`` seconds,
    in a thread: the raw lines to ``raw_path``, a summary (cwnd and rtt median/max, retransmits at
    the end) from :meth:`stop`."""

    def __init__(self, ns, port: int, raw_path: Path, interval: float = 0.25) -> None:
        self.ns, self.port, self.raw_path, self.interval = ns, port, raw_path, interval
        self.samples: list[dict[str, float]] = []
        self.cc: set[str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"ss-{port}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        with open(self.raw_path, "a") as raw:
            while not self._stop.is_set():
                out = self.ns.run(["ss", "-tinH", f"( sport = :{self.port} or dport = :{self.port} )"],
                                  check=False).stdout
                raw.write(out + "\n--\n")
                for line in out.splitlines():
                    if (cc := _SS_CC.search(line)) is not None:
                        self.cc.add(cc.group(1))
                    found = {k: float(m.group(1)) for k, rx in _SS_FIELDS.items() if (m := rx.search(line))}
                    if "cwnd" in found:
                        self.samples.append(found)
                self._stop.wait(self.interval)

    def stop(self) -> dict:
        self._stop.set()
        self._thread.join(10)
        out: dict = {"samples": len(self.samples), "congestion_control": sorted(self.cc)}
        for key in ("cwnd", "rtt_ms", "pacing_mbit", "delivery_mbit"):
            values = [s[key] for s in self.samples if key in s]
            if values:
                out[key] = {"median": round(statistics.median(values), 1), "max": max(values)}
        retrans = [s["retrans"] for s in self.samples if "retrans" in s]
        if retrans:
            out["retrans_total"] = int(max(retrans))
        return out


class PySpy:
    """``py-spy record`` of ``pid`` into ``path`` (``fmt``: raw, speedscope or flamegraph) until
    :meth:`stop`; ``None`` from :func:`start_pyspy` when py-spy is not installed."""

    def __init__(self, pid: int, path: Path, fmt: str = "raw", rate: int = 100, idle: bool = False) -> None:
        self.path = path
        self.proc = subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                                      "--format", fmt, "--output", str(path), *(["--idle"] if idle else [])],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGINT)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return str(self.path) if self.path.exists() else f"no profile: {err.strip()[-200:]}"


def start_pyspy(pid: int, path: Path, fmt: str = "raw", rate: int = 100, idle: bool = False) -> PySpy | None:
    """A :class:`PySpy` (``idle``: waiting frames sampled too, so shares are of wall time), or
    None when py-spy is not installed."""
    return PySpy(pid, path, fmt, rate, idle) if shutil.which("py-spy") else None


def top_frames(raw_paths: list[Path], limit: int = 15, inclusive: bool = False) -> list[tuple[str, float]]:
    """From py-spy ``raw`` (collapsed stacks) files: the ``limit`` frames with the most samples
    and their share (%) of all samples: *self* samples (the innermost frame of each stack), or
    with ``inclusive`` every sample the frame is on the stack of (counted once per stack)."""
    counts: dict[str, int] = {}
    total = 0
    for raw_path in raw_paths:
        for line in raw_path.read_text().splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            total += n
            frames = stack.split(";")
            for frame in (set(frames) if inclusive else frames[-1:]):
                counts[frame] = counts.get(frame, 0) + n
    ranked = sorted(counts.items(), key=lambda kv: -kv[1])[:limit]
    return [(frame, round(100 * n / total, 1)) for frame, n in ranked] if total else []
