"""Opens N connections to 127.0.0.1:PORT, one HTTP GET on each (the answer proves the forward
relays it), then keeps them all open and idle; prints "ready" and waits for a line on stdin.

    python idle_clients.py PORT N
"""

from __future__ import annotations

import resource
import socket
import sys


def main() -> None:
    port, count = int(sys.argv[1]), int(sys.argv[2])
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, count + 256)), hard))
    conns = []
    for i in range(count):
        s = socket.create_connection(("127.0.0.1", port), timeout=60)
        s.sendall(f"GET /idle-{i} HTTP/1.1\r\nHost: echo\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = s.recv(65536)
            if not chunk:
                raise SystemExit(f"connection {i} closed before an answer")
            head += chunk
        conns.append(s)
    print("ready", flush=True)
    sys.stdin.readline()
    for s in conns:
        s.close()


if __name__ == "__main__":
    main()
