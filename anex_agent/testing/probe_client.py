"""A small HTTP client that runs inside a namespace and prints one JSON result (demo, tests, bench).

    python -m anex_agent.testing.probe_client get URL [--proxy HOST:PORT] [--body-size N] [--method M]
    python -m anex_agent.testing.probe_client connect HOST:PORT --proxy HOST:PORT [--path /x]
    python -m anex_agent.testing.probe_client bulk HOST:PORT --bytes N [--proxy HOST:PORT] [--direction down|up]
    python -m anex_agent.testing.probe_client latency URL [--proxy HOST:PORT] [--count N]
    python -m anex_agent.testing.probe_client udp HOST:PORT [--clients N]

``get`` sends an absolute-form request through the proxy (or directly), with a generated
body of ``--body-size`` bytes for POST, and prints ``{"status", "headers", "body", "sha256"}``
(``body`` decoded when it is text, at most 4 KiB; ``sha256`` of the whole body).
``connect`` opens a CONNECT tunnel and sends a plain GET through it.
``bulk`` moves N bytes from (down) or to (up) the bulk ``source``/``sink`` service of
:mod:`anex_agent.testing.services`, optionally through a CONNECT tunnel, and prints
``{"bytes", "seconds", "mbit_s"}``.
``udp`` asks the ``udp`` echo service of :mod:`anex_agent.testing.services` from ``--clients``
sockets at once, each its own question (sent again every second until answered), and prints
``{"replies": [{"sent", "reply", "source"}, ...], "ok"}``: ``ok`` when every socket got the
answer to its own question.
Failures print ``{"error": "..."}`` and exit 1; a malformed HOST:PORT is argparse's error
(exit 2). Standard library only, on purpose, besides :mod:`anex_agent.parse` (itself
standard library only).
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import os
import select
import socket
import struct
import sys
import time

from anex_agent import parse

CHUNK = 256 * 1024
HOST_PORT = parse.arg_type(parse.host_port)


def _body(size: int) -> bytes:
    pattern = b"anex-agent-" * (size // 11 + 1)
    return pattern[:size]


def _result(resp: http.client.HTTPResponse) -> dict:
    data = resp.read()
    try:
        text = data[:4096].decode()
    except UnicodeDecodeError:
        text = ""
    return {"status": resp.status, "headers": dict(resp.getheaders()), "body": text, "length": len(data), "sha256": hashlib.sha256(data).hexdigest()}


def do_get(args) -> dict:
    from urllib.parse import urlsplit

    body = _body(args.body_size) if args.body_size else None
    method = args.method or ("POST" if body is not None else "GET")
    if args.proxy:
        host, port = parse.host_port(args.proxy)
        conn = http.client.HTTPConnection(host, port, timeout=args.timeout)
        target = args.url
    else:
        parts = urlsplit(args.url)
        conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=args.timeout)
        target = parts.path or "/"
    headers = {"Content-Type": "application/octet-stream"} if body is not None else {}
    conn.request(method, target, body=body, headers=headers)
    result = _result(conn.getresponse())
    if body is not None:
        result["sent_sha256"] = hashlib.sha256(body).hexdigest()
    conn.close()
    return result


def _tunnel(proxy: str, dest: str, timeout: float) -> socket.socket:
    host, port = parse.host_port(proxy)
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.sendall(f"CONNECT {dest} HTTP/1.1\r\nHost: {dest}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        chunk = sock.recv(4096)
        if not chunk:
            raise ConnectionError(f"proxy closed the connection; got {head!r}")
        head += chunk
    status_line = head.split(b"\r\n", 1)[0].decode()
    if " 200 " not in status_line + " ":
        rest = head.split(b"\r\n\r\n", 1)[1][:200]
        raise ConnectionError(f"CONNECT refused: {status_line}: {rest!r}")
    return sock


def do_connect(args) -> dict:
    sock = _tunnel(args.proxy, args.dest, args.timeout)
    host, _ = parse.host_port(args.dest)
    conn = http.client.HTTPConnection(host, timeout=args.timeout)
    conn.sock = sock
    conn.request("GET", args.path)
    return _result(conn.getresponse())


def do_bulk(args) -> dict:
    if args.proxy:
        sock = _tunnel(args.proxy, args.dest, args.timeout)
    else:
        sock = socket.create_connection(parse.host_port(args.dest), timeout=args.timeout)
    sock.settimeout(args.timeout)
    buf = bytearray(CHUNK)
    started = time.perf_counter()
    total = 0
    if args.direction == "down":
        sock.sendall(struct.pack("!Q", args.bytes))
        view = memoryview(buf)
        while total < args.bytes:
            n = sock.recv_into(view)
            if not n:
                break
            total += n
    else:
        payload = bytes(CHUNK)
        left = args.bytes
        while left > 0:
            sock.sendall(payload[: min(left, CHUNK)])
            left -= min(left, CHUNK)
        sock.shutdown(socket.SHUT_WR)
        answer = b""
        while len(answer) < 8:
            chunk = sock.recv(8 - len(answer))
            if not chunk:
                break
            answer += chunk
        total = struct.unpack("!Q", answer)[0] if len(answer) == 8 else 0
    seconds = time.perf_counter() - started
    sock.close()
    if total != args.bytes:
        raise ConnectionError(f"moved {total} of {args.bytes} bytes")
    return {"bytes": total, "seconds": seconds, "mbit_s": total * 8 / seconds / 1e6}


def do_latency(args) -> dict:
    """``--count`` GETs of ``url``, each on a new connection; per-request times in ms."""
    from urllib.parse import urlsplit

    parts = urlsplit(args.url)
    times = []
    for _ in range(args.count):
        started = time.perf_counter()
        if args.proxy:
            host, port = parse.host_port(args.proxy)
            conn = http.client.HTTPConnection(host, port, timeout=args.timeout)
            conn.request("GET", args.url)
        else:
            conn = http.client.HTTPConnection(parts.hostname, parts.port or 80, timeout=args.timeout)
            conn.request("GET", parts.path or "/")
        resp = conn.getresponse()
        resp.read()
        conn.close()
        if resp.status != 200:
            raise ConnectionError(f"HTTP {resp.status}")
        times.append((time.perf_counter() - started) * 1000)
    times.sort()
    pick = lambda q: times[min(len(times) - 1, int(q * len(times)))]  # noqa: E731
    return {"count": len(times), "p50_ms": pick(0.5), "p99_ms": pick(0.99), "mean_ms": sum(times) / len(times)}


def do_udp(args) -> dict:
    host, port = parse.host_port(args.dest)
    token = os.urandom(4).hex()
    socks = [socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
             for _ in range(args.clients)]
    sent = [f"{token} client {i}".encode() for i in range(args.clients)]
    replies: dict[int, tuple[bytes, str]] = {}
    deadline = time.monotonic() + args.timeout
    try:
        while len(replies) < len(socks) and time.monotonic() < deadline:
            waiting = [i for i in range(len(socks)) if i not in replies]
            for i in waiting:  # all questions out before any answer is read: the clients overlap
                socks[i].sendto(sent[i], (host, port))
            until = min(deadline, time.monotonic() + 1.0)
            while waiting and (left := until - time.monotonic()) > 0:
                readable, _, _ = select.select([socks[i] for i in waiting], [], [], left)
                for sock in readable:
                    i = socks.index(sock)
                    data, source = sock.recvfrom(65535)
                    replies[i] = (data, f"{source[0]}:{source[1]}")
                    waiting.remove(i)
    finally:
        for sock in socks:
            sock.close()
    out = [{"sent": sent[i].decode(), "reply": replies[i][0].decode(errors="replace") if i in replies else None,
            "source": replies[i][1] if i in replies else None} for i in range(len(socks))]
    return {"replies": out, "ok": all(r["reply"] is not None and r["reply"].endswith(" " + r["sent"]) for r in out)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m anex_agent.testing.probe_client")
    sub = parser.add_subparsers(dest="cmd", required=True)
    get = sub.add_parser("get")
    get.add_argument("url")
    get.add_argument("--proxy", type=HOST_PORT)
    get.add_argument("--method")
    get.add_argument("--body-size", type=int, default=0)
    con = sub.add_parser("connect")
    con.add_argument("dest", type=HOST_PORT)
    con.add_argument("--proxy", required=True, type=HOST_PORT)
    con.add_argument("--path", default="/")
    bulk = sub.add_parser("bulk")
    bulk.add_argument("dest", type=HOST_PORT)
    bulk.add_argument("--bytes", type=int, required=True)
    bulk.add_argument("--proxy", type=HOST_PORT)
    bulk.add_argument("--direction", choices=["down", "up"], default="down")
    lat = sub.add_parser("latency")
    lat.add_argument("url")
    lat.add_argument("--proxy", type=HOST_PORT)
    lat.add_argument("--count", type=int, default=200)
    dgram = sub.add_parser("udp")
    dgram.add_argument("dest", type=HOST_PORT)
    dgram.add_argument("--clients", type=int, default=1)
    for p in (get, con, bulk, lat, dgram):
        p.add_argument("--timeout", type=float, default=15.0)
    args = parser.parse_args(argv)
    try:
        result = {"get": do_get, "connect": do_connect, "bulk": do_bulk, "latency": do_latency, "udp": do_udp}[args.cmd](args)
    except (OSError, http.client.HTTPException, ValueError) as err:
        print(json.dumps({"error": f"{type(err).__name__}: {err}"}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
