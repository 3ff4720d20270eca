"""Loopback bulk throughput: our GW_TUNNEL forwarder vs socat vs a direct connection.

One run, same machine, side by side. A sink process counts bytes and answers the
count after EOF (so the half-close goes through the forwarder too); a client process
sends ``--mb`` MiB and measures from connect to the count's arrival. The forwarder
under test runs in this process (asyncio, :class:`ForwardManager` with the OS dialer);
socat runs as ``socat TCP-LISTEN:P,reuseaddr,fork TCP:127.0.0.1:SINK`` (its default
8 KiB buffer) and again with ``-b 1048576``.
Each variant runs ``--rounds`` times, interleaved; we report the best and the median.

Prints one JSON document. Goal: ours/socat >= 1.0.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

CHUNK = 1 << 20


def role_sink() -> None:
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    print(srv.getsockname()[1], flush=True)
    buf = bytearray(CHUNK)
    while True:
        conn, _ = srv.accept()
        total = 0
        while n := conn.recv_into(buf):
            total += n
        conn.sendall(total.to_bytes(8, "big"))
        conn.close()


def send_bulk(sock: socket.socket, nbytes: int) -> tuple[int, int]:
    """Send ``nbytes`` to a sink (role_sink), half-close, and read its count.

    Returns (bytes sent, bytes the sink says it received; -1 when it did not say).
    """
    data = memoryview(os.urandom(CHUNK))
    sent = 0
    while sent < nbytes:
        n = min(CHUNK, nbytes - sent)
        sock.sendall(data[:n])
        sent += n
    sock.shutdown(socket.SHUT_WR)
    reply = b""
    while len(reply) < 8 and (part := sock.recv(8 - len(reply))):
        reply += part
    return sent, int.from_bytes(reply, "big") if len(reply) == 8 else -1


def role_client(port: int, nbytes: int) -> None:
    start = time.perf_counter()
    sock = socket.create_connection(("127.0.0.1", port))
    sent, got = send_bulk(sock, nbytes)
    elapsed = time.perf_counter() - start
    print(json.dumps({"bytes": sent, "sink_bytes": got, "seconds": elapsed}), flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def wait_listening(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _, w = await asyncio.open_connection("127.0.0.1", port)
            w.close()
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def run_client(port: int, nbytes: int) -> float:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--role", "client", "--port", str(port), "--bytes", str(nbytes),
        stdout=subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    result = json.loads(out)
    if result["sink_bytes"] != nbytes:
        raise RuntimeError(f"sink counted {result['sink_bytes']} bytes, client sent {nbytes}")
    return nbytes / result["seconds"] / 1e6  # MB/s


async def main_async(args: argparse.Namespace) -> dict:
    from anex_agent.net.dialer import OSDialer
    from anex_agent.frontends.forward import running_forwards
    from anex_agent.wire.nodes import TunnelSpec

    sink = subprocess.Popen([sys.executable, __file__, "--role", "sink"], stdout=subprocess.PIPE, text=True)
    socats: list[subprocess.Popen] = []
    try:
        sink_port = int(sink.stdout.readline())
        ours_port = free_port()
        variants = {"direct": sink_port}
        if shutil.which("socat"):
            # the reference as the brief runs it (socat's default 8 KiB buffer), and socat
            # with a 1 MiB buffer, so the comparison does not rest on socat's defaults
            for name, extra in (("socat", []), ("socat_b1m", ["-b", str(1 << 20)])):
                socat_port = free_port()
                socats.append(subprocess.Popen(
                    ["socat", *extra, f"TCP-LISTEN:{socat_port},bind=127.0.0.1,reuseaddr,fork", f"TCP:127.0.0.1:{sink_port}"]
                ))
                await wait_listening(socat_port)
                variants[name] = socat_port
        variants["ours"] = ours_port
        nbytes = args.mb * (1 << 20)
        results: dict[str, list[float]] = {k: [] for k in variants}
        spec = TunnelSpec(listen_port=ours_port, target=f"127.0.0.1:{sink_port}")
        async with running_forwards(OSDialer(), [spec]):
            for _ in range(args.rounds):
                for name, port in variants.items():
                    results[name].append(await run_client(port, nbytes))
    finally:
        for socat in socats:
            socat.terminate()
            socat.wait()
        sink.terminate()
        sink.wait()

    def summary(values: list[float]) -> dict:
        return {"best_MBps": round(max(values), 1), "median_MBps": round(statistics.median(values), 1)}

    report = {
        "benchmark": "forward_loopback_bulk",
        "bytes_per_round": nbytes,
        "rounds": args.rounds,
        "splice": hasattr(os, "splice"),
        "cpus": os.cpu_count(),
        "results": {name: summary(vals) for name, vals in results.items()},
    }
    ours = statistics.median(results["ours"])
    if "socat" in results:
        report["ours_over_socat_median"] = round(ours / statistics.median(results["socat"]), 3)
        report["ours_over_socat_best"] = round(max(results["ours"]) / max(results["socat"]), 3)
        report["ours_over_socat_b1m_median"] = round(ours / statistics.median(results["socat_b1m"]), 3)
    else:
        report["socat"] = "not installed"
    report["ours_over_direct_median"] = round(ours / statistics.median(results["direct"]), 3)
    report["goal"] = "ours/socat >= 1.0"
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--role", choices=["bench", "sink", "client"], default="bench")
    parser.add_argument("--port", type=int)
    parser.add_argument("--bytes", type=int)
    parser.add_argument("--mb", type=int, default=1024, help="MiB per round (default 1024)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.role == "sink":
        role_sink()
    elif args.role == "client":
        role_client(args.port, args.bytes)
    else:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        print(json.dumps(asyncio.run(main_async(args)), indent=2))


if __name__ == "__main__":
    main()
