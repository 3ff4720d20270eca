#!/usr/bin/env python3
"""How fast peer changes reach the WireGuard of every gateway, and how a gateway starts from
a large peer set; ours beside the reference of the same run. Prints JSON. Needs root.

One network namespace holds a real ``anex-agent coordinator`` (SQLite) and real
``anex-agent gateway`` processes on wireguard-go (``--engine wireguard-go``); the bench
itself runs inside it and plays the nodes: each joins over the REST API with a real proof
of key possession (:func:`anex_agent.client.rest.CoordinatorClient.join`).

What is measured, read back from each gateway's wireguard-go:

* through its UAPI socket as ``wg show`` does (``get=1``; wireguard-go serializes a set and
  a get, so the first dump listing a key started after the key was set). A dump of 10,000
  peers takes wireguard-go 25-300 ms here, so polling it is coarse and slows the sets it
  waits for: it times deletions, a few joins, and confirms every measured join;
* by the data plane, for joins: the new node's WireGuard handshake initiation is sent to
  each gateway every :data:`PROBE` seconds from before the join; wireguard-go answers only
  once the peer is configured in it (an unknown key is dropped), so the answer's arrival
  is the moment the peer works (to within :data:`PROBE`), at almost no cost to the gateway.

* **memory**: one gateway (ours) follows the fleet as it grows by joins: resident memory
  of the gateway process (and of its wireguard-go) at 0, 1,000 and ``--nodes`` peers;
* **snapshot start**: a gateway started against ``--nodes`` registered nodes: seconds from
  the process start to every peer listed by wireguard-go (and, ours, the hub apply alone
  as the gateway logs it);
* **join -> peer configured**: with ``--gateways`` gateways connected, ``--samples`` nodes
  join one after another; for each, the time from the join request to the handshake
  answer of each gateway (p50/p99 per gateway and until the last gateway answered), then
  one UAPI dump per gateway confirms every one of them is listed; ``--uapi-samples`` more
  joins timed by UAPI polling; then deleting them all, one after another, timed by each
  gateway's log line written once its engine write returned (``peer_removed v.. applied``,
  ms resolution; the same line times joins too), then one dump per gateway confirms none
  is listed any more.

Each measured join is sent by a client that has its connection open and the coordinator's
key read (as a started node does), so ``join_answered`` (the coordinator's answer) splits
the delay into the coordinator's part and the fan-out to the gateways; ``cpu_ms_per_join``
is the CPU that every process of the run spent per measured join (the 2 cores are shared by
all of them, so that is what a tail is made of).

``reference``: the gateway as shipped before incremental apply (``--reference-rev``,
default :data:`REFERENCE_REV`, checked out with ``git archive`` unless ``--reference-root``
names a checkout): every event re-reads the whole device over UAPI, diffs the whole set and
saves the whole set to disk. Run it with fewer samples (``--reference-samples``): each event
costs it O(peers) on every gateway at once.

    sudo .venv/bin/python bench/bench_gateway_apply.py --nodes 10000 --gateways 10
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ADMIN = "anexadm_bench_admin_token_0123456789abcdef"
SOCKET_DIR = "/var/run/wireguard"
#: Seconds the simulated fleet, which never heartbeats, stays registered (a cached fleet is reused for days).
FLEET_LIFETIME = 30 * 86400
#: The last commit whose gateway rewrote the whole set per event (the reference).
REFERENCE_REV = "6c05fc4"
POLL = 0.005  # seconds between two UAPI dumps of one gateway while a change is awaited
PROBE = 0.003  # seconds between two handshake initiations to one gateway while a join is awaited


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def ms(value: float | None) -> float | None:
    return None if value is None else round(value * 1000, 1)


def rss_mib(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    except OSError:
        return None
    return None


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (0 once it is gone)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            pass
    return found


# ---------------------------------------------------------------- UAPI, raw (as wg show reads it)


async def uapi_dump(path: str) -> bytes:
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(b"get=1\n\n")
        await writer.drain()
        data = bytearray()
        while not data.endswith(b"\n\n") or b"errno=" not in data[-32:]:
            chunk = await reader.read(1 << 20)
            if not chunk:
                break
            data += chunk
        return bytes(data)
    finally:
        writer.close()


def peer_count(dump: bytes) -> int:
    return dump.count(b"\npublic_key=")


def lists(dump: bytes, key_hex: bytes) -> bool:
    return b"\npublic_key=" + key_hex + b"\n" in dump


# ---------------------------------------------------------------- processes


class Gateway:
    """One ``anex-agent gateway`` process on wireguard-go, from ``root`` (ours or the reference)."""

    def __init__(self, workdir: Path, url: str, token: str, root: Path, mode: str, index: int) -> None:
        # not "anx...": `anex-agent cleanup` run elsewhere on the machine would take a busy
        # wireguard-go's UAPI socket for a leftover (they live in one directory for all namespaces)
        self.ifname = f"gwb{secrets.token_hex(3)}{index:02d}"
        self.socket = os.path.join(SOCKET_DIR, f"{self.ifname}.sock")
        self.log_path = workdir / f"{mode}-{index}.log"
        self.state = state = workdir / f"{mode}-{index}"
        self.port = port = 52000 + index + (0 if mode == "ours" else 100)
        env = {**os.environ, "ANEX_GATEWAY_TOKEN": token, "PYTHONPATH": str(root)}
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "anex_agent", "gateway", "--coordinator", url, "--listen-udp", f":{port}",
             "--endpoint", f"127.0.0.1:{port}", "--state-dir", str(state), "--engine", "wireguard-go",
             "--interface", self.ifname],
            cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=open(self.log_path, "wb"),
        )

    async def dump(self) -> bytes:
        return await uapi_dump(self.socket)

    def public_key(self) -> bytes:
        from anex_agent.wire import keys

        return keys.public_key(keys.load_or_create(self.state / "private.key").private)

    def gateway_id(self) -> str | None:
        try:
            return json.loads((self.state / "gateway.json").read_text())["registration"]["gateway_id"]
        except (OSError, ValueError, KeyError):
            return None

    async def wait_configured(self, count: int, timeout: float) -> float:
        """Seconds from the process start until the gateway logs ``gateway up`` (hub configured,
        rules installed; read from its log every 20 ms: a UAPI dump of thousands of peers would
        slow the very writes it waits for), confirmed by one UAPI dump listing ``count`` peers."""
        pattern = b"gateway up:"
        deadline = time.perf_counter() + timeout
        while pattern not in self.log_path.read_bytes():
            if self.proc.poll() is not None or time.perf_counter() > deadline:
                raise RuntimeError(f"gateway {self.ifname} did not configure {count} peers: "
                                   f"{self.log_path.read_text()[-2000:]}")
            await asyncio.sleep(0.02)
        took = time.perf_counter() - self.started
        listed = peer_count(await self.dump())
        if listed != count:
            raise RuntimeError(f"gateway {self.ifname} logged {count} peers but wireguard-go lists {listed}")
        return took

    async def wait_peers(self, count: int, timeout: float, interval: float = 0.02) -> float:
        """Seconds from the process start until wireguard-go lists ``count`` peers."""
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited: {self.log_path.read_text()[-2000:]}")
            if os.path.exists(self.socket):
                try:
                    if peer_count(await self.dump()) == count:
                        return time.perf_counter() - self.started
                except OSError:
                    pass
            await asyncio.sleep(interval)
        raise RuntimeError(f"gateway {self.ifname} did not reach {count} peers in {timeout:.0f} s: "
                           f"{self.log_path.read_text()[-2000:]}")

    def log_times(self, marker: bytes) -> list[float]:
        """UNIX times (ms resolution) of the gateway's log lines containing ``marker``."""
        import datetime

        return [datetime.datetime.strptime(line[:23].decode(), "%Y-%m-%d %H:%M:%S,%f").timestamp()
                for line in self.log_path.read_bytes().splitlines() if marker in line]

    def registered_to_up_s(self) -> float | None:
        """From the log: registration answered (peer set in hand) -> hub configured and rules installed."""
        import datetime

        stamps = {}
        for line in self.log_path.read_text().splitlines():
            for mark in ("registered as gateway", "gateway up:"):
                if mark in line and mark not in stamps:
                    stamps[mark] = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f")
        if len(stamps) < 2:
            return None
        return round((stamps["gateway up:"] - stamps["registered as gateway"]).total_seconds(), 3)

    def hub_apply_s(self) -> float | None:
        found = re.findall(rb"hub configured with (\d+) peers in ([0-9.]+) s", self.log_path.read_bytes())
        return float(found[0][1]) if found else None

    def rss(self) -> dict:
        engine = [rss_mib(c) for c in children(self.proc.pid)]
        return {"gateway_mib": rss_mib(self.proc.pid), "wireguard_go_mib": sum(v for v in engine if v) or None}

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far of the gateway process and of its wireguard-go."""
        return {"gateway": cpu_s(self.proc.pid), "wireguard_go": sum(cpu_s(c) for c in children(self.proc.pid))}

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_coordinator(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = 8790
    env = {**os.environ, "ANEX_ADMIN_TOKEN": ADMIN, "ANEX_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "anex_agent", "coordinator", "--listen", f"127.0.0.1:{port}",
         "--state-dir", str(workdir / "coordinator"),
         # the simulated nodes never heartbeat: they must not expire (and leave every hub) mid-run
         "--not-ready-after", str(FLEET_LIFETIME), "--expired-after", str(FLEET_LIFETIME + 1)],
        cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=open(workdir / "coordinator.log", "wb"),
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=1) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise RuntimeError("coordinator did not become ready")


# ---------------------------------------------------------------- the nodes


class Fleet:
    def __init__(self, url: str, token: str) -> None:
        self.url, self.token = url, token
        self.nodes: list[tuple[str, str]] = []  # (node_id, key hex)

    async def join_one(self, name: str, pair=None, client=None) -> tuple[str, bytes]:
        """Join one node; with ``client`` (a warm :func:`warm_client`) the request is the join alone."""
        from anex_agent.wire import keys
        from anex_agent.client.rest import CoordinatorClient

        pair = pair or keys.KeyPair(keys.generate_private_key())
        if client is not None:
            joined = await client.join(self.token, pair, name, "other")
        else:
            async with CoordinatorClient(self.url) as fresh:
                joined = await fresh.join(self.token, pair, name, "other")
        return joined.node_id, keys.decode_key(pair.public_b64).hex().encode()

    async def warm_client(self):
        """A client whose connection is open and which knows the coordinator's key (read once), so
        a measured join is the join request itself, as a node that has started sends it."""
        from anex_agent.client.rest import CoordinatorClient

        client = CoordinatorClient(self.url)
        await client.__aenter__()
        await client._coordinator_key()
        return client

    async def grow_to(self, count: int, concurrency: int = 32) -> float:
        started = time.perf_counter()
        todo = iter(range(len(self.nodes), count))

        async def worker() -> None:
            for i in todo:
                node_id, key_hex = await self.join_one(f"fleet-{i}")
                self.nodes.append((node_id, key_hex))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return time.perf_counter() - started


async def seen_everywhere(gateways: list[Gateway], key_hex: bytes, t0: float, present: bool,
                          timeout: float) -> list[float]:
    """Per gateway: seconds from ``t0`` to the start of the first dump where the key is (or is no longer) listed."""

    async def one(gw: Gateway) -> float:
        deadline = time.perf_counter() + timeout
        while time.perf_counter() < deadline:
            began = time.perf_counter()
            if lists(await gw.dump(), key_hex) == present:
                return began - t0
            await asyncio.sleep(POLL)
        raise RuntimeError(f"{gw.ifname}: key still {'absent' if present else 'present'} after {timeout:.0f} s")

    return list(await asyncio.gather(*(one(gw) for gw in gateways)))


def initiation(node_private: bytes, gateway_public: bytes, index: int) -> bytes:
    """A handshake initiation (with mac1) from the node to the gateway, sender index ``index``."""
    from anex_agent.wg import crypto
    from anex_agent.wg.cookie import CookieGenerator
    from anex_agent.wg.handshake import Handshake, Identity

    message = Handshake(Identity(node_private), gateway_public).create_initiation(
        index, secrets.token_bytes(32), crypto.tai64n(time.time()))
    return CookieGenerator(gateway_public).add_macs(message.to_bytes(), time.time())


class Answers(asyncio.DatagramProtocol):
    """Receives handshake responses: receiver index -> arrival time."""

    def __init__(self) -> None:
        self.arrived: dict[int, float] = {}
        self.event = asyncio.Event()

    def datagram_received(self, data: bytes, addr) -> None:
        if len(data) == 92 and data[0] == 2:
            self.arrived.setdefault(int.from_bytes(data[8:12], "little"), time.perf_counter())
            self.event.set()


async def answered_everywhere(gateways: list[Gateway], publics: list[bytes], fleet: Fleet, name: str,
                              timeout: float, client) -> tuple[list[float], float, str, bytes]:
    """Join one node; per gateway, seconds from the join request to its handshake answer, and
    the seconds the coordinator took to answer the join."""
    from anex_agent.wire import keys

    pair = keys.KeyPair(keys.generate_private_key())
    messages = [initiation(pair.private, public, 1000 + i) for i, public in enumerate(publics)]
    loop = asyncio.get_running_loop()
    transport, answers = await loop.create_datagram_endpoint(Answers, local_addr=("127.0.0.1", 0))
    answered: list[float] = []
    try:
        t0 = time.perf_counter()
        joining = asyncio.ensure_future(fleet.join_one(name, pair, client))
        joining.add_done_callback(lambda _: answered.append(time.perf_counter()))
        deadline = t0 + timeout
        while len(answers.arrived) < len(gateways):
            if time.perf_counter() > deadline:
                raise RuntimeError(f"{name}: {len(answers.arrived)}/{len(gateways)} gateways answered")
            for i, gw in enumerate(gateways):
                if 1000 + i not in answers.arrived:
                    transport.sendto(messages[i], ("127.0.0.1", gw.port))
            answers.event.clear()
            try:
                await asyncio.wait_for(answers.event.wait(), PROBE)
            except asyncio.TimeoutError:
                pass
        node_id, key_hex = await joining
        return [answers.arrived[1000 + i] - t0 for i in range(len(gateways))], answered[0] - t0, node_id, key_hex
    finally:
        transport.close()


async def logged_everywhere(gateways: list[Gateway], marker: bytes, before: list[int], t0: float,
                            timeout: float) -> list[float]:
    """Per gateway: seconds from ``t0`` (UNIX time) to its next log line with ``marker`` after
    the ``before[i]`` it had (the gateway logs an event once the engine's write returned)."""
    deadline = time.time() + timeout
    found: dict[int, float] = {}
    while len(found) < len(gateways):
        if time.time() > deadline:
            raise RuntimeError(f"{len(found)}/{len(gateways)} gateways logged {marker!r}")
        for i, gw in enumerate(gateways):
            if i not in found:
                times = gw.log_times(marker)
                if len(times) > before[i]:
                    found[i] = times[before[i]] - t0
        await asyncio.sleep(0.01)
    return [found[i] for i in range(len(gateways))]


def summary(rows: list[list[float]]) -> dict:
    every = [v for row in rows for v in row]
    last = [max(row) for row in rows]
    return {
        "samples": len(rows),
        "per_gateway_p50_ms": ms(percentile(every, 0.5)), "per_gateway_p99_ms": ms(percentile(every, 0.99)),
        "all_gateways_p50_ms": ms(percentile(last, 0.5)), "all_gateways_p99_ms": ms(percentile(last, 0.99)),
        "all_gateways_max_ms": ms(max(last) if last else None),
    }


async def bench_mode(result: dict, mode: str, root: Path, args, workdir: Path, url: str, gw_token: str,
                     fleet: Fleet, coordinator_pid: int) -> None:
    """Fills ``result`` as it goes (a failure keeps what was measured before it)."""
    samples = args.samples if mode == "ours" else args.reference_samples
    first = Gateway(workdir, url, gw_token, root, mode, 0)
    gateways = [first]
    try:
        result["snapshot_start_s"] = round(await first.wait_configured(args.nodes, 120), 3)
        await asyncio.sleep(1)
        result["registered_to_up_s"] = first.registered_to_up_s()
        result["hub_apply_s"] = first.hub_apply_s()
        result["rss_at_nodes"] = first.rss()
        gateways += [Gateway(workdir, url, gw_token, root, mode, i) for i in range(1, args.gateways)]
        await asyncio.gather(*(gw.wait_configured(args.nodes, 300) for gw in gateways[1:]))
        await asyncio.sleep(2)  # let every gateway settle (the watch stream connected, saves done)
        dump_started = time.perf_counter()
        await first.dump()
        result["uapi_dump_ms"] = ms(time.perf_counter() - dump_started)
        publics = [gw.public_key() for gw in gateways]
        joined: list[tuple[str, bytes]] = []
        rows, logged, answers = [], [], []
        client = await fleet.warm_client()

        def cpu_now() -> dict[str, float]:
            per = [gw.cpu() for gw in gateways]
            mine = os.times()
            return {"coordinator": cpu_s(coordinator_pid), "gateways": sum(c["gateway"] for c in per),
                    "wireguard_go": sum(c["wireguard_go"] for c in per), "bench": mine.user + mine.system}

        cpu_before, wall_before = cpu_now(), time.perf_counter()
        for i in range(samples):
            before = [len(gw.log_times(b"peer_added v")) for gw in gateways]
            t_wall = time.time()
            try:
                row, answer, node_id, key_hex = await answered_everywhere(
                    gateways, publics, fleet, f"{mode}-sample-{i}", args.timeout, client)
            except BaseException:
                await client.close()
                raise
            rows.append(row)
            answers.append([answer])
            logged.append(await logged_everywhere(gateways, b"peer_added v", before, t_wall, args.timeout))
            joined.append((node_id, key_hex))
            await asyncio.sleep(args.gap)
        cpu_after, wall = cpu_now(), time.perf_counter() - wall_before
        result["cpu_ms_per_join"] = {**{k: round((cpu_after[k] - cpu_before[k]) * 1000 / samples, 1) for k in cpu_after},
                                     "wall": round(wall * 1000 / samples, 1)}
        await client.close()
        result["join_to_peer_configured"] = {"measured_by": "handshake answer of each gateway", **summary(rows)}
        result["join_answered"] = {"measured_by": "the coordinator's answer to the join request",
                                   **summary(answers)}
        result["join_to_applied_logged"] = {"measured_by": "the gateway's log line once its engine write returned",
                                            **summary(logged)}
        dumps = [await gw.dump() for gw in gateways]
        result["joins_listed_by_uapi"] = f"{sum(lists(d, k) for d in dumps for _, k in joined)}/{len(dumps) * len(joined)}"
        rows = []
        for i in range(args.uapi_samples):
            t0 = time.perf_counter()
            node_id, key_hex = await fleet.join_one(f"{mode}-uapi-sample-{i}")
            rows.append(await seen_everywhere(gateways, key_hex, t0, True, args.timeout))
            joined.append((node_id, key_hex))
            await asyncio.sleep(args.gap)
        result["join_to_listed_by_uapi"] = {"measured_by": "UAPI get=1 polling (coarse: see uapi_dump_ms)",
                                            **summary(rows)}
        from anex_agent.client.rest import CoordinatorClient

        rows = []
        async with CoordinatorClient(url, admin_token=ADMIN) as admin:
            for node_id, key_hex in joined:
                before = [len(gw.log_times(b"peer_removed v")) for gw in gateways]
                t_wall = time.time()
                await admin.delete_node(node_id)
                rows.append(await logged_everywhere(gateways, b"peer_removed v", before, t_wall, args.timeout))
                await asyncio.sleep(args.gap)
        result["delete_to_peer_removed"] = {"measured_by": "the gateway's log line once its engine write returned",
                                            **summary(rows)}
        dumps = [await gw.dump() for gw in gateways]
        result["deletes_gone_from_uapi"] = (f"{sum(not lists(d, k) for d in dumps for _, k in joined)}/"
                                            f"{len(dumps) * len(joined)}")
    finally:
        for gw in gateways:
            gw.stop()
        await forget(url, gateways)


async def forget(url: str, gateways: list[Gateway]) -> None:
    """Delete the gateways' registrations (a reused fleet keeps only its nodes)."""
    from anex_agent.client.rest import CoordinatorClient
    from anex_agent.errors import CoordinatorError

    async with CoordinatorClient(url, admin_token=ADMIN) as admin:
        for gw in gateways:
            gateway_id = gw.gateway_id()
            if gateway_id:
                try:
                    await admin.delete_gateway(gateway_id)
                except CoordinatorError:
                    pass


async def follow_growth(out: dict, args, workdir: Path, url: str, gw_token: str, fleet: Fleet) -> None:
    """Memory of one gateway (ours) following the fleet as it grows by joins, and the join rate."""
    follower = Gateway(workdir, url, gw_token, ROOT, "ours", 99)
    try:
        await follower.wait_peers(0, 60)
        await asyncio.sleep(1)
        memory = {"0": follower.rss()}
        for step in sorted({min(1000, args.nodes), args.nodes}):
            took = await fleet.grow_to(step)
            t0 = time.perf_counter()
            await follower.wait_peers(step, 120, interval=0.5)
            out[f"fleet_joins_to_{step}"] = {"seconds": round(took, 1), "joins_per_s": round(step / took if
                                             step == min(1000, args.nodes) else (step - 1000) / took),
                                             "follower_caught_up_after_s": round(time.perf_counter() - t0, 2)}
            await asyncio.sleep(2.5)  # past a save of the peer set
            memory[str(step)] = follower.rss()
        out["memory_ours_following"] = memory
        small, big = memory["0"]["gateway_mib"], memory[str(args.nodes)]["gateway_mib"]
        if small and big:
            out["gateway_kib_per_peer"] = round((big - small) * 1024 / args.nodes, 2)
    finally:
        follower.stop()
        await forget(url, [follower])


async def inside(args) -> dict:
    from anex_agent.client.rest import CoordinatorClient

    workdir = Path(tempfile.mkdtemp(prefix="anex-gwbench-"))
    cache = Path(args.fleet_cache) if args.fleet_cache else None
    cached = cache is not None and (cache / "tokens.json").exists()
    if cached:
        shutil.copytree(cache / "coordinator", workdir / "coordinator")
    coordinator, url = start_coordinator(workdir)
    out: dict = {"nodes": args.nodes, "gateways": args.gateways, "engine": "wireguard-go",
                 "cpus": os.cpu_count(), "loadavg_start": os.getloadavg()[0], "fleet_from_cache": cached}
    try:
        if cached:
            tokens = json.loads((cache / "tokens.json").read_text())
            gw_token, node_token = tokens["gateway"], tokens["node"]
        else:
            async with CoordinatorClient(url, admin_token=ADMIN) as admin:
                gw_token = (await admin.create_join_token("gateway", reusable=True, expires_in=86400)).token
                node_token = (await admin.create_join_token(reusable=True, expires_in=86400)).token
        fleet = Fleet(url, node_token)

        if not cached:  # memory of one gateway (ours) following the fleet as it grows by joins
            await follow_growth(out, args, workdir, url, gw_token, fleet)
            if cache is not None:  # keep the fleet for the next run (a copy of the stopped coordinator's state)
                coordinator.terminate()
                coordinator.wait(15)
                shutil.copytree(workdir / "coordinator", cache / "coordinator")
                (cache / "tokens.json").write_text(json.dumps({"gateway": gw_token, "node": node_token}))
                coordinator, url = start_coordinator(workdir)

        modes = [("ours", ROOT)]
        if args.reference_root:
            modes.append(("reference", Path(args.reference_root)))
        for mode, root in modes:
            out[mode] = {}
            try:
                await bench_mode(out[mode], mode, root, args, workdir, url, gw_token, fleet, coordinator.pid)
            except RuntimeError as err:  # keep what was measured; say what stopped it
                out[mode]["error"] = str(err)[:2000]
        out["loadavg_end"] = os.getloadavg()[0]
    finally:
        coordinator.terminate()
        coordinator.wait(15)
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            out["workdir"] = str(workdir)
    return out


def reference_checkout(rev: str) -> Path:
    target = Path(tempfile.mkdtemp(prefix="anex-gwbench-ref-"))
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", rev, "anex_agent"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--samples", type=int, default=100, help="joins (then deletes) measured with ours")
    parser.add_argument("--reference-samples", type=int, default=10)
    parser.add_argument("--uapi-samples", type=int, default=5, help="joins timed by UAPI polling")
    parser.add_argument("--gap", type=float, default=0.05, help="seconds between two measured changes")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds a change may take on one gateway")
    parser.add_argument("--reference-rev", default=REFERENCE_REV, help="git revision of the reference gateway "
                        "(default: the last one that rewrote the whole set per event)")
    parser.add_argument("--reference-root", help="a checkout to run the reference gateway from")
    parser.add_argument("--no-reference", action="store_true")
    parser.add_argument("--fleet-cache", help="a directory keeping the joined fleet (the coordinator's state) "
                        "for the next run: the second run skips the joins and the memory-while-growing part")
    parser.add_argument("--keep", action="store_true", help="keep the logs and state (path in the output)")
    parser.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.inside:
        print(json.dumps(asyncio.run(inside(args)), indent=1))
        return
    from anex_agent.testing.netlab import Namespace, missing_prerequisites

    reason = missing_prerequisites("wireguard-go")
    if reason:
        print(json.dumps({"skipped": reason}))
        return
    made = None
    if not args.no_reference and not args.reference_root:
        made = reference_checkout(args.reference_rev)
    root = None if args.no_reference else (args.reference_root or str(made))
    ns = Namespace("gwb").create()
    try:
        argv = [sys.executable, __file__, "--inside", "--nodes", str(args.nodes), "--gateways", str(args.gateways),
                "--samples", str(args.samples), "--reference-samples", str(args.reference_samples),
                "--uapi-samples", str(args.uapi_samples),
                "--gap", str(args.gap), "--timeout", str(args.timeout)]
        argv += ["--reference-root", root] if root else []
        argv += ["--keep"] if args.keep else []
        argv += ["--fleet-cache", str(Path(args.fleet_cache).resolve())] if args.fleet_cache else []
        done = subprocess.run(ns.argv(argv), cwd=ROOT, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-4000:])
            sys.exit(done.returncode)
        result = json.loads(done.stdout)
        result["reference"] = {"rev": args.reference_rev if made else None, "root": root,
                               **result.get("reference", {})} if root else None
        print(json.dumps(result, indent=1))
    finally:
        ns.close()
        if made is not None:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    main()
