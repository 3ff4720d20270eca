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

``--kernel-cc NAME`` sets the kernel's congestion control in the cluster's and the native node's
namespaces (``cubic``: the same algorithm as ours, a like-for-like comparison; connections take
the namespace's default when they open, and ``ss`` in the profile names the one each used). A
namespace other than the host's may only pick an algorithm of
``net.ipv4.tcp_allowed_congestion_control``: NAME is added to that list for the run and the
list put back afterwards.

``--profile DIR`` adds, per scenario, direction and node, what limited the transfers: the deltas
of the kernel's UDP and TCP counters in the gateway's, the cluster's and the node's namespace
(``Udp.RcvbufErrors`` in the gateway's: datagrams its wireguard-go did not read in time), ``ss
-tin`` of the kernel TCP ends (cwnd, rtt, retransmits; raw samples in DIR), and a ``py-spy
record`` of the user-space agent (raw collapsed stacks in DIR, the top frames by own samples
and by inclusive samples in the JSON). py-spy samples at 100 Hz and costs CPU of its own.
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

from anex_agent.testing.mesh import SINK_PORT, SOURCE_PORT, UNDERLAY_GW, WG_PORT, Mesh  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402
from bench_userspace import TUNNEL_DOWN, TUNNEL_UP, agent_pid, client, start_nodes  # noqa: E402
from profiling import SsSampler, delta, snmp, start_pyspy, top_frames  # noqa: E402
from integration.lossy import insert_relay, relay_binary, remove_relay  # noqa: E402

SCENARIOS = {
    "no_delay": {},  # the reference: what each side reaches on this machine without distance or loss
    "rtt_50ms": {"delay_ms": 25, "jitter_ms": 1},
    "rtt_150ms": {"delay_ms": 75, "jitter_ms": 1},
    "loss_2pct": {"delay_ms": 1, "loss": 0.02, "reorder": 0.05},
}
GOAL = 0.8
ALLOWED_CC = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control")


def summary(samples: list[float]) -> dict:
    return {"median": round(statistics.median(samples), 1), "min": round(min(samples), 1),
            "max": round(max(samples), 1), "samples": [round(s, 1) for s in samples]}


class Profiler:
    """Counters, ss samples and py-spy profiles around each transfer of one scenario (``--profile``)."""

    def __init__(self, mesh: Mesh, nodes: dict, outdir: Path, scenario: str) -> None:
        self.mesh, self.nodes, self.outdir, self.scenario = mesh, nodes, outdir, scenario
        self.found: dict = {"down": {n: [] for n in nodes}, "up": {n: [] for n in nodes}}
        self.stacks: dict = {"down": [], "up": []}

    def around(self, name: str, direction: str, index: int):
        """Start watching one transfer; the returned callable stops and records it."""
        node = self.nodes[name]
        spaces = {"gateway": self.mesh.gateway, "cluster": self.mesh.cluster, "node": node.ns}
        before = {where: snmp(ns) for where, ns in spaces.items()}
        tag = f"{self.scenario}-{direction}-{name}-{index}"
        # the kernel TCP end that sends: the cluster's source (down), the native node's agent (up)
        ss_ns, port = (self.mesh.cluster, SOURCE_PORT) if direction == "down" else (
            (node.ns, SINK_PORT) if name == "native" else (self.mesh.cluster, SINK_PORT))
        ss = SsSampler(ss_ns, port, self.outdir / f"ss-{tag}.txt")
        spy = start_pyspy(agent_pid(node), self.outdir / f"pyspy-{tag}.txt") if name == "userspace" else None

        def done() -> None:
            entry: dict = {"counters": {w: delta(before[w], snmp(ns)) for w, ns in spaces.items()},
                           ("ss_sender" if direction == "down" or name == "native" else "ss_receiver"): ss.stop()}
            if spy is not None:
                entry["pyspy"] = spy.stop()
                if Path(entry["pyspy"]).exists():
                    self.stacks[direction].append(Path(entry["pyspy"]))
            self.found[direction][name].append(entry)
        return done

    def report(self) -> dict:
        out: dict = {}
        for direction, per_node in self.found.items():
            out[direction] = dict(per_node)
            if self.stacks[direction]:
                out[direction]["userspace_top_self"] = top_frames(self.stacks[direction])
                out[direction]["userspace_top_inclusive"] = top_frames(self.stacks[direction], inclusive=True)
        return out


def run_scenario(nodes: dict, shape: dict, rounds: int, nbytes: int, timeout: float,
                 profiler: Profiler | None = None) -> dict:
    relays = {name: insert_relay(node, UNDERLAY_GW, WG_PORT, **shape) for name, node in nodes.items()}
    samples: dict = {"down": {n: [] for n in nodes}, "up": {n: [] for n in nodes}}
    errors: list[str] = []
    try:
        for name, node in nodes.items():  # warm-up: the handshake through the relay, slow start once
            client(node.ns, "bulk", f"127.0.0.1:{TUNNEL_DOWN}", "--bytes", str(1 << 20), timeout=timeout)
        for index in range(rounds):
            for direction, port in (("down", TUNNEL_DOWN), ("up", TUNNEL_UP)):
                for name, node in nodes.items():
                    done = profiler.around(name, direction, index) if profiler is not None else None
                    try:
                        r = client(node.ns, "bulk", f"127.0.0.1:{port}", "--bytes", str(nbytes),
                                   "--direction", direction, timeout=timeout)
                        samples[direction][name].append(r["mbit_s"])
                    except Exception as exc:  # noqa: BLE001 - a failed transfer is reported, the run goes on
                        errors.append(f"{name} {direction}: {exc}")
                    finally:
                        if done is not None:
                            done()
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
    if profiler is not None:
        out["profile"] = profiler.report()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=24, help="MiB per transfer (default 24)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma list of: {', '.join(SCENARIOS)} (default all)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds one transfer may take (default 300)")
    parser.add_argument("--kernel-cc", metavar="NAME",
                        help="the kernel's TCP congestion control in the cluster's and the native node's namespaces")
    parser.add_argument("--profile", type=Path, metavar="DIR",
                        help="write py-spy profiles of the user-space agent and ss samples into DIR and add the "
                             "counters that say what limited each transfer to the JSON")
    args = parser.parse_args()
    chosen = [s for s in args.scenarios.split(",") if s]
    unknown = [s for s in chosen if s not in SCENARIOS]
    if unknown:
        parser.error(f"--scenarios: unknown {', '.join(unknown)} (accepted: {', '.join(SCENARIOS)})")
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
    if args.kernel_cc is not None and available.exists() and args.kernel_cc not in available.read_text().split():
        parser.error(f"--kernel-cc: {args.kernel_cc!r} is not available here (accepted: {available.read_text().strip()})")
    reason = missing_prerequisites("wireguard-go", "nft") or (None if shutil.which("setpriv") else "setpriv is missing")
    if reason is None and relay_binary() is None:
        reason = "no C compiler to build tools/lossy-relay"
    if reason:
        print(json.dumps({"benchmark": "longpipe", "skipped": reason}))
        return 0
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    doc: dict = {"benchmark": "longpipe", "goal": f"ratio_userspace_vs_native >= {GOAL}", "scenarios": {}}
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-lp-"))
    allowed = ALLOWED_CC.read_text() if ALLOWED_CC.exists() else ""
    try:
        if args.kernel_cc is not None and args.kernel_cc not in allowed.split():
            ALLOWED_CC.write_text(f"{allowed.strip()} {args.kernel_cc}")
        with Mesh(workdir) as mesh:
            mesh.build_network()
            mesh.start_coordinator()
            mesh.start_gateway()
            native, user = start_nodes(mesh)
            nodes = {"native": native, "userspace": user}
            if args.kernel_cc is not None:
                for ns in (mesh.cluster, native.ns):
                    ns.run(["sysctl", "-qw", f"net.ipv4.tcp_congestion_control={args.kernel_cc}"])
            for name in chosen:
                profiler = Profiler(mesh, nodes, args.profile, name) if args.profile is not None else None
                doc["scenarios"][name] = run_scenario(nodes, SCENARIOS[name], args.rounds, args.mb << 20,
                                                      args.timeout, profiler)
                print(json.dumps({name: doc["scenarios"][name]}), file=sys.stderr, flush=True)
            doc["userspace_status_netstack"] = user.status().get("userspace", {})
            # the peer's congestion control matters under random loss (BBR does not back off for it)
            doc["kernel_congestion_control"] = {
                where: ns.run(["cat", "/proc/sys/net/ipv4/tcp_congestion_control"], check=False).stdout.strip()
                for where, ns in (("cluster", mesh.cluster), ("native_node", native.ns))}
    finally:
        if args.kernel_cc is not None and args.kernel_cc not in allowed.split():
            ALLOWED_CC.write_text(allowed.strip())
    doc["setup"] = {"link": "veth through a bridge, network namespaces; tools/lossy-relay per node",
                    "gateway": "wireguard-go", "mb_per_transfer": args.mb, "rounds": args.rounds,
                    "cpus": os.cpu_count(), "loadavg": os.getloadavg(),
                    "userspace_agent": "uid 65534, no capabilities, ANEX_ENGINE=auto"}
    doc["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
