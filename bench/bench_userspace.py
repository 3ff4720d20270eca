"""The built-in userspace engine (WireGuard + our TCP/IP stack, unprivileged) vs wireguard-go with the kernel's TCP.

Needs root, wireguard-go, nftables, setpriv and (for the loss row) a C compiler. Builds the demo
mesh (:mod:`anex_agent.testing.mesh`) with two nodes behind the same gateway (wireguard-go) on the same bridge: node ``native`` runs
``anex-agent daemon`` as root on wireguard-go (kernel TCP end to end), node ``userspace`` runs it
as ``nobody`` with no capabilities (``auto`` picks the built-in engine). In one run, for each node,
interleaved round by round: bulk TCP through a ``GW_TUNNEL`` forward to the cluster's bulk source
(down) and sink (up), with 1 and 4 parallel streams (``--streams``). Reported: median, min and max
of the rounds, the ratio userspace/native per direction (goal >= 1.0), the CPU seconds per GB
the node's own processes spent (the agent, and wireguard-go on the native node; goal <= 1.2x),
packets/s and the in-process cost per segment of our stack, p50/p99 of a small
request through the proxy (new connection each), the userspace agent's RSS under many concurrent
proxy connections, and, last, the same ratio with 2 % loss: each node's WireGuard datagrams go
through the C delay-and-loss relay (``tools/lossy-relay`` via ``integration/lossy.py``, redirected
with an nftables DNAT in the node's namespace) that drops 2 % each way and reorders 5 %. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, SINK_PORT, SOURCE_PORT, UNDERLAY_GW, WG_PORT, Mesh  # noqa: E402
from integration.lossy import insert_relay, remove_relay  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402

TUNNEL_DOWN = 18090
TUNNEL_UP = 18091
PROXY = "127.0.0.1:3128"


def client(ns, *args: str, timeout: float = 300) -> dict:
    out = ns.run([sys.executable, "-m", "anex_agent.testing.probe_client", *args], check=False, timeout=timeout)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        raise RuntimeError(f"client {' '.join(args)}: {result['error']}")
    return result


def start_nodes(mesh: Mesh):
    forwards = {f"GW_TUNNEL_{TUNNEL_DOWN}": f"{CLUSTER_IP}:{SOURCE_PORT}", f"GW_TUNNEL_{TUNNEL_UP}": f"{CLUSTER_IP}:{SINK_PORT}"}
    native = mesh.add_node_namespace()
    mesh.start_agent(native, mesh.agent_env(native, **forwards))
    user = mesh.add_node_namespace()
    mesh.start_agent(user, mesh.agent_env(user, ANEX_ENGINE="auto", **forwards), unprivileged=True)
    return native, user


def agent_pid(node) -> int:
    for pid in node.ns.pids():
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if any(c.endswith(b"daemon") for c in cmd) and not cmd[0].endswith(b"setpriv"):
            return pid
    raise RuntimeError("agent not found")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def process_cpu_s(pids) -> float:
    """User + system CPU seconds of ``pids`` (all their threads) so far; gone processes count 0."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / tick


def bulk(node, port: int, nbytes: int, direction: str, streams: int) -> dict:
    """``streams`` parallel bulk transfers of ``nbytes / streams`` each; the aggregate Mbit/s and the
    CPU seconds the node's own processes (agent, wireguard-go; not the clients) spent per GB."""
    pids = node.ns.pids()  # before the clients start: the agent and its engine
    cpu = process_cpu_s(pids)
    each = nbytes // streams
    cmd = [sys.executable, "-m", "anex_agent.testing.probe_client", "bulk", f"127.0.0.1:{port}", "--bytes", str(each),
           "--direction", direction, "--timeout", "60"]
    started = time.perf_counter()
    procs = [node.ns.popen(cmd, stdout=subprocess.PIPE, text=True) for _ in range(streams)]
    results = []
    for proc in procs:
        out, _ = proc.communicate(timeout=300)
        results.append(json.loads(out.strip().splitlines()[-1]))
    seconds = time.perf_counter() - started
    cpu = process_cpu_s(pids) - cpu
    for result in results:
        if "error" in result:
            raise RuntimeError(f"bulk {direction} x{streams}: {result['error']}")
    moved = sum(r["bytes"] for r in results)
    return {"mbit_s": moved * 8 / seconds / 1e6, "cpu_s_per_gb": cpu / (moved / 1e9)}


