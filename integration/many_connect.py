"""``python many_connect.py COUNT BYTES DEST [PROXY]``: COUNT concurrent CONNECTs through the HTTP
proxy at PROXY (default 127.0.0.1:3128) to the bulk source DEST, each downloading BYTES; prints
how many completed whole. Test and benchmark helper."""

from __future__ import annotations

import asyncio
import struct
import sys


async def one(dest: str, nbytes: int, proxy: tuple[str, int]) -> int:
    reader, writer = await asyncio.open_connection(*proxy)
    try:
        writer.write(f"CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n".encode())
        head = await reader.readuntil(b"\r\n\r\n")
        if not head.startswith(b"HTTP/1.1 200"):
            return 0
        writer.write(struct.pack("!Q", nbytes))
        got = 0
        while got < nbytes:
            data = await reader.read(1 << 16)
            if not data:
                break
            got += len(data)
        return got
    finally:
        writer.close()


async def main(count: int, nbytes: int, dest: str, proxy: str) -> None:
    host, _, port = proxy.rpartition(":")
    results = await asyncio.gather(*(one(dest, nbytes, (host, int(port))) for _ in range(count)), return_exceptions=True)
    print(sum(1 for r in results if r == nbytes), flush=True)


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4] if len(sys.argv) > 4 else "127.0.0.1:3128"))
