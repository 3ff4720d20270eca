"""WireGuard over the WebSocket relay vs over UDP: throughput ratio, relay cost, added latency, failover time.

Needs root, wireguard-go and nftables. Builds the demo mesh (:mod:`anex_agent.testing.mesh`):
one node namespace and the gateway namespace joined by the same veth pair (through a
bridge), wireguard-go at both ends, a bulk source/sink in the cluster namespace. In one run:

* ``throughput``: bulk TCP from the node to the cluster (download and upload, routes only),
  the node's agent first with ``ANEX_PATH=udp``, then restarted (same node, same key, same
  veth) with ``ANEX_PATH=websocket``; median of the rounds and the ratio websocket / udp
  (goal >= 0.8; wstunnel users report 0.13 to 0.5);
* ``latency``: p50/p99 of a small GET on a new connection over each path, and the difference;
* ``failover``: the agent with ``ANEX_PATH=auto`` on UDP, then every outgoing UDP datagram of
  the node dropped (nftables): seconds until a GET through the proxy succeeds again (over the relay);
* ``relay``: datagrams per second per core through the gateway's relay alone, measured in
  processes of their own on loopback (a WebSocket client sending 1,400-byte datagrams, the
  relay, a UDP echo standing in for the hub): datagrams relayed (both ways) / CPU seconds of
  the relay's process.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, SERVICE_NAME, SINK_PORT, SOURCE_PORT, Mesh  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402


def client(ns, *args: str, timeout: float = 90) -> dict:
    out = ns.run([sys.executable, "-m", "anex_agent.testing.probe_client", *args], check=False, timeout=timeout)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "error" in result:
        raise RuntimeError(f"client {' '.join(args)}: {result['error']}")
    return result


def measure_path(mesh, node, path: str, nbytes: int, rounds: int, requests: int) -> dict:
    mesh.start_agent(node, mesh.agent_env(node, token="", ANEX_PATH=path) if node.env else
                     mesh.agent_env(node, ANEX_PATH=path))
    try:
        status = node.status()
        assert status["path"] == path, status.get("path_choice")
        client(node.ns, "bulk", f"{CLUSTER_IP}:{SOURCE_PORT}", "--bytes", str(4 << 20))  # warm-up
        samples: dict[str, list[float]] = {"down": [], "up": []}
        for _ in range(rounds):
            samples["down"].append(client(node.ns, "bulk", f"{CLUSTER_IP}:{SOURCE_PORT}", "--bytes", str(nbytes),
                                          "--direction", "down")["mbit_s"])
            samples["up"].append(client(node.ns, "bulk", f"{CLUSTER_IP}:{SINK_PORT}", "--bytes", str(nbytes),
                                        "--direction", "up")["mbit_s"])
        latency = client(node.ns, "latency", f"http://{CLUSTER_IP}:{HTTP_PORT}/latency", "--count", str(requests))
        return {"samples": samples, "latency": latency, "engine": status["engine"]}
    finally:
        mesh.stop_agent(node)


def failover_seconds(mesh, node) -> float:
    mesh.start_agent(node, mesh.agent_env(node, token="", ANEX_PATH="auto"))
    try:
        assert node.status()["path"] == "udp"
        mesh.block_udp(node)
        blocked = time.monotonic()
        while True:
            try:
                ok = client(node.ns, "get", f"http://{SERVICE_NAME}:{HTTP_PORT}/f", "--proxy", "127.0.0.1:3128",
                            "--timeout", "2", timeout=5).get("status") == 200
            except (RuntimeError, subprocess.TimeoutExpired):
                ok = False
            if ok:
                return time.monotonic() - blocked
            if time.monotonic() - blocked > 60:
                raise RuntimeError("traffic did not resume within 60 s")
    finally:
        mesh.stop_agent(node)
        mesh.unblock_udp(node)


# ------------------------------------------------------------------ relay alone, in processes of its own


def _echo(port_queue) -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    port_queue.put(sock.getsockname()[1])
    while True:
        data, addr = sock.recvfrom(65535)
        sock.sendto(data, addr)


def _relay(hub_port: int, key: bytes, node_pub: str, port_queue, done) -> None:
    from anex_agent.gateway.relay import Relay

    async def main():
        relay = Relay(host="127.0.0.1", port=0, hub=("127.0.0.1", hub_port), private_key=key,
                      is_peer=lambda pub: pub == node_pub)
        await relay.start()
        port_queue.put(relay.bound_port)
        cpu0 = os.times()
        while not done.is_set():
            await asyncio.sleep(0.05)
        cpu1 = os.times()
        port_queue.put({"cpu_s": (cpu1.user - cpu0.user) + (cpu1.system - cpu0.system),
                        "to_hub": relay.counters["to_hub"], "to_node": relay.counters["to_node"]})
        await relay.close()

    asyncio.run(main())


def relay_rate(seconds: float, size: int = 1400, window: int = 256) -> dict:
    from anex_agent.wire import keys
    from anex_agent.tunnels.binds.relay_client import RelayClient, RelayTarget

    gw, node = keys.generate_private_key(), keys.generate_private_key()
    node_pub = keys.encode_key(keys.public_key(node))
    ctx = multiprocessing.get_context("spawn")
    q, done = ctx.Queue(), ctx.Event()
    echo = ctx.Process(target=_echo, args=(q,), daemon=True)
    echo.start()
    hub_port = q.get(timeout=10)
    relay = ctx.Process(target=_relay, args=(hub_port, gw, node_pub, q, done), daemon=True)
    relay.start()
    ws_port = q.get(timeout=20)

    async def drive() -> int:
        received = 0
        arrived = asyncio.Event()

        def on_datagram(_data: bytes) -> None:
            nonlocal received
            received += 1
            arrived.set()

        rc = RelayClient(RelayTarget(url=f"ws://127.0.0.1:{ws_port}/", gateway_public_key=keys.public_key(gw)),
                         private_key=node, public_key=node_pub, on_datagram=on_datagram)
        task = asyncio.get_running_loop().create_task(rc.run(), name="bench-relay-client")
        while not rc.connected:
            await asyncio.sleep(0.01)
        payload = b"\x04" + bytes(size - 1)
        sent = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            while sent - received < window:  # keep a window of datagrams in flight
                rc.send(payload)
                sent += 1
            arrived.clear()
            try:
                await asyncio.wait_for(arrived.wait(), 1)
            except asyncio.TimeoutError:
                sent = received  # lost some: reopen the window
        rc.close()
        await asyncio.gather(task, return_exceptions=True)
        return received

    received = asyncio.run(drive())
    done.set()
    figures = q.get(timeout=20)
    relay.join(timeout=10)
    echo.kill()
    relayed = figures["to_hub"] + figures["to_node"]
    return {
        "datagram_bytes": size,
        "round_trips": received,
        "datagrams_relayed": relayed,
        "relay_cpu_s": round(figures["cpu_s"], 2),
        "datagrams_per_s_per_core": round(relayed / figures["cpu_s"]) if figures["cpu_s"] else None,
        "mbit_s_per_core": round(relayed * size * 8 / figures["cpu_s"] / 1e6, 1) if figures["cpu_s"] else None,
        "seconds": seconds,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=16, help="MiB per transfer (default 16)")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per path and direction (default 2)")
    parser.add_argument("--requests", type=int, default=100, help="GETs for the latency figures (default 100)")
    parser.add_argument("--relay-seconds", type=float, default=5.0, help="seconds of the relay-alone figure")
    args = parser.parse_args()
    reason = missing_prerequisites("wireguard-go", "nft")
    if reason:
        print(json.dumps({"benchmark": "websocket", "skipped": reason}))
        return 0
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-ws-"))
    with Mesh(workdir) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        node = mesh.add_node_namespace()
        paths = {p: measure_path(mesh, node, p, args.mb << 20, args.rounds, args.requests) for p in ("udp", "websocket")}
        failover = failover_seconds(mesh, node)
    relay = relay_rate(args.relay_seconds)
    throughput = {}
    for direction in ("down", "up"):
        med = {p: statistics.median(paths[p]["samples"][direction]) for p in paths}
        throughput[direction] = {
            "mbit_s": {p: round(v, 1) for p, v in med.items()},
            "samples_mbit_s": {p: [round(x, 1) for x in paths[p]["samples"][direction]] for p in paths},
            "ratio_websocket_vs_udp": round(med["websocket"] / med["udp"], 3),
        }
    lat = {p: paths[p]["latency"] for p in paths}
    doc = {
        "benchmark": "websocket",
        "setup": {"engine": paths["udp"]["engine"], "gateway_engine": "wireguard-go",
                  "link": "the same veth pair through a bridge, network namespaces", "framing": "one datagram per "
                  "binary message", "mb_per_transfer": args.mb, "rounds": args.rounds, "cpus": os.cpu_count()},
        "throughput": throughput,
        "goal": "ratio_websocket_vs_udp >= 0.8 (wstunnel: 0.13 to 0.5)",
        "latency_new_connection_ms": {
            "udp": {k: round(v, 3) for k, v in lat["udp"].items() if k != "count"},
            "websocket": {k: round(v, 3) for k, v in lat["websocket"].items() if k != "count"},
            "added_p50_ms": round(lat["websocket"]["p50_ms"] - lat["udp"]["p50_ms"], 3),
            "added_p99_ms": round(lat["websocket"]["p99_ms"] - lat["udp"]["p99_ms"], 3),
            "requests": args.requests,
        },
        "failover_udp_blocked_to_traffic_s": round(failover, 2),
        "relay": relay,
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