def bulk_round(nodes: dict, nbytes: int, streams: int = 1, directions=("down", "up")) -> dict:
    out: dict = {d: {} for d in directions}
    for direction, port in (("down", TUNNEL_DOWN), ("up", TUNNEL_UP)):
        if direction not in directions:
            continue
        for name, node in nodes.items():
            out[direction][name] = bulk(node, port, nbytes, direction, streams)
    return out


def summarize(rounds: list[dict], nodes, key: str = "mbit_s") -> dict:
    """Median, min and max of ``key`` per node and direction, and the ratio of the medians."""
    doc = {}
    for direction in rounds[0]:
        samples = {n: [r[direction][n][key] for r in rounds] for n in nodes}
        med = {n: statistics.median(v) for n, v in samples.items()}
        doc[direction] = {
            "median": {n: round(v, 2) for n, v in med.items()},
            "min": {n: round(min(v), 2) for n, v in samples.items()},
            "max": {n: round(max(v), 2) for n, v in samples.items()},
            "ratio_userspace_vs_native": round(med["userspace"] / med["native"], 3),
            "ratios_per_round": [round(r[direction]["userspace"][key] / r[direction]["native"][key], 3) for r in rounds],
        }
    return doc


def segment_cost(mbytes: int = 20) -> dict:
    """In-process: our stack to our stack over a fake link; CPU µs per data segment (both ends)."""
    tests = Path(__file__).resolve().parent.parent / "tests"
    sys.path.insert(0, str(tests.parent))
    from tests.netstack.link import B, Link

    link = Link(delay=0.0005)
    link.b.tcp_listen(80)
    client_conn = link.a.tcp_connect(B, 80, 0.0)
    acc = []
    link.run_until(lambda: (acc.extend(link.b.take_accepted()) or bool(acc)) and client_conn.established)
    server = acc[0][1]
    data = os.urandom(mbytes << 20)
    sent = 0
    buf = bytearray(1 << 20)
    got = 0

    def done():
        nonlocal sent, got
        if sent < len(data):
            sent += client_conn.write(memoryview(data)[sent:sent + (1 << 20)])
        while n := server.readinto(buf):
            got += n
        return got == len(data)

    cpu = time.process_time()
    link.run_until(done)
    cpu = time.process_time() - cpu
    segments = client_conn.stats["segments_out"]
    return {"segments": segments, "us_per_segment_both_ends": round(cpu / segments * 1e6, 2),
            "mbyte_s_in_process": round(len(data) / cpu / 1e6, 1)}


