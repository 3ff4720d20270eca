"""Coordinator memory (RSS) per node and per connected watcher.

One coordinator process on loopback (SQLite), nodes preloaded straight into the database as
joins and heartbeats leave them (``bench_coordinator.preload_fleet``), heartbeats from a raw
keep-alive HTTP client in this process. Every figure for ``ours`` beside ``write_through``
(the same coordinator with ``--heartbeat-flush-interval 0``, the benchmark's reference) and,
with ``--reference-root DIR``, the coordinator of another checkout.

Per node (``--nodes``, default 10000,50000,150000): RSS once started (the credential cache
is preloaded at start) and the fleet metrics cache has read the table, against the same
with no node: ``rss_per_node_kib``; then after ``--heartbeats`` heartbeats (flat is the goal).
``--telemetry small`` (default) sends and preloads the load generator's small telemetry block,
``8gpu`` an 8-GPU block of about 8 KB (the fleet metrics cache keeps each node's latest
telemetry text, so RSS per node then grows by about that size).

Per watcher (``--watchers``, default 0,1000,5000, over a fleet of the largest count): RSS
with that many node watch streams open (each has had its snapshot): ``rss_per_watcher_kib``.

Also the time of ``GET /v1/nodes`` (best of 3, fleets up to 50,000) and, with ``--scrape``, one fleet ``/metrics``
scrape. Prints one JSON document.
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

from bench.bench_coordinator import (ADMIN, FLEET_NETWORK, RawHttp, heartbeat_body, preload_fleet,  # noqa: E402
                                    rss_mib, start_coordinator, stop, telemetry_8gpu)

REFRESH_WAIT = 6.0  # the fleet metrics look at the table every 5 s
LIST_NODES_UP_TO = 50_000  # GET /v1/nodes is timed up to this fleet size (it renders every node)


def start(root: Path, database: str, state_dir: Path, extra: list[str]) -> tuple[subprocess.Popen, str]:
    return start_coordinator(database, state_dir, ["--network", FLEET_NETWORK, *extra], root=root)


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


VARIANTS = {"ours": [], "write_through": ["--heartbeat-flush-interval", "0"]}


def bodies_for(kind: str) -> list[bytes]:
    return [heartbeat_body(i, kind) for i in range(64)]


def fleet_db(tmp: Path, nodes: int, telemetry: str) -> tuple[Path, list[tuple[str, str]]]:
    """A preloaded database (copied for each variant) and its credentials."""
    base = tmp / "fleet.db"
    creds = [tuple(c) for c in json.loads(preload_fleet(f"sqlite:///{base}", tmp, nodes).read_text())] if nodes else []
    if nodes and telemetry != "small":
        import sqlite3

        with sqlite3.connect(base) as conn:  # the 8-GPU block as each node's stored telemetry
            conn.execute("UPDATE nodes SET telemetry = ?", (json.dumps(telemetry_8gpu(0)),))
    elif not nodes:
        asyncio.run(_migrate(f"sqlite:///{base}"))
    return base, creds


async def _migrate(database: str) -> None:
    from anex_agent.coordinator import app
    from anex_agent.coordinator.db import open_database
    from anex_agent.coordinator.migrations import CORE, apply

    db = await open_database(database)
    try:
        await apply(db, [*CORE, *app.module_migrations(app.load_modules())])
    finally:
        await db.close()


def measure(roots: dict[str, tuple[Path, list[str]]], nodes: int, extra_heartbeats: int, telemetry: str,
            scrape_too: bool) -> dict:
    import shutil

    bodies = bodies_for(telemetry)
    out: dict = {"nodes": nodes, "telemetry_bytes": len(bodies[0])}
    with tempfile.TemporaryDirectory() as tmp:
        base, creds = fleet_db(Path(tmp), nodes, telemetry)
        for name, (root, extra) in roots.items():
            run_dir = Path(tmp) / name
            run_dir.mkdir()
            shutil.copy(base, run_dir / "coordinator.db")
            proc, url = start(root, f"sqlite:///{run_dir / 'coordinator.db'}", run_dir / "state", extra)
            try:
                time.sleep(REFRESH_WAIT)  # the fleet metrics cache reads the table every 5 s
                started = rss_mib(proc.pid)
                run: dict = {"rss_started_mib": started}
                if nodes:
                    t0 = time.perf_counter()
                    errors = asyncio.run(heartbeats(url, creds, extra_heartbeats, bodies))
                    run["heartbeats"] = extra_heartbeats
                    run["heartbeats_per_s"] = round(extra_heartbeats / (time.perf_counter() - t0))
                    time.sleep(REFRESH_WAIT)
                    run["rss_after_heartbeats_mib"] = rss_mib(proc.pid)
                    run["rss_growth_over_heartbeats_mib"] = round(run["rss_after_heartbeats_mib"] - started, 1)
                    if nodes <= LIST_NODES_UP_TO:
                        run["list_nodes_ms"] = list_nodes_ms(url)
                    run["errors"] = errors
                    if scrape_too:
                        t0 = time.perf_counter()
                        run["fleet_scrape_bytes"] = scrape(url)
                        run["fleet_scrape_s"] = round(time.perf_counter() - t0, 2)
                        run["rss_after_fleet_scrape_mib"] = rss_mib(proc.pid)
                out[name] = run
            finally:
                stop(proc)
    return out


async def open_watchers(session, url: str, creds: list[tuple[str, str]], batch: int = 100) -> list:
    """A node watch stream per credential, each read up to its snapshot."""
    import aiohttp

    async def one(node_id: str, cred: str):
        ws = await session.ws_connect(f"{url}/v1/watch?since=0", headers={"Authorization": f"Bearer {cred}"},
                                      heartbeat=None)
        msg = await ws.receive(timeout=60)
        assert msg.type == aiohttp.WSMsgType.TEXT and '"snapshot"' in msg.data, msg
        return ws

    streams = []
    for start_at in range(0, len(creds), batch):
        streams += await asyncio.gather(*(one(*c) for c in creds[start_at:start_at + batch]))
    return streams


async def _session():
    import aiohttp

    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))  # one connection per stream


def measure_watchers(roots: dict[str, tuple[Path, list[str]]], counts: list[int]) -> dict:
    """RSS with 0..max(counts) node watch streams open, over a fleet of max(counts) nodes."""
    import shutil

    fleet = max(max(counts), 1)
    out: dict = {"fleet": fleet, "counts": counts}
    with tempfile.TemporaryDirectory() as tmp:
        base, creds = fleet_db(Path(tmp), fleet, "small")
        for name, (root, extra) in roots.items():
            run_dir = Path(tmp) / name
            run_dir.mkdir()
            shutil.copy(base, run_dir / "coordinator.db")
            proc, url = start(root, f"sqlite:///{run_dir / 'coordinator.db'}", run_dir / "state", extra)
            loop = asyncio.new_event_loop()
            session = None
            streams: list = []
            try:
                session = loop.run_until_complete(_session())
                time.sleep(REFRESH_WAIT)
                rss = {}
                for count in sorted(counts):
                    t0 = time.perf_counter()
                    if count > len(streams):
                        streams += loop.run_until_complete(open_watchers(session, url, creds[len(streams):count]))
                    opened_s = time.perf_counter() - t0
                    time.sleep(1.0)
                    rss[str(count)] = {"rss_mib": rss_mib(proc.pid), "open_s": round(opened_s, 1)}
                low, top = min(counts), max(counts)
                out[name] = {"rss": rss, "rss_per_watcher_kib":
                             round((rss[str(top)]["rss_mib"] - rss[str(low)]["rss_mib"]) * 1024 / max(1, top - low), 1)}
            finally:
                for ws in streams:
                    loop.run_until_complete(ws.close())
                if session is not None:
                    loop.run_until_complete(session.close())
                loop.close()
                stop(proc)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", default="10000,50000,150000", help="fleet sizes, comma-separated (0 skips)")
    parser.add_argument("--heartbeats", type=int, default=20_000, help="heartbeats per fleet size (default 20000)")
    parser.add_argument("--telemetry", choices=["small", "8gpu"], default="small")
    parser.add_argument("--watchers", default="0,1000,5000", help="watch stream counts, comma-separated ('' skips)")
    parser.add_argument("--scrape", action="store_true", help="also time one fleet /metrics scrape")
    parser.add_argument("--reference-root", type=Path, help="also measure the coordinator of this checkout")
    args = parser.parse_args()
    roots = {name: (ROOT, extra) for name, extra in VARIANTS.items()}
    if args.reference_root:
        roots["reference_root"] = (args.reference_root, [])
    result: dict = {"benchmark": "coordinator memory", "machine": {"cpus": os.cpu_count()}}
    sizes = [int(n) for n in args.nodes.split(",") if n.strip()]
    if sizes and sizes != [0]:
        empty = measure(roots, 0, 0, args.telemetry, False)
        runs = [measure(roots, n, args.heartbeats, args.telemetry, args.scrape) for n in sizes if n]
        for run in runs:
            for name in roots:
                run[name]["rss_per_node_kib"] = round(
                    (run[name]["rss_started_mib"] - empty[name]["rss_started_mib"]) * 1024 / run["nodes"], 2)
        result["per_node"] = {"no_nodes": empty, "fleets": runs}
    if args.watchers.strip():
        result["per_watcher"] = measure_watchers(roots, [int(n) for n in args.watchers.split(",")])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
