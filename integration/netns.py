"""Small helpers for integration tests in Linux network namespaces (root only).

API (every name gets a random suffix so parallel runs never collide)::

    from integration.netns import Netns, veth, require_root, unique

    with Netns("gw") as gw, Netns("node") as node:      # `ip netns add anx-gw-1a2b3c`
        veth(gw, node, "192.168.50.1/24", "192.168.50.2/24")   # linked, addressed, up
        node.run(["ping", "-c1", "-W2", "192.168.50.1"])       # CompletedProcess; check=True by default
        proc = gw.popen(["socat", ...])                         # subprocess.Popen inside the namespace
        out = gw.check_output(["ip", "-j", "link"])              # stdout as str

* ``Netns(prefix)`` creates the namespace on ``__enter__`` (or ``create()``) with ``lo`` up,
  and ``close()`` / ``__exit__`` kills the processes it started with ``popen`` (SIGTERM, then
  SIGKILL) and deletes the namespace (which also deletes veth ends inside it).
* ``veth(a, b, addr_a, addr_b)`` creates a veth pair whose ends live in ``a`` and ``b``
  (``a``/``b`` may be ``None`` for the root namespace) and returns the two interface names.
* ``require_root(*tools)`` returns a ``pytest.mark.skipif`` marker with the reason
  (not root, or a tool missing from PATH).
* ``unique(prefix)`` returns ``prefix`` + 6 random hex characters.
* ``read_line(proc, timeout, what)`` reads one line of a child's piped stdout, failing the test
  (instead of hanging) when none comes in time or the child exits.

Commands run through ``ip netns exec``; no Python code runs inside a namespace, so
these helpers work with any real program (the anex-agent CLI, wireguard-go, socat).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Sequence
from typing import Any

from anex_agent.testing.netlab import Namespace, unique  # one namespace implementation for the demo and the tests

__all__ = ["Netns", "veth", "require_root", "unique", "missing_prerequisites", "read_line"]


def read_line(proc: subprocess.Popen, timeout: float = 30.0, what: str = "a line") -> str:
    """One line of ``proc``'s stdout (a pipe), within ``timeout`` seconds.

    Raises AssertionError naming ``what`` when the child stays silent (instead of hanging
    the test) or exits first. The read runs in a daemon thread: a timed-out read ends
    when the child is killed (``Netns.close``), and the stream should not be read again.
    """
    assert proc.stdout is not None, "read_line needs stdout=subprocess.PIPE"
    result: list = []
    reader = threading.Thread(target=lambda: result.append(proc.stdout.readline()), daemon=True,
                              name=f"read-line-{proc.pid}")
    reader.start()
    reader.join(timeout)
    if not result:
        raise AssertionError(f"no {what} from pid {proc.pid} within {timeout} s (exit status {proc.poll()})")
    assert result[0], f"pid {proc.pid} exited with {proc.wait(timeout=5)} before {what}"
    return result[0]


def missing_prerequisites(*tools: str) -> str | None:
    """Why netns tests cannot run here (``None`` when they can)."""
    if os.geteuid() != 0:
        return "needs root (network namespaces, veth, nftables)"
    for tool in ("ip", *tools):
        if shutil.which(tool) is None:
            return f"needs {tool!r} on PATH"
    return None


def require_root(*tools: str) -> Any:
    """A pytest skip marker: skip with the reason when root or one of ``tools`` is missing."""
    import pytest

    reason = missing_prerequisites(*tools)
    return pytest.mark.skipif(reason is not None, reason=reason or "")


class Netns(Namespace):
    """A uniquely named network namespace that removes itself (and its processes) on close.

    The package's demo :class:`~anex_agent.testing.netlab.Namespace` (create, run, popen,
    close) plus a context manager and :meth:`check_output`.
    """

    def __init__(self, prefix: str = "t") -> None:
        super().__init__(prefix)

    def create(self) -> Netns:
        super().create()
        return self

    def __enter__(self) -> Netns:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check_output(self, cmd: Sequence[str], *, timeout: float = 30) -> str:
        return self.run(cmd, timeout=timeout).stdout

    def __repr__(self) -> str:
        return f"Netns({self.name!r})"


def veth(a: Netns | None, b: Netns | None, addr_a: str | None, addr_b: str | None, *, mtu: int | None = None) -> tuple[str, str]:
    """Create a veth pair with one end in ``a`` and one in ``b`` (None: root namespace).

    Each end gets its address (CIDR, may be None) and is brought up. Returns the end names.
    """
    end_a, end_b = unique("anxva"), unique("anxvb")
    subprocess.run(["ip", "link", "add", end_a, "type", "veth", "peer", "name", end_b], check=True)
    for ns, end, addr in ((a, end_a, addr_a), (b, end_b, addr_b)):
        if ns is not None:
            subprocess.run(["ip", "link", "set", end, "netns", ns.name], check=True)
        prefix = ns.argv([]) if ns is not None else []
        if addr:
            subprocess.run([*prefix, "ip", "addr", "add", addr, "dev", end], check=True)
        if mtu:
            subprocess.run([*prefix, "ip", "link", "set", end, "mtu", str(mtu)], check=True)
        subprocess.run([*prefix, "ip", "link", "set", end, "up"], check=True)
    return end_a, end_b