def many_connections(mesh: Mesh, node, count: int, each: int) -> dict:
    """``count`` concurrent CONNECTs through the proxy, each downloading ``each`` bytes; RSS sampled."""
    script = Path(__file__).resolve().parent.parent / "integration" / "many_connect.py"
    pid = agent_pid(node)
    before = rss_mib(pid)
    proc = node.ns.popen([sys.executable, str(script), str(count), str(each), f"{CLUSTER_IP}:{SOURCE_PORT}"],
                         stdout=subprocess.PIPE, text=True)
    peak = before
    started = time.monotonic()
    while proc.poll() is None:
        peak = max(peak, rss_mib(pid))
        time.sleep(0.2)
        if time.monotonic() - started > 500:
            proc.kill()
    out = proc.stdout.read().strip()
    return {"connections": count, "bytes_each": each, "completed": int(out or 0),
            "seconds": round(time.monotonic() - started, 1), "rss_mib_before": round(before, 1),
            "rss_mib_peak": round(peak, 1), "rss_mib_after": round(rss_mib(pid), 1)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=32, help="MiB per transfer (default 32)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--streams", default="1,4", help="comma list of parallel stream counts (default 1,4)")
    parser.add_argument("--directions", default="down,up", help="comma list of: down,up (default both)")
    parser.add_argument("--requests", type=int, default=100)
    parser.add_argument("--connections", type=int, default=500)
    parser.add_argument("--connection-mb", type=float, default=1.0)
    parser.add_argument("--skip", default="", help="comma list of: loss,many,latency,segment")
    args = parser.parse_args()
    skip = set(filter(None, args.skip.split(",")))
    text = args.streams
    try:
        args.streams = [int(n) for n in text.split(",") if n]
        if not args.streams or min(args.streams) < 1:
            raise ValueError
    except ValueError:
        parser.error(f"--streams {text!r}: expected a comma list of positive integers, e.g. 1,4")
    args.directions = tuple(d for d in ("down", "up") if d in args.directions.split(","))
    if not args.directions:
        parser.error("--directions: expected down, up or down,up")
    reason = missing_prerequisites("wireguard-go", "nft") or (None if shutil.which("setpriv") else "setpriv is missing")
    if reason:
        print(json.dumps({"benchmark": "userspace", "skipped": reason}))
        return 0
    started = time.monotonic()
    nbytes = args.mb << 20
    doc: dict = {"benchmark": "userspace"}
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-us-"))
    with Mesh(workdir) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        native, user = start_nodes(mesh)
        nodes = {"native": native, "userspace": user}
        for node in nodes.values():  # warm-up
            client(node.ns, "bulk", f"127.0.0.1:{TUNNEL_DOWN}", "--bytes", str(2 << 20))
        doc["throughput"] = {}
        doc["cpu_s_per_gb"] = {}
        for streams in args.streams:
            rounds = [bulk_round(nodes, nbytes, streams, args.directions) for _ in range(args.rounds)]
            label = f"{streams}_stream{'s' if streams > 1 else ''}"
            doc["throughput"][label] = summarize(rounds, nodes, "mbit_s")
            for direction in args.directions:
                med = doc["throughput"][label][direction]["median"]["userspace"]
                doc["throughput"][label][direction]["packets_s_userspace"] = round(med * 1e6 / 8 / 1380)
            doc["cpu_s_per_gb"][label] = summarize(rounds, nodes, "cpu_s_per_gb")
        doc["goal"] = {"throughput": "ratio_userspace_vs_native >= 1.0 for 1 and 4 streams, both directions",
                       "cpu_s_per_gb": "ratio_userspace_vs_native <= 1.2 (the node's agent and engine processes)",
                       "many_connections_userspace": "rss_mib_peak < 150"}
        if "latency" not in skip:
            url = f"http://{CLUSTER_IP}:{HTTP_PORT}/latency"
            lat = {n: client(node.ns, "latency", url, "--proxy", PROXY, "--count", str(args.requests)) for n, node in nodes.items()}
            doc["latency_proxy_new_connection_ms"] = {
                n: {k: round(v, 3) for k, v in r.items() if k != "count"} for n, r in lat.items()}
            doc["latency_proxy_new_connection_ms"]["added_p50_ms"] = round(lat["userspace"]["p50_ms"] - lat["native"]["p50_ms"], 3)
            doc["latency_proxy_new_connection_ms"]["added_p99_ms"] = round(lat["userspace"]["p99_ms"] - lat["native"]["p99_ms"], 3)
        if "many" not in skip:
            doc["many_connections_userspace"] = many_connections(mesh, user, args.connections, int(args.connection_mb * 1e6))
        doc["userspace_status_netstack"] = user.status().get("userspace", {})
        if "loss" not in skip:
            relays = {name: insert_relay(node, UNDERLAY_GW, WG_PORT, loss=0.02, reorder=0.05)
                      for name, node in nodes.items()}
            try:
                lossy = bulk_round(nodes, max(nbytes // 4, 1 << 20))
            finally:
                counts = {name: remove_relay(nodes[name], relay) for name, relay in relays.items()}
            doc["loss_2_percent"] = {d: {"mbit_s": {n: round(v["mbit_s"], 1) for n, v in lossy[d].items()},
                                         "ratio_userspace_vs_native": round(lossy[d]["userspace"]["mbit_s"]
                                                                            / lossy[d]["native"]["mbit_s"], 3)}
                                     for d in lossy}
            doc["loss_2_percent"]["relay"] = "tools/lossy-relay per node: 2 % dropped each way, 5 % reordered by 1-4 ms"
            doc["loss_2_percent"]["relay_counts"] = counts
    if "segment" not in skip:
        doc["stack_in_process"] = segment_cost()
    doc["setup"] = {"link": "veth through a bridge, network namespaces", "gateway": "wireguard-go",
                    "mb_per_transfer": args.mb, "rounds": args.rounds, "cpus": os.cpu_count(),
                    "userspace_agent": "uid 65534, no capabilities, ANEX_ENGINE=auto"}
    doc["seconds"] = round(time.monotonic() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
