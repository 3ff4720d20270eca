"""A flood of WireGuard handshake initiations with a valid mac1 (what anyone who knows a public key can send).

Run inside a network namespace::

    python -m integration.wg_flood PUBLIC_KEY HOST:PORT --sources 192.168.77.11,192.168.77.12 \
        [--rate 20000] [--seconds 10] [--identities 16]

It builds ``--identities`` initiations from random key pairs to ``PUBLIC_KEY`` (mac1 made with
that key; no cookie is ever taken up) and sends them round robin from one UDP socket per
source address at ``--rate`` datagrams a second in all (as fast as it can when it cannot keep
up), for ``--seconds`` s or until SIGTERM. It prints one JSON line when it starts sending,
``{"started": true}``, and one at the end: ``{"sent": N, "seconds": S}``. Test and benchmark
tool only.
"""

from __future__ import annotations

import argparse
import json
import select
import signal
import socket
import sys
import time

from anex_agent.wire import keys
from anex_agent.wire.keys import decode_key
from anex_agent.wg.device import Device
from anex_agent.wg.peer import PeerConfig


def initiations(victim_public: bytes, count: int) -> list[bytes]:
    found = []
    for _ in range(count):
        stranger = Device(keys.generate_private_key(), wall_time=time.time)
        stranger.set_peer(PeerConfig(victim_public, ["10.255.255.255/32"], ("192.0.2.1", 1)))
        found.append(stranger.initiate_handshake(victim_public, 0.0).datagrams[0][0])
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="wg_flood")
    parser.add_argument("public_key")
    parser.add_argument("target", help="HOST:PORT")
    parser.add_argument("--sources", required=True, help="comma-separated source addresses")
    parser.add_argument("--rate", type=float, default=20000.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--identities", type=int, default=16)
    args = parser.parse_args(argv)
    host, _, port = args.target.rpartition(":")
    target = (host, int(port))
    messages = initiations(decode_key(args.public_key), args.identities)
    socks = []
    for source in args.sources.split(","):
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind((source, 0))
        sock.setblocking(False)
        socks.append(sock)
    stop = [False]
    signal.signal(signal.SIGTERM, lambda *_: stop.__setitem__(0, True))
    sent = 0
    print(json.dumps({"started": True}), flush=True)
    started = time.monotonic()
    end = started + args.seconds
    batch = 64
    while not stop[0]:
        now = time.monotonic()
        if now >= end:
            break
        due = int((now - started) * args.rate) - sent
        if due <= 0:
            select.select([], [], [], batch / args.rate)  # pace the sender
            continue
        for i in range(min(due, batch)):
            n = sent + i
            try:
                socks[n % len(socks)].sendto(messages[n % len(messages)], target)
            except (BlockingIOError, OSError):
                pass
        sent += min(due, batch)
    print(json.dumps({"sent": sent, "seconds": round(time.monotonic() - started, 3)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
