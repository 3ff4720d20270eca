"""Coordinator heartbeat throughput/latency and watch fan-out, one coordinator process on loopback.

Side by side in one run, per database (SQLite always; PostgreSQL with --postgres URL or
$ANEX_TEST_POSTGRES_URL):
* ``ours``: the coordinator as shipped (heartbeats acknowledged from memory, written in
  batches every 100 ms);
* ``write_through``: the same coordinator with ``--heartbeat-flush-interval 0``: every
  heartbeat is committed before it is acknowledged (the straightforward design, as reference).

For each: an open-loop phase at ``--rate`` heartbeats/s (latency measured from the
scheduled send time, so a server that falls behind shows it) and a closed-loop phase with
``--concurrency`` requests in flight (the maximum sustained rate). The load generator is a
separate process (``--role loadgen``), so client and server never share an event loop.
Watch fan-out: time from a join request to the ``peer_added`` event at each of 1 and 10
connected gateways.

With ``--selection-offers N`` it measures instead the open-loop heartbeat latency of one
coordinator without selection and while ``POST /v1/selections`` runs back to back against
a fake Vast.AI answering N offers with the provider cache off (every selection fetches,
decodes and rebuilds the table); ``--reference-root`` runs another checkout beside it.
Beside the latencies it reports the CPU time of the coordinator's process (its loop and any
thread; not the selection worker process) per second of each phase, and per selection while
selections run alone (less its idle background work meanwhile): figures the
other load on a shared machine moves much less than latencies.

Goal: >= 2000 heartbeats/s with p99 < 50 ms on SQLite. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TICK = 0.002  # open-loop scheduling granularity (s)
WINDOW = 5.0  # seconds of the open-loop schedule per p99 figure in the time series
ADMIN = "anexadm_bench_admin_token_0123456789abcdef"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


# ------------------------------------------------------------------ server side


def start_coordinator(database: str, state_dir: Path, extra: list[str], env_extra: dict[str, str] | None = None,
                      root: Path = ROOT, port: int | None = None) -> tuple[subprocess.Popen, str]:
    """Start one coordinator; return it and its URL once it listens (it prints its address
    when its port is open, after its start-up work, so this works behind SO_REUSEPORT too)."""
    import select

    port = port or free_port()
    env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN, "ANEX_LOG_LEVEL": "WARNING", "PYTHONPATH": str(root),
           **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(state_dir), "--database", database, *extra],
        cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 60
    while time.time() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.5)
        if ready:
            line = proc.stdout.readline()
            if "listening on" in line:
                return proc, url
        if proc.poll() is not None:
            raise RuntimeError(f"coordinator exited: {proc.stderr.read()[-2000:]}")
    proc.kill()
    raise RuntimeError("coordinator did not become ready")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()


def loadgen_argv(url: str, args: argparse.Namespace, mode: str, credentials_file: Path | None = None, *,
                 rate: int | None = None, open_seconds: float | None = None, concurrency: int | None = None,
                 shard: str = "0/1") -> list[str]:
    extra = ["--credentials", str(credentials_file)] if credentials_file else []
    return [sys.executable, __file__, "--role", "loadgen", "--url", url, "--mode", mode,
            "--nodes", str(args.nodes), "--rate", str(rate or args.rate), "--seconds", str(args.seconds),
            "--open-seconds", str(open_seconds or args.seconds), "--concurrency", str(concurrency or args.concurrency),
            "--shard", shard, "--telemetry", args.telemetry, *extra]


def run_loadgen(url: str, args: argparse.Namespace, mode: str, credentials_file: Path | None = None, **kw) -> dict:
    out = subprocess.run(loadgen_argv(url, args, mode, credentials_file, **kw), cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    if out.returncode != 0:
        raise RuntimeError(f"loadgen failed: {out.stderr[-2000:]}")
    return json.loads(out.stdout)


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU time of ``pids`` so far (0 for a process gone)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def bench_database(name: str, database_for: callable, args: argparse.Namespace, *, fleet: int = 0) -> dict:
    result: dict = {}
    variants = [("ours", []), ("write_through", ["--heartbeat-flush-interval", "0"])]
    for variant, extra in variants:
        with tempfile.TemporaryDirectory() as tmp:
            proc, url = start_coordinator(database_for(Path(tmp)), Path(tmp), extra)
            try:
                result[variant] = run_loadgen(url, args, "heartbeats")
                if variant == "ours" and not args.skip_fanout:
                    result["watch_fanout"] = run_loadgen(url, args, "fanout")
            finally:
                stop(proc)
    return result


FLEET_NETWORK = "10.64.0.0/12"  # room for a million nodes (the default /16 holds 65,534)


def bench_cold_fleet(args: argparse.Namespace) -> dict:
    """A coordinator restarted under a fleet of ``--fleet`` nodes (SQLite): every node's
    first heartbeat since the start, at ``--rate`` for ``--cold-seconds`` (each node beats
    at most once in that window when rate x seconds <= fleet, so every heartbeat is a first
    one), then the closed loop. ``ours`` and ``write_through`` (and ``--reference-root``)
    each start on a copy of one preloaded database."""
    import shutil

    result: dict = {"fleet": args.fleet, "rate_per_s": args.rate, "cold_seconds": args.cold_seconds,
                    "telemetry": args.telemetry, "body_bytes": len(heartbeat_body(0, args.telemetry)),
                    "first_heartbeats_only": args.rate * args.cold_seconds <= args.fleet}
    variants = [("ours", ROOT, []), ("write_through", ROOT, ["--heartbeat-flush-interval", "0"])]
    if args.reference_root:
        variants.append(("reference_root", Path(args.reference_root), []))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "fleet.db"
        started = time.perf_counter()
        credentials_file = preload_fleet(f"sqlite:///{base}", Path(tmp), args.fleet, telemetry=args.telemetry)
        result["preload_s"] = round(time.perf_counter() - started, 1)
        result["db_mib"] = round(base.stat().st_size / 2**20, 1)
        for name, root, extra in variants:
            run_dir = Path(tmp) / name
            run_dir.mkdir()
            shutil.copy(base, run_dir / "bench.db")
            started = time.perf_counter()
            proc, url = start_coordinator(f"sqlite:///{run_dir / 'bench.db'}", run_dir,
                                          ["--network", FLEET_NETWORK, *extra], root=root)
            try:
                ready_s = time.perf_counter() - started
                rss_ready = rss_mib(proc.pid)
                cpu0 = cpu_seconds([proc.pid])
                run = run_loadgen(url, args, "heartbeats", credentials_file, open_seconds=args.cold_seconds)
                result[name] = {"start_to_listening_s": round(ready_s, 2), "rss_at_start_mib": rss_ready,
                                "rss_after_mib": rss_mib(proc.pid),
                                "coordinator_cpu_s": round(cpu_seconds([proc.pid]) - cpu0, 1), **run}
            finally:
                stop(proc)
    return result


def postgres_pids() -> list[int]:
    """Every PostgreSQL server process on this machine (the server may be shared: its CPU
    time then includes other clients')."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "comm").read_text().strip() == "postgres":
                    pids.append(int(entry.name))
            except OSError:
                continue
    return pids


def combine(runs: list[dict]) -> dict:
    """Load generators that ran side by side: rates add up; the p99 is the worst one's."""
    out: dict = {"nodes": sum(r["nodes"] for r in runs), "load_generators": len(runs)}
    for phase, rate_key in (("open_loop", "achieved_per_s"), ("closed_loop", "per_s")):
        parts = [r[phase] for r in runs]
        out[phase] = {rate_key: round(sum(p[rate_key] for p in parts), 1),
                      "connections": sum(p["connections"] for p in parts),
                      "p50_ms": round(max(p["p50_ms"] for p in parts), 2),
                      "p99_ms": round(max(p["p99_ms"] for p in parts), 2),
                      "errors": sum(p["errors"] for p in parts)}
        if phase == "open_loop":
            out[phase]["target_per_s"] = sum(p["target_per_s"] for p in parts)
    return out


def bench_scale_out(args: argparse.Namespace, database: str) -> dict:
    """PostgreSQL: 1, then 2 coordinator processes on one port (``--reuse-port``: the kernel
    spreads connections), each with its own state dir and the same keys, under
    ``--scale-out`` preloaded nodes; ``--loadgens`` load-generator processes side by side
    (each its share of the nodes, the rate and the connections). CPU seconds per process
    kind over the run say what limits it. ``ours`` and ``write_through`` each."""
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        credentials_file = preload_fleet(database, Path(tmp), args.scale_out)
        result: dict = {"fleet": args.scale_out, "preload_s": round(time.perf_counter() - started, 1),
                        "rate_per_s": args.rate, "load_generators": args.loadgens,
                        "note": "p50/p99 are the worst of the load generators'; CPU seconds are over the whole "
                                "run (open then closed loop); the PostgreSQL server may be shared"}
        keys = Path(tmp) / "keys"
        keys.mkdir(mode=0o700)
        shared = ["--signing-key-file", str(keys / "access-token-signing-key"),
                  "--coordinator-key-file", str(keys / "coordinator-key"),
                  "--ssh-ca-key-file", str(keys / "ssh-ca-key")]
        for variant, extra in (("ours", []), ("write_through", ["--heartbeat-flush-interval", "0"])):
            for count in (1, 2):
                port = free_port()
                procs = []
                try:
                    # every coordinator on one database: the same keys (those of the first one started)
                    procs.append(start_coordinator(database, Path(tmp) / f"{variant}-{count}-0",
                                                   ["--network", FLEET_NETWORK, "--reuse-port", *extra, *shared],
                                                   port=port)[0])
                    for i in range(1, count):
                        procs.append(start_coordinator(database, Path(tmp) / f"{variant}-{count}-{i}",
                                                       ["--network", FLEET_NETWORK, "--reuse-port", *extra, *shared],
                                                       port=port)[0])
                    url = f"http://127.0.0.1:{port}"
                    n = args.loadgens
                    gens = [subprocess.Popen(loadgen_argv(url, args, "heartbeats", credentials_file, rate=args.rate // n,
                                                          concurrency=max(1, args.concurrency // n), shard=f"{i}/{n}"),
                                             cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                            for i in range(n)]
                    pg = postgres_pids()
                    before = {"coordinators": [cpu_seconds([p.pid]) for p in procs], "postgresql": cpu_seconds(pg)}
                    wall = time.perf_counter()
                    for g in gens:
                        g.wait()
                    wall = time.perf_counter() - wall
                    outs = []
                    for g in gens:
                        out, err = g.communicate()
                        if g.returncode != 0:
                            raise RuntimeError(f"loadgen failed: {err[-2000:]}")
                        outs.append(json.loads(out))
                    run = combine(outs)
                    run["cpu_s"] = {
                        "coordinators": [round(cpu_seconds([p.pid]) - b, 1) for p, b in zip(procs, before["coordinators"])],
                        "load_generators": round(sum(o["loadgen_cpu_s"] for o in outs), 1),
                        "postgresql": round(cpu_seconds(pg) - before["postgresql"], 1),
                        "wall_s": round(wall, 1), "machine_capacity": round(wall * os.cpu_count(), 1)}
                    result[f"{variant}_{count}_process{'es' if count > 1 else ''}"] = run
                finally:
                    for proc in procs:
                        stop(proc)
    return result


def preload_fleet(database: str, state_dir: Path, count: int, *, network: str = FLEET_NETWORK,
                  telemetry: str = "small") -> Path:
    """Write ``count`` nodes straight into the database (joining them over REST would take
    minutes), as a join and then heartbeats leave them: state ``ready``, heard from within the
    last heartbeat interval, status, telemetry and health of a heartbeat, credential issued
    now (none is due to rotate); their change-log entries are not written. Returns a file of
    (node id, credential) for the load generator."""
    import base64
    import secrets as pysecrets

    from anex_agent.coordinator import app, credentials, ipam
    from anex_agent.coordinator.db import open_database
    from anex_agent.coordinator.migrations import CORE, apply

    beat = json.loads(heartbeat_body(0, telemetry))
    status = json.dumps(beat["status"])
    telemetry = json.dumps(beat["telemetry"])

    async def go() -> list[tuple[str, str]]:
        db = await open_database(database)
        try:
            await apply(db, [*CORE, *app.module_migrations(app.load_modules())])
            pool = ipam.Pool.parse(network)
            now = time.time()
            nodes, addresses, creds = [], [], []
            for i in range(count):
                node_id = f"n-fleet{i:06d}"
                secret = credentials.new_secret(credentials.NODE_CREDENTIAL)
                n = pool.first + i
                nodes.append((node_id, f"fleet-{i}", "other", base64.b64encode(pysecrets.token_bytes(32)).decode(),
                              credentials.hash_secret(secret), pool.to_str(n), now - 60, now - (i % 15), status,
                              telemetry, now))
                addresses.append((n, f"node:{node_id}"))
                creds.append((node_id, secret))
            async with db.transaction() as tx:
                await tx.executemany("INSERT INTO addresses (n, owner) VALUES ($1, $2)", addresses)
                await tx.executemany(
                    "INSERT INTO nodes (id, name, provider, public_key, credential_hash, address, labels, facts,"
                    " tunnels, state, created_at, last_heartbeat_at, status, telemetry, health, credential_issued_at)"
                    " VALUES ($1, $2, $3, $4, $5, $6, '{}', '{}', '[]', 'ready', $7, $8, $9, $10, 'healthy', $11)",
                    nodes,
                )
            return creds
        finally:
            await db.close()

    creds = asyncio.run(go())
    path = state_dir / "fleet-credentials.json"
    path.write_text(json.dumps(creds))
    return path


# ------------------------------------------------------------------ load generator


async def setup_nodes(client, count: int) -> list[tuple[str, str]]:
    from anex_agent.wire import keys
    from anex_agent.client.rest import CoordinatorClient

    token = await client.create_join_token(reusable=True, expires_in=3600)
    nodes = []

    async def one(i: int) -> None:
        pair = keys.KeyPair(keys.generate_private_key())
        async with CoordinatorClient(client.base_url) as c:
            joined = await c.join(token.token, pair, f"bench-{i}", "other")
        nodes.append((joined.node_id, joined.credential))

    for start in range(0, count, 50):
        await asyncio.gather(*(one(i) for i in range(start, min(count, start + 50))))
    return nodes


GPUS = 8  # GPUs of the "8gpu" telemetry block


def telemetry_8gpu(i: int) -> dict:
    """An 8-GPU block shaped like the agent's (anex_agent.gpu.telemetry): every DCGM-style
    reading of each GPU, the inventory and the host, about 8 KB of JSON; valid on intake."""
    from anex_agent.gpu.exposition import DCGM_FIELDS

    gpus = []
    for g in range(GPUS):
        entry = {"index": g, "uuid": f"GPU-{i:06d}-{g}", "state": "ok", "last_xid": 0}
        for _name, key, _kind, _doc in DCGM_FIELDS:
            entry[key] = (i + g) % 97
        gpus.append(entry)
    inventory = {"driver_version": "550.54.15", "cuda_version": "12.4", "gpu_count": GPUS,
                 "gpus": [{"index": g, "name": "NVIDIA H100 80GB HBM3", "uuid": f"GPU-{i:06d}-{g}",
                           "pci_bus_id": f"00000000:{g:02X}:00.0", "memory_total_bytes": 85899345920,
                           "compute_capability": "9.0", "pcie_gen": 5, "pcie_width": 16,
                           "power_limit_w": 700.0, "mig_mode": "disabled", "form_factor": "sxm"} for g in range(GPUS)]}
    return {"v": 1, "taken_at": 1_790_000_000.0 + i, "hostname": f"host-{i}",
            "health": {"verdict": "healthy", "reasons": []}, "nvml": {"state": "ok"}, "inventory": inventory,
            "gpus": gpus, "xids": [],
            "host": {"cpu_count": 128, "cpu_util_pct": 12.5, "mem_total_bytes": 2 * 1024**4}, "sample_seconds": 0.001}


def heartbeat_body(i: int, telemetry: str = "small") -> bytes:
    """A heartbeat as an agent sends it: ``small`` telemetry (one GPU, three readings) or
    ``8gpu`` (:func:`telemetry_8gpu`, what an 8-GPU server's agent sends)."""
    block = telemetry_8gpu(i) if telemetry == "8gpu" else {
        "gpus": [{"index": 0, "util": 87, "mem_used_mb": 20000}], "health": {"verdict": "healthy"}}
    return json.dumps({
        "status": {"engine": "userspace", "path": "udp", "last_handshake_age": 4.2, "rx_bytes": i, "tx_bytes": i},
        "config_version": 1,
        "telemetry": block,
    }).encode()


class RawHttp:
    """A minimal keep-alive HTTP/1.1 client on asyncio streams: much cheaper per request than
    aiohttp's client, so one load-generator core can outpace one server core."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.reader = self.writer = None

    async def connect(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)

    async def post(self, path: str, token: str, body: bytes) -> int:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.split(b"\r\n"):
            if line[:15].lower() == b"content-length:":
                length = int(line[15:])
        if length:
            await self.reader.readexactly(length)
        return status

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


async def loadgen_heartbeats(args: argparse.Namespace) -> dict:
    from urllib.parse import urlsplit

    from anex_agent.client.rest import CoordinatorClient

    if args.credentials:
        index, of = (int(x) for x in args.shard.split("/"))
        nodes = [tuple(pair) for pair in json.loads(Path(args.credentials).read_text())[index::of]]
    else:
        async with CoordinatorClient(args.url, admin_token=ADMIN) as admin:
            nodes = await setup_nodes(admin, args.nodes)
    parts = urlsplit(args.url)
    bodies = [heartbeat_body(i, args.telemetry) for i in range(64)]
    conns = [RawHttp(parts.hostname, parts.port) for _ in range(args.concurrency)]
    await asyncio.gather(*(c.connect() for c in conns))
    counter = 0
    errors = 0

    async def beat(conn: RawHttp) -> None:
        nonlocal counter, errors
        counter += 1
        node_id, cred = nodes[counter % len(nodes)]
        try:
            if await conn.post(f"/v1/nodes/{node_id}/heartbeat", cred, bodies[counter % len(bodies)]) != 200:
                errors += 1
        except (OSError, asyncio.IncompleteReadError):
            errors += 1
            await conn.connect()

    async def closed_worker(conn: RawHttp, stop_at: float, latencies: list[float]) -> None:
        while time.perf_counter() < stop_at:
            t0 = time.perf_counter()
            await beat(conn)
            latencies.append(time.perf_counter() - t0)

    # warm-up (with a preloaded fleet: skipped, the cold start is what is measured)
    if not args.credentials:
        await asyncio.gather(*(closed_worker(c, time.perf_counter() + 0.5, []) for c in conns))
    errors = 0

    # open loop at a fixed rate over a fixed set of connections (like wrk2): every request has a
    # scheduled time; latency counts from it, so queueing behind a slow server is measured.
    open_lat: list[float] = []
    queue: asyncio.Queue = asyncio.Queue()
    n = int(args.rate * args.open_seconds)
    interval = 1.0 / args.rate

    # a server far behind would keep the phase going for minutes: requests not started by
    # the deadline are not sent; each counts with the latency it had reached by then (a lower bound)
    stop_at = time.perf_counter() + args.open_seconds * 1.5 + 1
    unsent: list[float] = []

    by_window: dict[int, list[float]] = {}  # WINDOW-second slice of the schedule -> its latencies

    async def open_worker(conn: RawHttp) -> None:
        while True:
            scheduled = await queue.get()
            if scheduled is None:
                return
            window = by_window.setdefault(int((scheduled - start) // WINDOW), [])
            if time.perf_counter() > stop_at:
                unsent.append(stop_at - scheduled)
                window.append(stop_at - scheduled)
                continue
            await beat(conn)
            open_lat.append(time.perf_counter() - scheduled)
            window.append(open_lat[-1])

    workers = [asyncio.create_task(open_worker(c)) for c in conns]
    start = time.perf_counter()
    sent = 0
    while sent < n:
        due = min(n, int((time.perf_counter() - start) / interval) + 1)
        for i in range(sent, due):
            queue.put_nowait(start + i * interval)
        sent = due
        await asyncio.sleep(TICK)
    for _ in workers:
        queue.put_nowait(None)
    await asyncio.gather(*workers)
    open_elapsed = time.perf_counter() - start
    open_errors, errors = errors, 0

    closed_lat: list[float] = []
    start = time.perf_counter()
    await asyncio.gather(*(closed_worker(c, start + args.seconds, closed_lat) for c in conns))
    closed_elapsed = time.perf_counter() - start
    for c in conns:
        c.close()

    ms = 1000.0
    return {
        "nodes": len(nodes),
        "loadgen_cpu_s": round(time.process_time(), 1),  # this load generator's own CPU time
        "open_loop": {
            "target_per_s": args.rate,
            "connections": args.concurrency,
            "achieved_per_s": round(len(open_lat) / open_elapsed, 1),
            "p50_ms": round(percentile(open_lat + unsent, 0.50) * ms, 2),
            "p99_ms": round(percentile(open_lat + unsent, 0.99) * ms, 2),
            "not_sent_by_deadline": len(unsent),
            "errors": open_errors,
            # p99 of the heartbeats scheduled in each WINDOW seconds of the run, in order
            # (where a long run falls behind shows here: the start, or later)
            f"p99_ms_per_{WINDOW:g}_s": [round(percentile(by_window[w], 0.99) * ms, 1) for w in sorted(by_window)],
        },
        "closed_loop": {
            "connections": args.concurrency,
            "per_s": round(len(closed_lat) / closed_elapsed, 1),
            "p50_ms": round(percentile(closed_lat, 0.50) * ms, 2),
            "p99_ms": round(percentile(closed_lat, 0.99) * ms, 2),
            "errors": errors,
        },
    }


async def loadgen_fanout(args: argparse.Namespace) -> dict:
    from anex_agent.wire import keys
    from anex_agent.client.rest import CoordinatorClient

    results = {}
    async with CoordinatorClient(args.url, admin_token=ADMIN) as admin:
        node_token = await admin.create_join_token(reusable=True)
        for count in (1, 10):
            gateways = []
            for i in range(count):
                token = await admin.create_join_token("gateway")
                client = CoordinatorClient(args.url)
                await client.register_gateway(token.token, keys.KeyPair(keys.generate_private_key()),
                                              f"gw-{count}-{i}")
                gateways.append(client)
            streams = [g.watch(0) for g in gateways]
            for s in streams:
                while (await anext(s)).type != "snapshot":
                    pass
            samples = []
            for _ in range(5):
                pair = keys.KeyPair(keys.generate_private_key())
                started = time.perf_counter()
                joiner = asyncio.create_task(CoordinatorClient(args.url).join(node_token.token, pair, "fan", "other"))

                async def seen(stream) -> float:
                    while True:
                        event = await asyncio.wait_for(anext(stream), 5)
                        if event.type == "peer_added" and event.peer.public_key == pair.public_b64:
                            return time.perf_counter() - started

                times = await asyncio.gather(*(seen(s) for s in streams))
                await joiner
                samples.append(max(times))
            for s in streams:
                await s.aclose()
            for g in gateways:
                await g.close()
            results[f"gateways_{count}"] = {
                "join_to_all_seen_median_ms": round(statistics.median(samples) * 1000, 2),
                "join_to_all_seen_max_ms": round(max(samples) * 1000, 2),
                "samples": len(samples),
            }
    return results


# ------------------------------------------------------------------ selection beside heartbeats

SELECTIONS_TIMED = 3  # selections alone, for the coordinator's CPU time per selection
SELECTION_POD = {"anex.sh/region": "europe", "anex.sh/gpu-names": "RTX 4090,RTX 3090", "anex.sh/gpu-count": "2",
                 "anex.sh/price-max": "1.50", "vastai.anex.sh/verified-only": "true"}


def fake_vast_body(count: int) -> bytes:
    """A Vast.AI bundles answer with ``count`` offers (field names and units of the API)."""
    gpus = [("RTX 4090", 24564, 890), ("RTX 3090", 24576, 860), ("A100 SXM4", 81920, 800), ("RTX 3080", 10240, 860)]
    places = ["Czechia, CZ", "Germany, DE", "United States, US", "Japan, JP", "Sweden, SE", "Brazil, BR"]
    offers = []
    for i in range(count):
        name, ram, cap = gpus[i % len(gpus)]
        n = 1 << (i % 4)
        offers.append({"id": 10_000_000 + i, "machine_id": 100_000 + i // 3, "gpu_name": name, "num_gpus": n,
                       "gpu_ram": ram, "gpu_totalram": ram * n, "gpu_mem_bw": 900.0 + i % 500,
                       "total_flops": 20.0 * n, "compute_cap": cap, "cuda_max_good": 12.0 + (i % 5) / 10,
                       "cpu_cores_effective": 4.0 * n, "cpu_ram": 32768 * n, "dph_total": 0.1 + (i % 400) / 100,
                       "inet_up": 100.0 + i % 900, "inet_down": 200.0 + i % 1800, "disk_space": 100.0 + i % 400,
                       "disk_bw": 500.0 + i % 3000, "dlperf": 10.0 + i % 100, "reliability": 0.99,
                       "verified": i % 3 != 0, "hosting_type": i % 2, "geolocation": places[i % len(places)],
                       "rentable": True, "rented": False})
    return json.dumps({"offers": offers}).encode()


async def serve_fake_vast(args: argparse.Namespace) -> None:
    """Role ``fakevast``: answer every bundles search with the same ``--offers`` offers; print the port."""
    from aiohttp import web

    body = fake_vast_body(args.offers)

    async def bundles(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    app = web.Application()
    app.router.add_get("/api/v0/bundles/", bundles)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(port, flush=True)
    await asyncio.Event().wait()


async def run_selector(args: argparse.Namespace) -> None:
    """Role ``selector``: one selection after another (Vast.AI only, cache TTL 0: every one
    fetches and rebuilds the table); prints one line per selection: its latency in ms."""
    import aiohttp

    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {ADMIN}"}) as session:
        while True:
            t0 = time.perf_counter()
            async with session.post(f"{args.url}/v1/selections",
                                    json={"annotations": SELECTION_POD, "providers": ["vastai"]}) as resp:
                body = await resp.json()
            if resp.status != 200 or not body["explanation"]["providers"]["vastai"].get("offers"):
                print(f"error {resp.status} {json.dumps(body)[:300]}", flush=True)
                await asyncio.sleep(0.5)
                continue
            print(f"{(time.perf_counter() - t0) * 1000:.1f} {body['explanation']['offers_considered']}", flush=True)


def precise_cpu_seconds(pid: int) -> float:
    """CPU time of process ``pid`` so far, its live threads together (its children not): from each
    thread's ``schedstat`` (nanoseconds), else ``stat`` (clock ticks)."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/schedstat") as f:
                total += int(f.read().split()[0])
        return total / 1e9
    except (FileNotFoundError, ValueError, IndexError):
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def timed_loadgen(url: str, args: argparse.Namespace, pid: int) -> tuple[dict, float, float]:
    """The open-loop heartbeat result, and the coordinator's CPU seconds and the wall seconds it took."""
    cpu, wall = precise_cpu_seconds(pid), time.perf_counter()
    result = run_loadgen(url, args, "heartbeats")["open_loop"]
    return result, precise_cpu_seconds(pid) - cpu, time.perf_counter() - wall


# The fake provider and the selecting client stand for other machines (the provider's API, the
# cluster): on this one they run at a lower priority, so that the coordinator and the heartbeat
# load generator are what they slow down least.
OTHER_MACHINES_NICE = 10


def start_selector(url: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, __file__, "--role", "selector", "--url", url], cwd=ROOT,
                            stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(OTHER_MACHINES_NICE))


def bench_selection_stall(args: argparse.Namespace) -> dict:
    """Open-loop heartbeat latency of one coordinator, without selection and while selections
    rebuild Vast.AI tables of ``--selection-offers`` offers back to back (cache TTL 0)."""
    fake = subprocess.Popen([sys.executable, __file__, "--role", "fakevast", "--offers", str(args.selection_offers)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True, preexec_fn=lambda: os.nice(OTHER_MACHINES_NICE))
    try:
        port = int(fake.stdout.readline())
        env = {"ANEX_VASTAI_URL": f"http://127.0.0.1:{port}/api/v0", "ANEX_VASTAI_API_KEY": "bench",
               "ANEX_SELECTION_CACHE_TTL": "0", "ANEX_SELECTION_TIMEOUT": "120"}
        roots = [("ours", ROOT)]
        if args.reference_root:
            roots.append(("reference", Path(args.reference_root)))
        result: dict = {"offers": args.selection_offers, "rate_per_s": args.rate}
        for name, root in roots:
            with tempfile.TemporaryDirectory() as tmp:
                proc, url = start_coordinator(f"sqlite:///{Path(tmp) / 'bench.db'}", Path(tmp), [], env, root)
                try:
                    idle_cpu = precise_cpu_seconds(proc.pid)
                    time.sleep(2.0)
                    idle_cpu_per_s = (precise_cpu_seconds(proc.pid) - idle_cpu) / 2.0  # background tasks only
                    quiet, quiet_cpu, quiet_wall = timed_loadgen(url, args, proc.pid)
                    run: dict = {"without_selection": {**quiet, "coordinator_cpu_ms_per_s":
                                                       round(1000 * quiet_cpu / quiet_wall, 1)}}
                    selector = start_selector(url)
                    try:
                        first = selector.stdout.readline()  # the first table is built: selections are running
                        beats, busy_cpu, busy_wall = timed_loadgen(url, args, proc.pid)
                    finally:
                        selector.terminate()
                        rest = selector.communicate(timeout=30)[0]
                    lines = [line.strip() for line in [first, *rest.splitlines()]]
                    done = [float(line.split()[0]) for line in lines if line and not line.startswith("error")]
                    run["with_selection"] = {**beats, "coordinator_cpu_ms_per_s": round(1000 * busy_cpu / busy_wall, 1),
                                             "selections_done": len(done),
                                             "selection_p50_ms": round(percentile(done, 0.5), 1),
                                             "errors_seen": [line for line in lines if line.startswith("error")][:2]}
                    # selections alone (no heartbeats): the coordinator's CPU time per selection, less its idle
                    # background work (per second, measured before) meanwhile; each line is read as it is printed
                    selector = start_selector(url)
                    try:
                        selector.stdout.readline()
                        cpu, wall = precise_cpu_seconds(proc.pid), time.perf_counter()
                        for _ in range(SELECTIONS_TIMED):
                            selector.stdout.readline()
                        alone = precise_cpu_seconds(proc.pid) - cpu - idle_cpu_per_s * (time.perf_counter() - wall)
                    finally:
                        selector.terminate()
                        selector.communicate(timeout=30)
                    run["coordinator_cpu_ms_per_selection"] = round(1000 * alone / SELECTIONS_TIMED, 1)
                    run["coordinator_idle_cpu_ms_per_s"] = round(1000 * idle_cpu_per_s, 1)
                    result[name] = run
                finally:
                    stop(proc)
        return result
    finally:
        fake.terminate()
        fake.wait(10)


# ------------------------------------------------------------------ main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="main", choices=["main", "loadgen", "fakevast", "selector"])
    parser.add_argument("--url")
    parser.add_argument("--mode", default="heartbeats", choices=["heartbeats", "fanout"])
    parser.add_argument("--postgres", default=os.environ.get("ANEX_TEST_POSTGRES_URL"),
                        help="PostgreSQL URL (a scratch database is created and dropped)")
    parser.add_argument("--nodes", type=int, default=300)
    parser.add_argument("--rate", type=int, default=2000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--skip-fanout", action="store_true")
    parser.add_argument("--fleet", type=int, default=60000,
                        help="also measure a restart under this many preloaded nodes (SQLite; 0: skip)")
    parser.add_argument("--cold-seconds", type=float, default=6.0,
                        help="open-loop seconds right after that restart (default 6; rate x seconds <= fleet: every "
                             "heartbeat is a node's first since the start)")
    parser.add_argument("--fleet-only", action="store_true", help="only the restart under --fleet nodes")
    parser.add_argument("--telemetry", choices=["small", "8gpu"], default="small",
                        help="the telemetry each heartbeat carries: small (one GPU, three readings; the default) or "
                             "8gpu (an 8-GPU server's block, about 8 KB of JSON)")
    parser.add_argument("--scale-out", type=int, default=0, metavar="NODES",
                        help="only PostgreSQL scale-out: 1 and 2 coordinator processes on one port (SO_REUSEPORT) "
                             "under this many preloaded nodes")
    parser.add_argument("--loadgens", type=int, default=2, help="load-generator processes for --scale-out")
    parser.add_argument("--credentials", help=argparse.SUPPRESS)  # loadgen: preloaded fleet
    parser.add_argument("--open-seconds", type=float, help=argparse.SUPPRESS)  # loadgen: open-loop duration
    parser.add_argument("--shard", default="0/1", help=argparse.SUPPRESS)  # loadgen: every n-th preloaded node
    parser.add_argument("--selection-offers", type=int, default=0,
                        help="only measure heartbeats without and while selections rebuild tables of this many "
                             "Vast.AI offers (SQLite)")
    parser.add_argument("--reference-root", help="with --selection-offers: also run the coordinator from this "
                                                 "checkout (e.g. a worktree of an earlier commit), side by side")
    parser.add_argument("--offers", type=int, default=0, help=argparse.SUPPRESS)  # fakevast
    args = parser.parse_args()
    if args.open_seconds is None:
        args.open_seconds = args.seconds

    if args.role == "fakevast":
        asyncio.run(serve_fake_vast(args))
        return
    if args.role == "selector":
        asyncio.run(run_selector(args))
        return
    if args.selection_offers:
        print(json.dumps({"benchmark": "coordinator heartbeats beside machine selection", "machine":
                          {"cpus": os.cpu_count()}, "sqlite": bench_selection_stall(args)}, indent=2))
        return
    if args.role == "loadgen":
        coro = loadgen_heartbeats(args) if args.mode == "heartbeats" else loadgen_fanout(args)
        print(json.dumps(asyncio.run(coro)))
        return

    started = time.perf_counter()
    if args.scale_out:
        if not args.postgres:
            parser.error("--scale-out needs --postgres URL or $ANEX_TEST_POSTGRES_URL")
        report = {"benchmark": "coordinator scale-out on PostgreSQL", "machine": {"cpus": os.cpu_count()},
                  "postgresql": bench_postgres(args, scale_out=True)}
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(report, indent=2))
        return
    if args.fleet_only:
        report = {"benchmark": "coordinator restart under a fleet", "machine": {"cpus": os.cpu_count()},
                  "goal": {"heartbeats_per_s": 5000, "p99_ms": 50, "database": "sqlite"},
                  "sqlite": {f"fleet_{args.fleet}_restart": bench_cold_fleet(args)}}
        cold = report["sqlite"][f"fleet_{args.fleet}_restart"]
        report["goal_met_sqlite"] = {name: _met(cold[name], args.rate) for name in cold if isinstance(cold[name], dict)}
        report["elapsed_s"] = round(time.perf_counter() - started, 1)
        print(json.dumps(report, indent=2))
        return
    report: dict = {
        "benchmark": "coordinator",
        "goal": {"heartbeats_per_s": 5000, "p99_ms": 50, "database": "sqlite"},
        "machine": {"cpus": os.cpu_count()},
        "sqlite": bench_database("sqlite", lambda tmp: f"sqlite:///{tmp / 'bench.db'}", args),
    }
    if args.fleet:
        report["sqlite"][f"fleet_{args.fleet}_restart"] = bench_cold_fleet(args)
    if args.postgres:
        report["postgresql"] = bench_postgres(args)
    else:
        report["postgresql"] = {"skipped": "no --postgres URL and ANEX_TEST_POSTGRES_URL is not set"}
    goal = {"ours": _met(report["sqlite"]["ours"], args.rate)}
    if args.fleet:
        goal[f"fleet_{args.fleet}_restart"] = _met(report["sqlite"][f"fleet_{args.fleet}_restart"]["ours"], args.rate)
    report["goal_met_sqlite"] = goal
    report["elapsed_s"] = round(time.perf_counter() - started, 1)
    print(json.dumps(report, indent=2))


def _met(run: dict, rate: int) -> bool:
    loop = run["open_loop"]
    return loop["achieved_per_s"] >= 0.97 * rate and loop["p99_ms"] < 50 and loop["errors"] == 0


def bench_postgres(args: argparse.Namespace, *, scale_out: bool = False) -> dict:
    import secrets

    import asyncpg

    base = args.postgres.rpartition("/")[0]
    created: list[str] = []

    async def create() -> str:
        name = f"anex_bench_{secrets.token_hex(4)}"
        conn = await asyncpg.connect(args.postgres)
        await conn.execute(f'CREATE DATABASE "{name}"')
        await conn.close()
        created.append(name)
        return f"{base}/{name}"

    async def drop() -> None:
        conn = await asyncpg.connect(args.postgres)
        for name in created:
            for attempt in range(50):  # an autovacuum worker may briefly hold the database
                try:
                    await conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
                    break
                except (asyncpg.InsufficientPrivilegeError, asyncpg.ObjectInUseError):
                    await asyncio.sleep(0.1)
        await conn.close()

    try:
        if scale_out:
            return bench_scale_out(args, asyncio.run(create()))
        return bench_database("postgresql", lambda _tmp: asyncio.run(create()), args)
    finally:
        asyncio.run(drop())


if __name__ == "__main__":
    main()
