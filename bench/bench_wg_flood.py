"""A real node's handshake and data through a flood of valid-mac1 handshake initiations, our
user-space engine side by side with wireguard-go under the same flood, in one run.

Two setups, each built fresh in network namespaces joined by a veth pair (root, wireguard-go):

* ``ours``: the victim is our engine (integration/wg_peer.py: UserspaceEngine over UDP, echoing
  UDP on port 7 of 10.97.0.2);
* ``wireguard_go``: the victim is wireguard-go (a UDP echo service on port 7 of 10.97.0.2).

The real node is wireguard-go at 10.97.0.1. For each victim, ``quiet`` and then ``flood``
(integration/wg_flood.py from four more addresses of the real node's namespace, initiations from
random identities with a valid mac1 to the victim's public key, ``--rate`` a second; the rate it
reached is reported): the real node's peer is added and the time to the first ping reply is its
``handshake_s`` (a flood victim answers with a cookie reply first, and wireguard-go's retry comes
5 s later, whitepaper §6.4); then ICMP round trips and UDP echo ``throughput_mbit`` (1200-byte
datagrams, 32 in flight, counted both ways, for ``--seconds`` s).

Prints one JSON document.
"""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "bench"))

from bench_wg import UDP_ECHO, GoSide, ping_rtts, summarize  # noqa: E402

from anex_agent.wire import keys  # noqa: E402

REAL, VICTIM = "10.97.0.1", "10.97.0.2"
REAL_UDP, VICTIM_UDP = ("192.168.78.1", 51820), ("192.168.78.2", 51821)
FLOOD_SOURCES = [f"192.168.78.{n}" for n in range(11, 15)]

UDP_THROUGHPUT = r"""
import json, socket, sys, time
dst, seconds, window, size = sys.argv[1], float(sys.argv[2]), 32, 1200
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(0.5)
payload = b"x" * size
sent = got = 0
end = time.monotonic() + seconds
for _ in range(window):
    s.sendto(payload, (dst, 7)); sent += 1
started = time.monotonic()
while time.monotonic() < end:
    try:
        s.recvfrom(2048); got += 1
    except socket.timeout:
        pass
    s.sendto(payload, (dst, 7)); sent += 1
took = time.monotonic() - started
print(json.dumps({"mbit": round(got * size * 2 * 8 / took / 1e6, 2), "echoed": got, "sent": sent}))
"""


def handshake_seconds(real: GoSide, victim_public: str) -> float:
    started = time.monotonic()
    real.add_peer(victim_public, f"{VICTIM}/32", f"{VICTIM_UDP[0]}:{VICTIM_UDP[1]}")
    out = real.ns.run(["ping", "-c", "1", "-i", "0.05", "-w", "60", VICTIM], check=False, timeout=90)
    return round(time.monotonic() - started, 3) if out.returncode == 0 else float("nan")


def measure(real: GoSide, victim_public: str, seconds: float) -> dict:
    handshake = handshake_seconds(real, victim_public)
    icmp = summarize(ping_rtts(real.ns, VICTIM, 100))
    out = real.ns.run([sys.executable, "-c", UDP_THROUGHPUT, VICTIM, str(seconds)], timeout=seconds + 30).stdout
    doc = json.loads(out)
    real.ns.run(["wg", "set", real.ifname, "peer", victim_public, "remove"])
    return {"handshake_s": handshake, "icmp": icmp, "throughput_mbit": doc["mbit"], "echoed": doc["echoed"]}


def start_flood(ns, victim_public: str, rate: float) -> subprocess.Popen:
    proc = ns.popen([sys.executable, "-m", "integration.wg_flood", victim_public, f"{VICTIM_UDP[0]}:{VICTIM_UDP[1]}",
                     "--sources", ",".join(FLOOD_SOURCES), "--rate", str(rate), "--seconds", "600"],
                    cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE, text=True)
    assert json.loads(proc.stdout.readline())["started"]
    return proc


def stop_flood(proc: subprocess.Popen) -> dict:
    proc.send_signal(signal.SIGTERM)
    doc = json.loads(proc.stdout.readline())
    proc.wait(timeout=10)
    return {"sent": doc["sent"], "rate_per_s": round(doc["sent"] / max(doc["seconds"], 1e-9))}


def run_victim(kind: str, tmp: Path, rate: float, seconds: float) -> dict:
    from integration.netns import Netns, veth

    with Netns("bfr") as real_ns, Netns("bfv") as victim_ns:
        link, _ = veth(real_ns, victim_ns, f"{REAL_UDP[0]}/24", f"{VICTIM_UDP[0]}/24")
        for address in FLOOD_SOURCES:
            real_ns.run(["ip", "addr", "add", f"{address}/24", "dev", link])
        real = GoSide(real_ns, tmp, REAL, REAL_UDP[1])
        if kind == "ours":
            key = keys.KeyPair(keys.generate_private_key())
            proc = victim_ns.popen([sys.executable, "-m", "integration.wg_peer", VICTIM], cwd=ROOT,
                                   env=dict(os.environ, PYTHONPATH=str(ROOT)),
                                   stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            proc.stdin.write(json.dumps({"op": "apply", "config": {
                "private_key": key.private_b64, "listen_port": VICTIM_UDP[1], "address": f"{VICTIM}/24",
                "peers": [{"public_key": real.key.public_b64, "allowed_ips": [f"{REAL}/32"]}]}}) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["ok"]
            victim_public = key.public_b64
        else:
            victim = GoSide(victim_ns, tmp, VICTIM, VICTIM_UDP[1])
            victim.ns.run(["wg", "set", victim.ifname, "peer", real.key.public_b64, "allowed-ips", f"{REAL}/32"])
            victim_ns.popen([sys.executable, "-c", UDP_ECHO])
            victim_public = victim.key.public_b64
        result = {"quiet": measure(real, victim_public, seconds)}
        flood = start_flood(real_ns, victim_public, rate)
        time.sleep(1.0)  # the victim is under load before the real node comes
        try:
            result["flood"] = measure(real, victim_public, seconds)
        finally:
            result["flood"]["flood"] = stop_flood(flood)
        return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rate", type=float, default=20000.0, help="flood datagrams a second (asked for)")
    parser.add_argument("--seconds", type=float, default=5.0, help="length of each throughput measurement")
    args = parser.parse_args()
    from integration.netns import missing_prerequisites

    reason = missing_prerequisites("wireguard-go", "wg", "ping")
    if reason is None and not os.path.exists("/dev/net/tun"):
        reason = "needs /dev/net/tun"
    doc: dict = {"benchmark": "bench_wg_flood", "rate_asked": args.rate}
    if reason:
        doc["skipped"] = reason
    else:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmpdir:
            for kind in ("ours", "wireguard_go"):
                doc[kind] = run_victim(kind, Path(tmpdir), args.rate, args.seconds)
        doc["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
