"""A TCP service for checked bulk transfers: ``python sha_service.py HOST:PORT``.

A client sends one line: ``down N SEED`` (we send N pseudo-random bytes from SEED, then close)
or ``up`` (we read to EOF and answer the sha256 hex of what came). Test helper.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import sys

CHUNK = 1 << 16


def stream(n: int, seed: int):
    rng = random.Random(seed)
    while n > 0:
        size = min(CHUNK, n)
        yield rng.randbytes(size)
        n -= size


async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    line = (await reader.readline()).decode().split()
    if line and line[0] == "down":
        for chunk in stream(int(line[1]), int(line[2])):
            writer.write(chunk)
            await writer.drain()
    elif line and line[0] == "up":
        digest = hashlib.sha256()
        while data := await reader.read(CHUNK):
            digest.update(data)
        writer.write(digest.hexdigest().encode())
        await writer.drain()
    writer.close()


async def main(listen: str) -> None:
    host, _, port = listen.rpartition(":")
    server = await asyncio.start_server(handle, host, int(port))
    print("ready", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1]))
