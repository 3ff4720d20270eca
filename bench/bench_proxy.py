"""HTTP and SOCKS5 proxies on loopback: added latency per keep-alive request, and tunnel throughput; vs direct.

One run, side by side:

* latency: a client process sends ``--requests`` keep-alive GETs of a small body, once
  straight to the origin and once through our proxy (absolute-form); we report p50/p99
  of each and the added p50/p99 (proxy minus direct);
* CONNECT throughput: a client process sends ``--mb`` MiB through a CONNECT tunnel to
  a sink that counts bytes (as in bench_forward), and the same straight to the sink;
* SOCKS5 throughput: the same bytes through a SOCKS5 ``CONNECT`` (RFC 1928, no auth) to the
  same sink, in the same rounds, interleaved with the HTTP CONNECT ones (the order turns every
  round): SOCKS5 vs HTTP CONNECT.

The proxies run in this process (asyncio, :class:`ProxyServer` and :class:`Socks5Server` with
the OS dialer); the origin, sink and clients are separate processes. Prints one JSON document.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_forward import role_sink, send_bulk  # noqa: E402  (same sink and sender for both benchmarks)

BODY = b"x" * 512


def role_origin() -> None:
    """A minimal keep-alive HTTP/1.1 origin answering every request with a 512-byte body."""

    class Origin(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.buf = b""

        def data_received(self, data):
            self.buf += data
            while b"\r\n\r\n" in self.buf:
                _, self.buf = self.buf.split(b"\r\n\r\n", 1)
                self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(BODY), BODY))

    async def main():
        server = await asyncio.get_running_loop().create_server(Origin, "127.0.0.1", 0)
        print(server.sockets[0].getsockname()[1], flush=True)
        await server.serve_forever()

    asyncio.run(main())


def _read_response(sock: socket.socket, pending: bytes) -> bytes:
    while b"\r\n\r\n" not in pending:
        pending += sock.recv(65536)
    head, rest = pending.split(b"\r\n\r\n", 1)
    length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
    while len(rest) < length:
        rest += sock.recv(65536)
    if not head.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(head.decode(errors="replace"))
    return rest[length:]


def role_latency_client(port: int, origin_port: int, requests: int, via_proxy: bool) -> None:
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    target = f"http://127.0.0.1:{origin_port}/small" if via_proxy else "/small"
    request = f"GET {target} HTTP/1.1\r\nHost: 127.0.0.1:{origin_port}\r\n\r\n".encode()
    samples = []
    pending = b""
    for i in range(requests + 50):
        start = time.perf_counter()
        sock.sendall(request)
        pending = _read_response(sock, pending)
        if i >= 50:  # warm-up excluded
            samples.append(time.perf_counter() - start)
    print(json.dumps(samples), flush=True)


def _recv_exactly(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise RuntimeError(f"the SOCKS5 proxy closed the connection after {data!r}")
        data += chunk
    return data


def _socks5_connect(sock: socket.socket, sink_port: int) -> None:
    """RFC 1928: greeting (no auth), CONNECT 127.0.0.1:sink_port, the reply."""
    sock.sendall(bytes([5, 1, 0]))
    if _recv_exactly(sock, 2) != bytes([5, 0]):
        raise RuntimeError("the SOCKS5 proxy refused the no-authentication method")
    sock.sendall(bytes([5, 1, 0, 1, 127, 0, 0, 1]) + sink_port.to_bytes(2, "big"))
    reply = _recv_exactly(sock, 10)  # an IPv4 BND.ADDR: 4 + 4 + 2 bytes
    if reply[1] != 0:
        raise RuntimeError(f"SOCKS5 reply code {reply[1]}")


def role_connect_client(port: int, sink_port: int, nbytes: int, via_proxy: bool, via_socks: bool = False) -> None:
    start = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port))
    if via_socks:
        _socks5_connect(sock, sink_port)
    elif via_proxy:
        sock.sendall(f"CONNECT 127.0.0.1:{sink_port} HTTP/1.1\r\nHost: 127.0.0.1:{sink_port}\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head:
            byte = sock.recv(1)
            if not byte:  # the proxy closed: fail instead of looping forever on EOF
                raise RuntimeError(f"the proxy closed the connection after {head!r}")
            head += byte
        if not head.startswith(b"HTTP/1.1 200"):
            raise RuntimeError(head.decode(errors="replace"))
    _, got = send_bulk(sock, nbytes)
    elapsed = time.perf_counter() - start
    print(json.dumps({"sink_bytes": got, "seconds": elapsed}))


async def _child(*args: str) -> bytes:
    proc = await asyncio.create_subprocess_exec(sys.executable, __file__, *args, stdout=subprocess.PIPE)
    out, _ = await proc.communicate()
    if proc.returncode:
        raise RuntimeError(f"child {args} failed with {proc.returncode}")
    return out


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _percentiles(samples: list[float]) -> dict:
    ordered = sorted(samples)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {"p50_us": round(pick(0.50) * 1e6, 1), "p99_us": round(pick(0.99) * 1e6, 1)}


async def main_async(args: argparse.Namespace) -> dict:
    from anex_agent.net.dialer import OSDialer
    from anex_agent.frontends.proxy import ProxyServer
    from anex_agent.frontends.socks5 import Socks5Server

    origin = subprocess.Popen([sys.executable, __file__, "--role", "origin"], stdout=subprocess.PIPE, text=True)
    sink = subprocess.Popen([sys.executable, __file__, "--role", "sink"], stdout=subprocess.PIPE, text=True)
    try:
        origin_port = int(origin.stdout.readline())
        sink_port = int(sink.stdout.readline())
        async with ProxyServer(OSDialer(), host="127.0.0.1", port=0) as proxy, \
                Socks5Server(OSDialer(), host="127.0.0.1", port=0) as socks:
            proxy_port, socks_port = proxy.address[1], socks.address[1]
            latency = {"direct": [], "proxy": []}
            for _ in range(args.rounds):
                for name, port, via in (("direct", origin_port, False), ("proxy", proxy_port, True)):
                    out = await _child("--role", "latency", "--port", str(port), "--origin-port", str(origin_port),
                                       "--requests", str(args.requests), *(["--via-proxy"] if via else []))
                    latency[name] += json.loads(out)
            throughput = {"direct": [], "connect": [], "socks5": []}
            proxy_cpu = {"connect": [], "socks5": []}  # this process's CPU seconds per round: the proxy's work
            nbytes = args.mb * (1 << 20)
            variants = [("direct", sink_port, []), ("connect", proxy_port, ["--via-proxy"]),
                        ("socks5", socks_port, ["--via-socks"])]
            for round_ in range(args.rounds):
                # the order turns each round, so that no variant always runs first or last
                for name, port, via in variants[round_ % 3:] + variants[:round_ % 3]:
                    cpu_before = _cpu_seconds()
                    out = json.loads(await _child("--role", "connect", "--port", str(port), "--origin-port",
                                                  str(sink_port), "--bytes", str(nbytes), *via))
                    if name in proxy_cpu:
                        proxy_cpu[name].append(_cpu_seconds() - cpu_before)
                    if out["sink_bytes"] != nbytes:
                        raise RuntimeError(f"{name}: sink counted {out['sink_bytes']} of {nbytes} bytes")
                    throughput[name].append(nbytes / out["seconds"] / 1e6)
    finally:
        origin.terminate()
        sink.terminate()
        origin.wait()
        sink.wait()

    direct, proxied = _percentiles(latency["direct"]), _percentiles(latency["proxy"])
    connect = statistics.median(throughput["connect"])
    socks5 = statistics.median(throughput["socks5"])
    return {
        "benchmark": "proxy_loopback",
        "cpus": os.cpu_count(),
        "latency_requests_per_variant": len(latency["direct"]),
        "latency_direct": direct,
        "latency_proxy": proxied,
        "added_latency": {
            "p50_us": round(proxied["p50_us"] - direct["p50_us"], 1),
            "p99_us": round(proxied["p99_us"] - direct["p99_us"], 1),
        },
        "connect_bytes_per_round": nbytes,
        "connect_throughput_MBps": {
            "direct_median": round(statistics.median(throughput["direct"]), 1),
            "connect_median": round(connect, 1),
            "socks5_median": round(socks5, 1),
            "connect_runs": [round(x, 1) for x in throughput["connect"]],
            "socks5_runs": [round(x, 1) for x in throughput["socks5"]],
        },
        "connect_over_direct_median": round(connect / statistics.median(throughput["direct"]), 3),
        "socks5_over_connect_median": round(socks5 / connect, 3),
        "proxy_cpu_seconds_per_GB_median": {
            name: round(statistics.median(values) / (nbytes / 1e9), 3) for name, values in proxy_cpu.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["bench", "origin", "sink", "latency", "connect"], default="bench")
    parser.add_argument("--port", type=int)
    parser.add_argument("--origin-port", type=int)
    parser.add_argument("--bytes", type=int)
    parser.add_argument("--via-proxy", action="store_true")
    parser.add_argument("--via-socks", action="store_true")
    parser.add_argument("--requests", type=int, default=2000, help="keep-alive requests per variant and round")
    parser.add_argument("--mb", type=int, default=512, help="MiB per CONNECT / SOCKS5 round")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.role == "origin":
        role_origin()
    elif args.role == "sink":
        role_sink()
    elif args.role == "latency":
        role_latency_client(args.port, args.origin_port, args.requests, args.via_proxy)
    elif args.role == "connect":
        role_connect_client(args.port, args.origin_port, args.bytes, args.via_proxy, args.via_socks)
    else:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
