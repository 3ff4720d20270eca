"""User-space WireGuard benchmark: transport throughput in-process, and round-trip latency
against wireguard-go on a veth pair, side by side with wireguard-go <-> wireguard-go.

1. ``transport``: 1420-byte IPv4 packets through our core (``Device.send_packet`` then the
   peer's ``Device.receive_datagram``, padding, counters, replay window and cryptokey
   routing included) in packets/s and microseconds per packet, each direction measured
   separately; next to it ``raw_aead``: ChaCha20-Poly1305 alone on the same payloads
   (the floor set by the ``cryptography`` library; the rest is our Python overhead).
2. ``latency`` (root, wireguard-go, ping): two setups built in this run, each two network
   namespaces joined by a veth pair:
   * ``ours_vs_wireguard_go``: wireguard-go (TUN) <-> our engine (integration/wg_peer.py:
     UserspaceEngine over UDP + the minimal ICMP/UDP layer);
   * ``wireguard_go_vs_wireguard_go``: wireguard-go <-> wireguard-go.
   ICMP: ``ping`` from the wireguard-go side; UDP: an echo client on the wireguard-go side
   against an echo service on port 7 of the other side. RTTs in microseconds.

Prints one JSON document; finishes in well under 60 s.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anex_agent.wire import keys  # noqa: E402
from anex_agent.wg.device import Device  # noqa: E402
from anex_agent.wg.peer import PeerConfig  # noqa: E402

PACKET_SIZE = 1420


def ipv4_udp(src: str, dst: str, size: int) -> bytes:
    import ipaddress

    payload = os.urandom(size - 28)
    return (struct.pack("!BBHHHBBH4s4s", 0x45, 0, size, 0, 0, 64, 17, 0,
                        ipaddress.ip_address(src).packed, ipaddress.ip_address(dst).packed)
            + struct.pack("!HHHH", 1000, 2000, size - 20, 0) + payload)


def bench_transport(count: int) -> dict:
    rng = random.Random(1)
    now = 100.0
    a = Device(keys.generate_private_key(), wall_time=time.time, random_bytes=rng.randbytes)
    b = Device(keys.generate_private_key(), wall_time=time.time, random_bytes=rng.randbytes)
    a.set_peer(PeerConfig(b.public_key, ["10.1.0.2/32"], ("192.0.2.2", 1)))
    b.set_peer(PeerConfig(a.public_key, ["10.1.0.1/32"], ("192.0.2.1", 1)))
    out = a.send_packet(ipv4_udp("10.1.0.1", "10.1.0.2", 100), now)  # handshake
    queue = [("a", out)]
    while queue:  # run the handshake to completion
        who, o = queue.pop()
        for data, _ in o.datagrams:
            dev, src = (b, ("192.0.2.1", 1)) if who == "a" else (a, ("192.0.2.2", 1))
            queue.append(("b" if who == "a" else "a", dev.receive_datagram(data, src, now)))
    packet = ipv4_udp("10.1.0.1", "10.1.0.2", PACKET_SIZE)

    datagrams = []
    t0 = time.perf_counter()
    for _ in range(count):
        datagrams.append(a.send_packet(packet, now).datagrams[0][0])
    enc = time.perf_counter() - t0
    src = ("192.0.2.1", 1)
    t0 = time.perf_counter()
    delivered = 0
    for dg in datagrams:
        delivered += len(b.receive_datagram(dg, src, now).packets)
    dec = time.perf_counter() - t0
    assert delivered == count, f"only {delivered} of {count} packets decrypted"

    from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305

    aead = ChaCha20Poly1305(os.urandom(32))
    t0 = time.perf_counter()
    sealed = [aead.encrypt(struct.pack("<4xQ", i), packet, None) for i in range(count)]
    raw_enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    for i, s in enumerate(sealed):
        aead.decrypt(struct.pack("<4xQ", i), s, None)
    raw_dec = time.perf_counter() - t0

    def fig(seconds: float) -> dict:
        return {"packets_per_s": round(count / seconds), "us_per_packet": round(seconds / count * 1e6, 2),
                "mbit_per_s": round(count * PACKET_SIZE * 8 / seconds / 1e6, 1)}

    return {"packet_bytes": PACKET_SIZE, "packets": count,
            "ours": {"encrypt": fig(enc), "decrypt": fig(dec)},
            "raw_aead": {"encrypt": fig(raw_enc), "decrypt": fig(raw_dec)}}


# ---------------------------------------------------------------- latency in namespaces

UDP_CLIENT = r"""
import json, socket, sys, time
dst, count = sys.argv[1], int(sys.argv[2])
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(2)
rtts, lost = [], 0
for i in range(count + 5):
    payload = b"%08d" % i + b"x" * 56
    t = time.perf_counter(); s.sendto(payload, (dst, 7))
    try:
        while True:
            d, _ = s.recvfrom(2048)
            if d == payload: break
    except socket.timeout:
        lost += 1; continue
    if i >= 5: rtts.append((time.perf_counter() - t) * 1e6)
    time.sleep(0.002)
print(json.dumps({"rtts": rtts, "lost": lost}))
"""

UDP_ECHO = r"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.bind(("0.0.0.0", 7))
while True:
    d, a = s.recvfrom(2048); s.sendto(d, a)
"""


