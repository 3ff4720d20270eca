"""A user-space UDP relay that drops and reorders: ``python lossy_relay.py LISTEN UPSTREAM LOSS REORDER``.

Datagrams from anyone but ``UPSTREAM`` go to ``UPSTREAM``; datagrams from ``UPSTREAM`` go back
to the last other sender. Each datagram is dropped with probability ``LOSS``; one not dropped
is held back 1-4 ms with probability ``REORDER`` (so later ones overtake it). Prints ``ready``,
then counters on SIGTERM. Test helper.
"""

from __future__ import annotations

import asyncio
import json
import random
import signal
import socket
import sys


def split(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


async def main(listen: str, upstream: str, loss: float, reorder: float) -> None:
    loop = asyncio.get_running_loop()
    up = split(upstream)
    counts = {"forwarded": 0, "dropped": 0, "reordered": 0}
    client: list[tuple[str, int] | None] = [None]

    class Relay(asyncio.DatagramProtocol):
        def connection_made(self, transport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr) -> None:
            dest = client[0] if addr == up else up
            if addr != up:
                client[0] = addr
            if dest is None:
                return
            if random.random() < loss:
                counts["dropped"] += 1
                return
            counts["forwarded"] += 1
            if random.random() < reorder:
                counts["reordered"] += 1
                loop.call_later(random.uniform(0.001, 0.004), self.transport.sendto, data, dest)
            else:
                self.transport.sendto(data, dest)

    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(split(listen))
    await loop.create_datagram_endpoint(Relay, sock=sock)
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    print("ready", flush=True)
    await stop.wait()
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4])))
