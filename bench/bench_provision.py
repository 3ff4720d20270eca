"""Benchmark: provisioning through a real coordinator process renting from the fake Vast.AI
(the demo's simulated provider) with its real Vast.AI client and the live selection. Prints one
JSON document.

* ``latency``: ``--runs`` provisions one after the other, each from ``POST /v1/provisions`` to
  ``ready``, split into select (until the attempt began), rent (the rent call), boot (rented
  until the node joined: here the simulated machine's agent joins ``--boot-delay`` seconds
  after the rental, so boot is mostly that delay) and join (joined until the provision is
  ready: the node's first heartbeat, then the loop noticing it). Median and max per phase.
* ``in_flight``: ``--in-flight`` provisions posted at once; the coordinator process's CPU time
  (user + system, from /proc) from the first POST until every one is ready, per provision; then
  the same for deleting them all.

The simulated machines are played by this process (join with the boot token, one heartbeat),
so their CPU is not the coordinator's. The fake Vast.AI keeps every offer available (renting
does not take it), so the numbers are the coordinator's own work (a live offer search, the
rent, the boot token, watching the join), not contention for offers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import aiohttp  # noqa: E402

from anex_agent.wire import keys  # noqa: E402
from anex_agent.wire.heartbeat import Heartbeat  # noqa: E402
from anex_agent.client.rest import CoordinatorClient  # noqa: E402
from anex_agent.demo.provision import phases  # noqa: E402
from anex_agent.testing.fake_providers import FakeVastAI, vast_bundle  # noqa: E402

ADMIN = "anexadm_bench_provision_admin_token_0123456789"
API_KEY = "bench-vastai-api-key"
ROOT = Path(__file__).resolve().parent.parent


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Bench:
    def __init__(self, url: str, fake: FakeVastAI, boot_delay: float) -> None:
        self.url = url
        self.fake = fake
        self.boot_delay = boot_delay
        self.headers = {"Authorization": f"Bearer {ADMIN}"}
        self.booted: set[str] = set()
        self.session: aiohttp.ClientSession | None = None

    async def call(self, method: str, path: str, body=None) -> dict:
        assert self.session is not None
        async with self.session.request(method, self.url + path, json=body, headers=self.headers) as r:
            data = await r.json()
            if r.status >= 400:
                raise RuntimeError(f"{method} {path}: {r.status} {data}")
            return data

    async def machine(self, env: dict) -> None:
        """What the rented machine's agent does: join with the boot token, heartbeat."""
        await asyncio.sleep(self.boot_delay)
        async with CoordinatorClient(self.url) as client:
            joined = await client.join(env["ANEX_JOIN_TOKEN"], keys.KeyPair(keys.generate_private_key()),
                                       env["ANEX_NODE_NAME"], env["ANEX_PROVIDER"])
            client.set_credential(joined.credential)
            await client.heartbeat(joined.node_id, Heartbeat())

    async def boot_new_rentals(self, group: asyncio.TaskGroup) -> None:
        for rental_id, rental in list(self.fake.rentals.items()):
            if rental_id not in self.booted:
                self.booted.add(rental_id)
                group.create_task(self.machine(rental.env), name=f"machine-{rental_id}")

    async def until(self, ids: list[str], state: str, group: asyncio.TaskGroup, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            await self.boot_new_rentals(group)
            listed = {p["id"]: p for p in (await self.call("GET", "/v1/provisions"))["provisions"]}
            states = [listed[i]["state"] if i in listed else "deleted" for i in ids]
            bad = [s for s in states if s == "failed"]
            if bad:
                raise RuntimeError(f"{len(bad)} provisions failed")
            if all(s == state for s in states):
                return
            await asyncio.sleep(0.05)
        raise RuntimeError(f"not every provision {state} within {timeout} s")


async def run(args: argparse.Namespace, url: str, pid: int, fake: FakeVastAI) -> dict:
    bench = Bench(url, fake, args.boot_delay)
    out: dict = {}
    async with aiohttp.ClientSession() as session, asyncio.TaskGroup() as group:
        bench.session = session
        splits = []
        for i in range(args.runs):
            created = await bench.call("POST", "/v1/provisions", {"name": f"lat-{i}", "image": "anex/agent"})
            await bench.until([created["id"]], "ready", group)
            view = await bench.call("GET", f"/v1/provisions/{created['id']}")
            node = await bench.call("GET", f"/v1/nodes/{view['node_id']}")
            splits.append(phases(view, node["created_at"]))
            await bench.call("DELETE", f"/v1/provisions/{created['id']}")
            await bench.until([created["id"]], "deleted", group)
        out["latency"] = {phase: {"median_s": round(statistics.median(s[phase] for s in splits), 4),
                                  "max_s": round(max(s[phase] for s in splits), 4)}
                          for phase in ("select", "rent", "boot", "join", "total")}
        n = args.in_flight
        cpu0, t0 = cpu_seconds(pid), time.monotonic()
        created = await asyncio.gather(*(bench.call("POST", "/v1/provisions", {"name": f"many-{i}", "image": "anex/agent"})
                                         for i in range(n)))
        ids = [c["id"] for c in created]
        await bench.until(ids, "ready", group)
        cpu1, t1 = cpu_seconds(pid), time.monotonic()
        await asyncio.gather(*(bench.call("DELETE", f"/v1/provisions/{i}") for i in ids))
        await bench.until(ids, "deleted", group)
        cpu2, t2 = cpu_seconds(pid), time.monotonic()
        out["in_flight"] = {
            "provisions": n, "boot_delay_s": args.boot_delay,
            "all_ready_s": round(t1 - t0, 2), "coordinator_cpu_s": round(cpu1 - cpu0, 3),
            "coordinator_cpu_ms_per_provision": round((cpu1 - cpu0) * 1000 / n, 2),
            "all_deleted_s": round(t2 - t1, 2),
            "coordinator_cpu_ms_per_delete": round((cpu2 - cpu1) * 1000 / n, 2),
            "rentals_left": len(fake.rentals),
            "rent_calls": sum(1 for method, path in fake.calls if method == "PUT" and "/asks/" in path),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="sequential provisions for the latency split")
    parser.add_argument("--in-flight", type=int, default=100, help="provisions posted at once")
    parser.add_argument("--boot-delay", type=float, default=0.5, help="seconds a simulated machine takes to join")
    parser.add_argument("--database", help="coordinator database URL (default: SQLite in a temporary directory)")
    args = parser.parse_args()
    asyncio.run(bench_main(args))


async def bench_main(args: argparse.Namespace) -> None:
    fake = FakeVastAI(api_key=API_KEY, exclusive=False,
                      bundles=[vast_bundle(6000 + i, price=round(0.3 + 0.01 * i, 2)) for i in range(20)])
    await fake.start()
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-provision-"))
    argv = [sys.executable, "-m", "anex_agent", "coordinator", "--listen", "127.0.0.1:0", "--state-dir",
            str(workdir / "state")]
    if args.database:
        argv += ["--database", args.database]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("ANEX_")}, "ANEX_ADMIN_TOKEN": ADMIN,
           "ANEX_VASTAI_URL": fake.url, "ANEX_VASTAI_API_KEY": API_KEY,
           "ANEX_PROVISION_COORDINATOR_URL": "http://coordinator.invalid", "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = await asyncio.to_thread(proc.stdout.readline) if proc.stdout else ""
        match = re.search(r"listening on (http://\S+)", line)
        if not match:
            raise SystemExit(f"the coordinator did not start: {line!r}")
        result = await run(args, match.group(1), proc.pid, fake)
    finally:
        proc.terminate()
        await asyncio.to_thread(proc.wait, 15)
        await fake.close()
    print(json.dumps({"benchmark": "provision", "machine": platform.machine(), "python": platform.python_version(),
                      "cpus": os.cpu_count(), "database": "postgresql" if args.database else "sqlite", **result},
                     indent=2))


if __name__ == "__main__":
    main()
