"""A node's config reads while the coordinator refuses a flood of bad join tokens.

One coordinator process on loopback (SQLite), one node joined; ``--reads`` config reads of
that node (``GET /v1/nodes/ID/config``, one after another) timed while:
(a) ``quiet``: nothing else reaches the coordinator;
(b) ``bad_heartbeat_credentials``: ``--clients`` clients (one flood process) send heartbeats
    with a node credential that does not exist, back to back: each one a database read and a
    401, no lock (the reference);
(c) ``bad_join_tokens``: as many clients send joins with a join token that does not exist:
    each must be refused as cheaply, never taking the join lock.

The failed-authentication limit would answer such a flood 429 after 20 refusals; to measure
the 401 path the coordinator trusts loopback as a proxy (``--trusted-proxy 127.0.0.1``) and
every flood request names another source in ``X-Forwarded-For`` (198.18.0.0/15), alike in (b)
and (c). The config reads carry no such header (their source is loopback).

Goal, on a machine doing nothing else: (c) p99 / (b) p99 <= 3 and (c) p99 <= 100 ms.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.bench_coordinator import ADMIN, percentile, setup_nodes, start_coordinator, stop  # noqa: E402

BAD_JOIN_TOKEN = "anexjt_" + "x" * 43
BAD_NODE_CREDENTIAL = "anexnc_" + "x" * 43
FLOODING_AFTER = 20  # refusals the flood sees before it says it is flooding
GOAL_RATIO = 3.0
GOAL_P99_MS = 100.0


# ------------------------------------------------------------------ the flood (its own process)


async def run_flood(args: argparse.Namespace) -> None:
    """Role ``flood``: ``--clients`` clients post ``--body`` to ``--url`` back to back, each
    request from another X-Forwarded-For source; prints ``flooding`` after the first
    refusals, and on SIGTERM one JSON line: the answers by status and their rate."""
    import aiohttp

    stopping = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stopping.set)
    statuses: collections.Counter[int] = collections.Counter()
    headers = {"Content-Type": "application/json"}
    if args.token:
        headers["Authorization"] = f"Bearer {args.token}"
    sent = 0
    started = 0.0

    async def client() -> None:
        nonlocal sent, started
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=1)) as session:
            while not stopping.is_set():
                n = sent % 131072  # 198.18.0.0/15: far more sources than the limit remembers
                sent += 1
                source = {"X-Forwarded-For": f"198.{18 + (n >> 16)}.{(n >> 8) & 255}.{n & 255}"}
                async with session.post(args.url, data=args.body, headers={**headers, **source}) as resp:
                    await resp.read()
                statuses[resp.status] += 1
                if sum(statuses.values()) == FLOODING_AFTER:
                    started = time.perf_counter()
                    print("flooding", flush=True)

    async with asyncio.TaskGroup() as group:
        for i in range(args.clients):
            group.create_task(client(), name=f"flood-client-{i}")
    seconds = time.perf_counter() - started
    answered = sum(statuses.values()) - FLOODING_AFTER
    print(json.dumps({"statuses": {str(k): v for k, v in sorted(statuses.items())},
                      "answers_per_s": round(answered / seconds, 1) if seconds > 0 else None}), flush=True)


def start_flood(url: str, body: str, token: str, clients: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, __file__, "--role", "flood", "--url", url, "--body", body,
                             "--token", token, "--clients", str(clients)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line != "flooding\n":
        proc.kill()
        raise RuntimeError(f"the flood did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


def end_flood(proc: subprocess.Popen) -> dict:
    if proc.poll() is not None:
        raise RuntimeError(f"the flood stopped early: {proc.stderr.read()[-2000:]}")
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"the flood failed: {err[-2000:]}")
    return json.loads(out.strip().splitlines()[-1])


# ------------------------------------------------------------------ the reads


async def config_reads(url: str, node_id: str, credential: str, count: int) -> dict:
    from anex_agent.client.rest import CoordinatorClient

    latencies = []
    async with CoordinatorClient(url, credential=credential) as client:
        await client.get_config(node_id)  # the connection is open and the credential known
        for _ in range(count):
            started = time.perf_counter()
            config = await client.get_config(node_id)
            latencies.append(time.perf_counter() - started)
            if config.node_id != node_id:
                raise RuntimeError(f"config of {config.node_id} read for {node_id}")
    return {"reads": count, "p50_ms": round(1000 * percentile(latencies, 0.50), 2),
            "p99_ms": round(1000 * percentile(latencies, 0.99), 2),
            "max_ms": round(1000 * max(latencies), 2)}


def join_body() -> str:
    from anex_agent.wire import keys

    pair = keys.KeyPair(keys.generate_private_key())
    return json.dumps({"token": BAD_JOIN_TOKEN, "public_key": pair.public_b64, "name": "n", "provider": "vastai"})


def bench(args: argparse.Namespace) -> dict:
    from anex_agent.client.rest import CoordinatorClient

    async def join(url: str) -> tuple[str, str]:
        async with CoordinatorClient(url, admin_token=ADMIN) as admin:
            return (await setup_nodes(admin, 1))[0]

    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_coordinator(f"sqlite:///{Path(tmp) / 'bench.db'}", Path(tmp),
                                      ["--trusted-proxy", "127.0.0.1"])
        try:
            node_id, credential = asyncio.run(join(url))
            floods = {
                "bad_heartbeat_credentials": (f"{url}/v1/nodes/{node_id}/heartbeat", "{}", BAD_NODE_CREDENTIAL),
                "bad_join_tokens": (f"{url}/v1/nodes", join_body(), ""),
            }
            result: dict = {"quiet": asyncio.run(config_reads(url, node_id, credential, args.reads))}
            for name, (flood_url, body, token) in floods.items():
                flood = start_flood(flood_url, body, token, args.clients)
                try:
                    reads = asyncio.run(config_reads(url, node_id, credential, args.reads))
                finally:
                    answers = end_flood(flood) if flood.poll() is None else {"stopped_early": True}
                result[name] = {**reads, "flood": answers}
            return result
        finally:
            stop(proc)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--role", default="main", choices=["main", "flood"])
    parser.add_argument("--reads", type=int, default=500, help="config reads timed per phase (default 500)")
    parser.add_argument("--clients", type=int, default=16, help="concurrent clients of each flood (default 16)")
    parser.add_argument("--url", help=argparse.SUPPRESS)  # flood
    parser.add_argument("--body", help=argparse.SUPPRESS)  # flood
    parser.add_argument("--token", default="", help=argparse.SUPPRESS)  # flood
    args = parser.parse_args()
    if args.role == "flood":
        asyncio.run(run_flood(args))
        return

    started = time.perf_counter()
    result = bench(args)
    reference, ours = result["bad_heartbeat_credentials"]["p99_ms"], result["bad_join_tokens"]["p99_ms"]
    ratio = round(ours / reference, 2) if reference else None
    report = {
        "benchmark": "config reads during a flood of bad join tokens",
        "machine": {"cpus": os.cpu_count(), "load_average_1m": round(os.getloadavg()[0], 2)},
        "goal": {"p99_ratio_join_over_heartbeat_max": GOAL_RATIO, "p99_ms_during_bad_join_tokens_max": GOAL_P99_MS,
                 "on": "a machine doing nothing else"},
        "config_reads": result,
        "p99_ratio_join_over_heartbeat": ratio,
        "goal_met": ratio is not None and ratio <= GOAL_RATIO and ours <= GOAL_P99_MS,
        "elapsed_s": round(time.perf_counter() - started, 1),
    }
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
