"""Far-away machines and lossy paths: the built-in userspace engine vs wireguard-go with the kernel's TCP.

Needs root, wireguard-go, nftables, setpriv and a C compiler (for ``tools/lossy-relay``, built by
``scripts/build-lossy-relay``). Builds the demo mesh (:mod:`anex_agent.testing.mesh`) with two nodes
behind the same gateway (wireguard-go): node ``native`` runs the agent as root on wireguard-go
(kernel TCP end to end), node ``userspace`` as ``nobody`` with no capabilities (``auto`` picks the
built-in engine). Each node's WireGuard datagrams go through its own delay-and-loss relay (an
nftables DNAT in its namespace), shaped the same for both, one scenario after the other:

* ``no_delay``:  the relay only (the reference: each side's ceiling on this machine now; a ratio
  that is already low here is the per-packet cost, not the path)
* ``rtt_50ms``:  +25 ms each way (+50 ms round trip), 1 ms jitter
* ``rtt_150ms``: +75 ms each way (+150 ms round trip), 1 ms jitter
* ``loss_2pct``: 2 % dropped each way, 5 % reordered (held 1-4 ms more), +1 ms each way

and per scenario, ``--rounds`` rounds interleaving the nodes: one bulk TCP stream through a
``GW_TUNNEL`` forward to the cluster's bulk source (down) and sink (up). Reported per scenario and
direction: median, min and max Mbit/s of each node and the ratio userspace/native of the medians
(goal >= 0.8), and the kernel's congestion control on each side (under random loss a
loss-based one such as CUBIC cannot keep up with BBR, whatever the stack). Prints one JSON
document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from anex_agent.testing.mesh import UNDERLAY_GW, WG_PORT, Mesh  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402
from bench_userspace import TUNNEL_DOWN, TUNNEL_UP, client, start_nodes  # noqa: E402
from integration.lossy import insert_relay, relay_binary, remove_relay  # noqa: E402

SCENARIOS = {
    "no_delay": {},  # the reference: what each side reaches on this machine without distance or loss
    "rtt_50ms": {"delay_ms": 25, "jitter_ms": 1},
    "rtt_150ms": {"delay_ms": 75, "jitter_ms": 1},
    "loss_2pct": {"delay_ms": 1, "loss": 0.02, "reorder": 0.05},
}
GOAL = 0.8


def summary(samples: list[float]) -> dict:
    return {"median": round(statistics.median(samples), 1), "min": round(min(samples), 1),
            "max": round(max(samples), 1), "samples": [round(s, 1) for s in samples]}


def run_scenario(nodes: dict, shape: dict, rounds: int, nbytes: int, timeout: float) -> dict:
    relays = {name: insert_relay(node, UNDERLAY_GW, WG_PORT, **shape) for name, node in nodes.items()}
    samples: dict = {"down": {n: [] for n in nodes}, "up": {n: [] for n in nodes}}
    errors: list[str] = []
    try:
        for name, node in nodes.items():  # warm-up: the handshake through the relay, slow start once
            client(node.ns, "bulk", f"127.0.0.1:{TUNNEL_DOWN}", "--bytes", str(1 << 20), timeout=timeout)
        for _ in range(rounds):
            for direction, port in (("down", TUNNEL_DOWN), ("up", TUNNEL_UP)):
                for name, node in nodes.items():
                    try:
                        r = client(node.ns, "bulk", f"127.0.0.1:{port}", "--bytes", str(nbytes),
                                   "--direction", direction, timeout=timeout)
                        samples[direction][name].append(r["mbit_s"])
                    except Exception as exc:  # noqa: BLE001 - a failed transfer is reported, the run goes on
                        errors.append(f"{name} {direction}: {exc}")
    finally:
        counts = {name: remove_relay(nodes[name], relay) for name, relay in relays.items()}
    out: dict = {"relay_each_way": shape, "relay_counts": counts}
    for direction in ("down", "up"):
        row = {n: summary(s) for n, s in samples[direction].items() if s}
        if len(row) == len(nodes):
            row["ratio_userspace_vs_native"] = round(row["userspace"]["median"] / row["native"]["median"], 3)
            row["goal_met"] = row["ratio_userspace_vs_native"] >= GOAL
        out[direction] = row
    if errors:
        out["errors"] = errors
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=24, help="MiB per transfer (default 24)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma list of: {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one transfer may take (default 300)")
    args = parser.parse_args()
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)} (accepted: {', '.join(SCENARIOS)})")
    reason = missing_prerequisites("wireguard-go", "nft") or (None if shutil.which("setpriv") else "setpriv is missing")
    if reason is None and relay_binary() is None:
        reason = "no C compiler to build tools/lossy-relay"
    if reason:
        print(json.dumps({"benchmark": "longpipe", "skipped": reason}))
        return 0
    started = time.monotonic()
    doc: dict = {"benchmark": "longpipe", "goal": f"ratio_userspace_vs_native >= {GOAL}", "scenarios": {}}
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-lp-"))
    with Mesh(workdir) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        native, user = start_nodes(mesh)
        nodes = {"native": native, "userspace": user}
        for name in chosen:
            doc["scenarios"][name] = run_scenario(nodes, SCENARIOS[name], args.rounds, args.mb << 20, args.timeout)
            print(json.dumps({name: doc["scenarios"][name]}), file=sys.stderr, flush=True)
        doc["userspace_status_netstack"] = user.status().get("userspace", {})
        # the peer's congestion control matters under random loss (BBR does not back off for it)
        doc["kernel_congestion_control"] = {
            where: ns.run(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], check=False).stdout.strip()
            for where, ns in (("cluster", mesh.cluster), ("native_node", native.ns))}
    doc["setup"] = {"link": "veth through a bridge, network namespaces; tools/lossy-relay per node",
                    "gateway": "wireguard-go", "mb_per_transfer": args.mb, "rounds": args.rounds,
                    "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                    "userspace_agent": "uid 65534, no capabilities, ANEX_ENGINE=auto"}
    doc["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
