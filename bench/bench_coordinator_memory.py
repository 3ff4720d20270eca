"""Coordinator memory (RSS) against the number of nodes and the number of heartbeats.

One coordinator process on loopback (SQLite), nodes preloaded straight into the database,
heartbeats from a raw keep-alive HTTP client in this process. For each fleet size in
``--nodes``: RSS of the idle coordinator, after one heartbeat per node carrying an 8-GPU
telemetry block, after ``--heartbeats`` more heartbeats, and after one scrape of the fleet
``/metrics``. Reported: RSS per node and RSS growth over the extra
heartbeats (flat is the goal), and the time of ``GET /v1/nodes`` (best of 3). The fleet scrape's text is about 55 KB per 8-GPU node
(DCGM-style labels on every series); a scrape holds it (and one node's objects) while it is
built, so RSS after a scrape also shows what the allocator kept of that.

``--reference-root DIR`` runs the same against the coordinator of another checkout (e.g.
the main branch) side by side. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_coordinator import ADMIN, RawHttp, free_port, preload_fleet, stop  # noqa: E402

GPUS = 8
REFRESH_WAIT = 6.0  # the fleet metrics look at the table every 5 s


def telemetry_block(i: int) -> dict:
    """An 8-GPU block shaped like the agent's (anex_agent.gpu.telemetry), about 7 KB of JSON."""
    from anex_agent.gpu.exposition import DCGM_FIELDS

    gpus = []
    for g in range(GPUS):
        entry = {"index": g, "uuid": f"GPU-{i:06d}-{g}", "state": "ok", "last_xid": 0}
        for _name, key, _kind, _doc in DCGM_FIELDS:
            entry[key] = float((i + g) % 97)
        gpus.append(entry)
    inventory = {"driver_version": "550.54.15", "cuda_version": "12.4", "gpu_count": GPUS,
                 "gpus": [{"index": g, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:06d}-{g}",
                           "pci_bus_id": f"00000000:{g:02X}:00.0", "memory_total_bytes": 85899345920,
                           "compute_capability": "9.0", "pcie_gen": 5, "pcie_width": 16,
                           "power_limit_w": 700.0, "mig_mode": "disabled", "form_factor": "sxm"} for g in range(GPUS)]}
    return {"v": 1, "taken_at": time.time(), "hostname": f"host-{i}", "health": {"verdict": "healthy", "reasons": []},
            "nvml": {"state": "ok"}, "inventory": inventory, "gpus": gpus, "xids": [],
            "host": {"cpu_count": 128, "cpu_util_pct": 12.5, "mem_total_bytes": 2 * 1024**4}, "sample_seconds": 0.001}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def start(root: Path, database: str, state_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN, "ANEX_LOG_LEVEL": "WARNING", "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(state_dir), "--database", database],
        cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1):
                return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError(f"coordinator did not start: {proc.stderr.read().decode()[-2000:]}")


def list_nodes_ms(url: str) -> float:
    request = urllib.request.Request(url + "/v1/nodes", headers={"Authorization": f"Bearer {ADMIN}"})
    best = float("inf")
    for _ in range(3):
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=60) as resp:
            resp.read()
        best = min(best, time.perf_counter() - started)
    return round(best * 1000, 1)


def scrape(url: str) -> int:
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": f"Bearer {ADMIN}"})
    with urllib.request.urlopen(request, timeout=60) as resp:
        return len(resp.read())


async def heartbeats(url: str, creds: list[tuple[str, str]], count: int, bodies: list[bytes], concurrency: int = 16) -> int:
    from urllib.parse import urlsplit

    parts = urlsplit(url)
    conns = [RawHttp(parts.hostname, parts.port) for _ in range(concurrency)]
    await asyncio.gather(*(c.connect() for c in conns))
    sent = errors = 0

    async def worker(conn: RawHttp) -> None:
        nonlocal sent, errors
        while sent < count:
            i = sent
            sent += 1
            node_id, cred = creds[i % len(creds)]
            if await conn.post(f"/v1/nodes/{node_id}/heartbeat", cred, bodies[i % len(bodies)]) != 200:
                errors += 1

    await asyncio.gather(*(worker(c) for c in conns))
    for c in conns:
        c.close()
    return errors


def measure(root: Path, nodes: int, extra_heartbeats: int) -> dict:
    bodies = [json.dumps({"status": {"engine": "userspace", "path": "udp"}, "config_version": 1,
                          "telemetry": telemetry_block(i)}).encode() for i in range(64)]
    with tempfile.TemporaryDirectory() as tmp:
        database = f"sqlite:///{tmp}/coordinator.db"
        creds = [tuple(c) for c in json.loads(preload_fleet(database, Path(tmp), nodes).read_text())]
        proc, url = start(root, database, Path(tmp) / "state")
        try:
            time.sleep(1.0)
            idle = rss_mib(proc.pid)
            errors = asyncio.run(heartbeats(url, creds, nodes, bodies))
            time.sleep(REFRESH_WAIT)
            cached = rss_mib(proc.pid)
            started = time.perf_counter()
            errors += asyncio.run(heartbeats(url, creds, extra_heartbeats, bodies))
            rate = extra_heartbeats / (time.perf_counter() - started)
            time.sleep(REFRESH_WAIT)
            after = rss_mib(proc.pid)
            listing = list_nodes_ms(url)
            started = time.perf_counter()
            size = scrape(url)
            scrape_s = time.perf_counter() - started
            after_scrape = rss_mib(proc.pid)
        finally:
            stop(proc)
    return {
        "nodes": nodes,
        "telemetry_bytes": len(bodies[0]),
        "rss_idle_mib": idle,
        "rss_after_one_heartbeat_per_node_mib": cached,
        "rss_per_node_kib": round((cached - idle) * 1024 / nodes, 1),
        "extra_heartbeats": extra_heartbeats,
        "heartbeats_per_s": round(rate),
        "rss_after_extra_heartbeats_mib": after,
        "rss_growth_over_extra_heartbeats_mib": round(after - cached, 1),
        "list_nodes_ms": listing,
        "fleet_scrape_s": round(scrape_s, 2),
        "fleet_scrape_bytes": size,
        "rss_after_fleet_scrape_mib": after_scrape,
        "errors": errors,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="1000,5000", help="fleet sizes, comma-separated (default 1000,5000)")
    parser.add_argument("--heartbeats", type=int, default=10_000, help="extra heartbeats per fleet size (default 10000)")
    parser.add_argument("--reference-root", type=Path, help="also measure the coordinator of this checkout")
    args = parser.parse_args()
    sizes = [int(n) for n in args.nodes.split(",")]
    result = {"ours": [measure(ROOT, n, args.heartbeats) for n in sizes]}
    if args.reference_root:
        result["reference"] = [measure(args.reference_root, n, args.heartbeats) for n in sizes]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
