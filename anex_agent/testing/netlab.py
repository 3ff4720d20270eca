"""Network namespaces and veth links for the demo (root only), removed on close.

Inside the package so that ``anex-agent demo`` works from an installed package where
the repository's ``integration/`` directory is not importable; ``integration/netns.py``
builds its ``Netns`` on :class:`Namespace`.

Every name carries a random suffix so parallel runs never collide; ``close()`` kills
what was started in the namespace (SIGTERM, then SIGKILL) and deletes it, which also
deletes the veth ends inside it.
"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence
from typing import Any


def unique(prefix: str) -> str:
    return f"{prefix}{secrets.token_hex(3)}"


def missing_prerequisites(*tools: str) -> str | None:
    """Why namespaces cannot be built here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth links, nftables)"
    for tool in ("ip", *tools):
        if shutil.which(tool) is None:
            return f"needs {tool!r} on PATH"
    if not os.path.exists("/dev/net/tun"):
        return "needs /dev/net/tun"
    return None


class Namespace:
    """A uniquely named network namespace. ``popen`` children are stopped on ``close()``."""

    def __init__(self, role: str) -> None:
        self.role = role
        self.name = unique(f"anx-{role}-")
        self.procs: list[subprocess.Popen] = []
        self._created = False

    def create(self) -> Namespace:
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        self._created = True
        self.run(["ip", "link", "set", "lo", "up"])
        return self

    def argv(self, cmd: Sequence[str]) -> list[str]:
        return ["ip", "netns", "exec", self.name, *cmd]

    def run(self, cmd: Sequence[str], *, check: bool = True, timeout: float = 30, **kw: Any) -> subprocess.CompletedProcess:
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run(self.argv(cmd), check=check, timeout=timeout, **kw)

    def popen(self, cmd: Sequence[str], **kw: Any) -> subprocess.Popen:
        proc = subprocess.Popen(self.argv(cmd), **kw)
        self.procs.append(proc)
        return proc

    def pids(self) -> list[int]:
        out = subprocess.run(["ip", "netns", "pids", self.name], capture_output=True, text=True).stdout.split()
        return [int(p) for p in out if p.isdigit()]

    def close(self) -> None:
        stop_processes(self.procs)
        self.procs.clear()
        if self._created:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", self.name], check=False, capture_output=True)
            self._created = False

    def __repr__(self) -> str:
        return f"Namespace({self.name!r})"


def stop_processes(procs: list[subprocess.Popen], timeout: float = 8) -> None:
    """SIGTERM every live process, wait up to ``timeout``, then SIGKILL what is left."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=5)


def link(a: Namespace, b: Namespace, addr_a: str | None, addr_b: str, *, bridge_a: str | None = None) -> tuple[str, str]:
    """A veth pair with one end in ``a`` and one in ``b``, addressed and up; returns the end names.

    With ``bridge_a`` the end in ``a`` is enslaved to that bridge instead of addressed.
    """
    end_a, end_b = unique("anxda"), unique("anxdb")
    subprocess.run(["ip", "link", "add", end_a, "type", "veth", "peer", "name", end_b], check=True)
    for ns, end, addr in ((a, end_a, addr_a), (b, end_b, addr_b)):
        subprocess.run(["ip", "link", "set", end, "netns", ns.name], check=True)
        if addr:
            ns.run(["ip", "addr", "add", addr, "dev", end])
        ns.run(["ip", "link", "set", end, "up"])
    if bridge_a:
        a.run(["ip", "link", "set", end_a, "master", bridge_a])
    return end_a, end_b


def bridge(ns: Namespace, name: str, addr: str) -> str:
    """A bridge inside ``ns`` (names are per namespace) with ``addr``, up."""
    ns.run(["ip", "link", "add", name, "type", "bridge"])
    ns.run(["ip", "addr", "add", addr, "dev", name])
    ns.run(["ip", "link", "set", name, "up"])
    return name
