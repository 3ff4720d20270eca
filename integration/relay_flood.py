"""``python relay_flood.py HOST:PORT CLIENTS SECONDS SOURCE[,SOURCE...]``: strangers at a relay.

CLIENTS concurrent raw TCP clients, spread over the SOURCE addresses, each doing the WebSocket
upgrade with the relay's subprotocol, reading the challenge and never answering; whenever the
relay ends one (deadline, eviction, refusal at the accept) it reconnects at once, for SECONDS.
Prints ``flooding`` once every client has made its first attempt, then one JSON line of counts:
connects, connect_failed (reset before the connect returned: the relay refuses at accept),
challenged (got 101 and the challenge), refused_http (another status), ended_by_relay.
Test and benchmark helper; a minimal asyncio Protocol, so one process generates thousands.
"""

from __future__ import annotations

import asyncio
import collections
import json
import resource
import sys
import time

UPGRADE = (b"GET /relay HTTP/1.1\r\nHost: relay\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
           b"Sec-WebSocket-Protocol: anex-wg.v2\r\n\r\n")


class Stranger(asyncio.Protocol):
    """One stranger's connection: the upgrade sent, the first answer counted, then silence."""

    def __init__(self, stats: collections.Counter, done: asyncio.Future) -> None:
        self.stats, self.done, self.seen = stats, done, False

    def connection_made(self, transport) -> None:
        transport.write(UPGRADE)

    def data_received(self, data: bytes) -> None:
        if not self.seen:
            self.seen = True
            self.stats["challenged" if data.startswith(b"HTTP/1.1 101") else "refused_http"] += 1

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_result(None)


async def client(host: str, port: int, source: str, stats: collections.Counter, stop_at: float,
                 all_started: asyncio.Event, clients: int) -> None:
    loop = asyncio.get_running_loop()
    first = True
    while time.monotonic() < stop_at:
        done = loop.create_future()
        try:
            transport, _ = await loop.create_connection(lambda: Stranger(stats, done), host, port,
                                                        local_addr=(source, 0))
        except OSError:
            stats["connect_failed"] += 1
            continue
        finally:
            if first:
                first = False
                stats["started"] += 1
                if stats["started"] == clients:
                    all_started.set()
        stats["connects"] += 1
        try:
            await asyncio.wait_for(done, max(0.0, stop_at - time.monotonic()))
            stats["ended_by_relay"] += 1
        except asyncio.TimeoutError:
            pass
        transport.abort()


async def main(target: str, clients: int, seconds: float, sources: list[str]) -> None:
    host, _, port = target.rpartition(":")
    stats: collections.Counter = collections.Counter()
    stop_at = time.monotonic() + seconds
    all_started = asyncio.Event()
    tasks = [asyncio.create_task(client(host, int(port), sources[i % len(sources)], stats, stop_at, all_started, clients),
                                 name=f"stranger-{i}") for i in range(clients)]
    await all_started.wait()
    print("flooding", flush=True)
    await asyncio.gather(*tasks)
    print(json.dumps({"clients": clients, "seconds": seconds, "sources": len(sources), **stats}), flush=True)


if __name__ == "__main__":
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), sys.argv[4].split(",")))
