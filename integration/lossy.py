"""The delay-and-loss emulator between a node and its gateway (``tools/lossy-relay``, built by
``scripts/build-lossy-relay``), for the integration tests and the benchmarks.

Contract: :func:`relay_binary` returns the path of the built relay (built on first use, cached
outside the checkout by the source's hash) or None when there is no C compiler.
:func:`insert_relay` starts one in a node's namespace, as ``uid`` (so that its own datagrams are
not redirected), and sends the node's WireGuard datagrams to the gateway through it with an
nftables DNAT; it returns the relay's process (``ready`` already read). :func:`relay_counts`
stops it and returns its counters (forwarded, dropped, reordered, overflow).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELAY_PORT = 40000
RELAY_UID = 65533  # not the agent's uid (root or nobody): the relay's own datagrams go out untouched


def relay_binary() -> str | None:
    if shutil.which(os.environ.get("CC", "cc")) is None:
        return None
    out = subprocess.run([str(ROOT / "scripts" / "build-lossy-relay")], capture_output=True, text=True, check=True)
    return out.stdout.strip().splitlines()[-1]


def relay_args(*, delay_ms: float = 0, jitter_ms: float = 0, loss: float = 0, reorder: float = 0,
               seed: int = 1) -> list[str]:
    return ["--delay", str(delay_ms), "--jitter", str(jitter_ms), "--loss", str(loss), "--reorder", str(reorder),
            "--seed", str(seed)]


def insert_relay(node, gateway: str, wg_port: int, *, table: str = "anex_lossy", **shape) -> subprocess.Popen:
    """A relay in ``node``'s namespace between its WireGuard and ``gateway:wg_port``; ``shape`` is
    :func:`relay_args`' delay_ms, jitter_ms (one way), loss, reorder, seed."""
    binary = relay_binary()
    if binary is None:
        raise RuntimeError("no C compiler to build tools/lossy-relay (install gcc, or set CC)")
    relay = node.ns.popen(["setpriv", f"--reuid={RELAY_UID}", f"--regid={RELAY_UID}", "--clear-groups", "--",
                           binary, "--listen", f"{node.underlay}:{RELAY_PORT}", "--upstream", f"{gateway}:{wg_port}",
                           *relay_args(**shape)], stdout=subprocess.PIPE, text=True)
    if relay.stdout.readline().strip() != "ready":
        raise RuntimeError("the lossy relay did not start")
    node.ns.run(["nft", f"add table ip {table}"])
    node.ns.run(["nft", f"add chain ip {table} out {{ type nat hook output priority -100; }}"])
    node.ns.run(["nft", f"add rule ip {table} out meta skuid != {RELAY_UID} ip daddr {gateway} "
                        f"udp dport {wg_port} dnat to {node.underlay}:{RELAY_PORT}"])
    # flows already tracked would bypass the new rule: forget them (this namespace only)
    node.ns.run([sys.executable, "-c", "from pyroute2 import Conntrack; Conntrack().flush()"])
    return relay


def remove_relay(node, relay: subprocess.Popen, *, table: str = "anex_lossy") -> dict:
    """Stop the relay, take the redirect away (and the flows it tracked); the relay's counters."""
    node.ns.run(["nft", f"delete table ip {table}"], check=False)
    node.ns.run([sys.executable, "-c", "from pyroute2 import Conntrack; Conntrack().flush()"], check=False)
    return relay_counts(relay)


def relay_counts(relay: subprocess.Popen) -> dict:
    relay.terminate()
    out, _ = relay.communicate(timeout=30)
    return json.loads(out.strip().splitlines()[-1])
