"""Mesh throughput: direct over WireGuard vs a GW_TUNNEL forward vs CONNECT through the proxy.

Needs root, wireguard-go and nftables. Builds the demo mesh (:mod:`anex_agent.testing.mesh`):
a node namespace and the gateway namespace joined by a veth pair (through a bridge), with
wireguard-go at both ends (``anex-agent daemon`` on the node, ``anex-agent gateway`` on the
gateway), and a bulk source/sink in the cluster namespace behind the gateway. Then, from
the node's namespace, in one run, interleaved round by round:

* (a) ``direct``  a TCP connection to the cluster's bulk service over the mesh (routes only);
* (b) ``tunnel``  the same through ``GW_TUNNEL_18090`` (127.0.0.1:18090, the agent's forwarder);
* (c) ``connect`` the same through ``CONNECT`` on the agent's proxy (127.0.0.1:3128);

for downloads (source -> node) and uploads (node -> sink); the median of the rounds is
reported with the ratios b/a and c/a (goal >= 0.9), plus p50/p99 per-request latency of a
small GET, each on a new connection, direct vs through the proxy. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, SINK_PORT, SOURCE_PORT, Mesh  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402

TUNNEL_DOWN = 18090
TUNNEL_UP = 18091
PROXY = "127.0.0.1:3128"


def client(ns, *args: str, timeout: float = 60) -> dict:
    out = ns.run([sys.executable, "-m", "anex_agent.testing.probe_client", *args], check=False, timeout=timeout)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        raise RuntimeError(f"client {' '.join(args)}: {result['error']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=32, help="MiB per transfer (default 32)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per path and direction (default 3)")
    parser.add_argument("--requests", type=int, default=200, help="GETs for the latency figures (default 200)")
    args = parser.parse_args()
    reason = missing_prerequisites("wireguard-go", "nft")
    if reason:
        print(json.dumps({"benchmark": "mesh", "skipped": reason}))
        return 0
    started = time.monotonic()
    nbytes = args.mb * 1024 * 1024
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-mesh-"))
    with Mesh(workdir) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        node = mesh.add_node_namespace()
        env = mesh.agent_env(
            node, **{f"GW_TUNNEL_{TUNNEL_DOWN}": f"{CLUSTER_IP}:{SOURCE_PORT}", f"GW_TUNNEL_{TUNNEL_UP}": f"{CLUSTER_IP}:{SINK_PORT}"}
        )
        mesh.start_agent(node, env)
        paths = {
            "down": {
                "direct": [f"{CLUSTER_IP}:{SOURCE_PORT}"],
                "tunnel": [f"127.0.0.1:{TUNNEL_DOWN}"],
                "connect": [f"{CLUSTER_IP}:{SOURCE_PORT}", "--proxy", PROXY],
            },
            "up": {
                "direct": [f"{CLUSTER_IP}:{SINK_PORT}"],
                "tunnel": [f"127.0.0.1:{TUNNEL_UP}"],
                "connect": [f"{CLUSTER_IP}:{SINK_PORT}", "--proxy", PROXY],
            },
        }
        # warm-up: handshake done, caches filled
        client(node.ns, "bulk", f"{CLUSTER_IP}:{SOURCE_PORT}", "--bytes", str(4 << 20))
        samples: dict[str, dict[str, list[float]]] = {d: {p: [] for p in ps} for d, ps in paths.items()}
        for _ in range(args.rounds):
            for direction, by_path in paths.items():
                for path, dest in by_path.items():
                    result = client(node.ns, "bulk", *dest, "--bytes", str(nbytes), "--direction", direction)
                    samples[direction][path].append(result["mbit_s"])
        url = f"http://{CLUSTER_IP}:{HTTP_PORT}/latency"
        direct_lat = client(node.ns, "latency", url, "--count", str(args.requests))
        proxy_lat = client(node.ns, "latency", url, "--proxy", PROXY, "--count", str(args.requests))
        status = node.status()
    throughput = {}
    for direction, by_path in samples.items():
        med = {path: statistics.median(values) for path, values in by_path.items()}
        throughput[direction] = {
            "mbit_s": {p: round(v, 1) for p, v in med.items()},
            "samples_mbit_s": {p: [round(x, 1) for x in v] for p, v in by_path.items()},
            "ratio_tunnel_vs_direct": round(med["tunnel"] / med["direct"], 3),
            "ratio_connect_vs_direct": round(med["connect"] / med["direct"], 3),
        }
    doc = {
        "benchmark": "mesh",
        "setup": {
            "engine_node": status["engine"],
            "engine_gateway": "wireguard-go",
            "link": "veth through a bridge, network namespaces",
            "mb_per_transfer": args.mb,
            "rounds": args.rounds,
            "cpus": os.cpu_count(),
        },
        "throughput": throughput,
        "goal": "ratio_tunnel_vs_direct and ratio_connect_vs_direct >= 0.9",
        "latency_new_connection_ms": {
            "direct": {k: round(v, 3) for k, v in direct_lat.items() if k != "count"},
            "proxy": {k: round(v, 3) for k, v in proxy_lat.items() if k != "count"},
            "added_p50_ms": round(proxy_lat["p50_ms"] - direct_lat["p50_ms"], 3),
            "added_p99_ms": round(proxy_lat["p99_ms"] - direct_lat["p99_ms"], 3),
            "requests": args.requests,
        },
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