def summarize(rtts: list[float]) -> dict:
    rtts = sorted(rtts)
    if not rtts:
        return {"samples": 0}
    return {"samples": len(rtts), "min_us": round(rtts[0], 1), "median_us": round(statistics.median(rtts), 1),
            "p99_us": round(rtts[min(len(rtts) - 1, int(len(rtts) * 0.99))], 1), "max_us": round(rtts[-1], 1)}


def ping_rtts(ns, dst: str, count: int) -> list[float]:
    out = ns.run(["ping", "-c", str(count), "-i", "0.005", "-W", "2", "-s", "56", dst], check=False, timeout=60).stdout
    return [float(part.split("=")[1]) * 1000 for line in out.splitlines() for part in line.split()
            if part.startswith("time=")]


def udp_rtts(ns, dst: str, count: int) -> dict:
    out = ns.run([sys.executable, "-c", UDP_CLIENT, dst, str(count)], timeout=60).stdout
    return json.loads(out)


class GoSide:
    """wireguard-go in a namespace, configured with wg(8)."""

    def __init__(self, ns, tmp: Path, tun_addr: str, port: int) -> None:
        from integration.netns import unique

        self.ns, self.ifname, self.key = ns, unique("anxbw"), keys.KeyPair(keys.generate_private_key())
        env = dict(os.environ, WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD="1")
        ns.popen(["wireguard-go", "-f", self.ifname], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while ns.run(["wg", "show", self.ifname], check=False).returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError("wireguard-go did not come up")
            time.sleep(0.05)
        key_file = tmp / f"{self.ifname}.key"
        key_file.write_text(self.key.private_b64 + "\n")
        key_file.chmod(0o600)
        ns.run(["wg", "set", self.ifname, "private-key", str(key_file), "listen-port", str(port)])
        ns.run(["ip", "addr", "add", f"{tun_addr}/24", "dev", self.ifname])
        ns.run(["ip", "link", "set", self.ifname, "up"])

    def add_peer(self, public_b64: str, allowed: str, endpoint: str) -> None:
        self.ns.run(["wg", "set", self.ifname, "peer", public_b64, "allowed-ips", allowed, "endpoint", endpoint])


def bench_latency(count: int) -> dict:
    from integration.netns import Netns, missing_prerequisites, veth

    reason = missing_prerequisites("wireguard-go", "wg", "ping")
    if reason is None and not os.path.exists("/dev/net/tun"):
        reason = "needs /dev/net/tun"
    if reason:
        return {"skipped": reason}
    import tempfile

    results: dict = {}
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        # wireguard-go <-> ours
        with Netns("bwg") as go_ns, Netns("bwu") as our_ns:
            veth(go_ns, our_ns, "192.168.79.1/24", "192.168.79.2/24")
            go = GoSide(go_ns, tmp, "10.96.1.1", 51820)
            ours = keys.KeyPair(keys.generate_private_key())
            go.add_peer(ours.public_b64, "10.96.1.2/32", "192.168.79.2:51821")
            env = dict(os.environ, PYTHONPATH=str(ROOT))
            proc = our_ns.popen([sys.executable, "-m", "integration.wg_peer", "10.96.1.2"], cwd=ROOT, env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            proc.stdin.write(json.dumps({"op": "apply", "config": {
                "private_key": ours.private_b64, "listen_port": 51821, "address": "10.96.1.2/24",
                "peers": [{"public_key": go.key.public_b64, "endpoint": "192.168.79.1:51820",
                           "allowed_ips": ["10.96.1.1/32"]}]}}) + "\n")
            proc.stdin.flush()
            assert json.loads(proc.stdout.readline())["ok"]
            ping_rtts(go_ns, "10.96.1.2", 3)  # handshake + warm-up
            results["ours_vs_wireguard_go"] = {"icmp": summarize(ping_rtts(go_ns, "10.96.1.2", count)),
                                               "udp": (lambda r: {**summarize(r["rtts"]), "lost": r["lost"]})(
                                                   udp_rtts(go_ns, "10.96.1.2", count))}
            proc.stdin.close()
            proc.wait(timeout=10)
        # wireguard-go <-> wireguard-go
        with Netns("bwa") as a_ns, Netns("bwb") as b_ns:
            veth(a_ns, b_ns, "192.168.79.1/24", "192.168.79.2/24")
            a = GoSide(a_ns, tmp, "10.96.2.1", 51820)
            b = GoSide(b_ns, tmp, "10.96.2.2", 51821)
            a.add_peer(b.key.public_b64, "10.96.2.2/32", "192.168.79.2:51821")
            b.add_peer(a.key.public_b64, "10.96.2.1/32", "192.168.79.1:51820")
            b_ns.popen([sys.executable, "-c", UDP_ECHO])
            ping_rtts(a_ns, "10.96.2.2", 3)
            time.sleep(0.2)
            results["wireguard_go_vs_wireguard_go"] = {"icmp": summarize(ping_rtts(a_ns, "10.96.2.2", count)),
                                                       "udp": (lambda r: {**summarize(r["rtts"]), "lost": r["lost"]})(
                                                           udp_rtts(a_ns, "10.96.2.2", count))}
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--packets", type=int, default=20000, help="packets per throughput direction")
    parser.add_argument("--pings", type=int, default=300, help="round trips per latency measurement")
    args = parser.parse_args()
    started = time.perf_counter()
    doc = {"benchmark": "bench_wg", "transport": bench_transport(args.packets)}
    try:
        doc["latency"] = bench_latency(args.pings)
    except Exception as err:  # report, do not hide: the throughput part still stands
        doc["latency"] = {"error": f"{type(err).__name__}: {err}"}
    doc["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
