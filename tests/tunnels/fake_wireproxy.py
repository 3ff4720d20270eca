#!/usr/bin/env python3
"""A stand-in for the wireproxy binary (windtf/wireproxy v1.1), for supervision tests.

Takes the same flags (``-c CONFIG -i HOST:PORT``, ``-s``), refuses a config that is not
mode 0600 or lacks ``[Interface] PrivateKey`` / a ``[Peer]``, and serves ``/readyz`` and
``/metrics`` like wireproxy does (``/metrics``: a UAPI dump with keys REDACTED). It does
no WireGuard. Controlled through the directory in ``$FAKE_WIREPROXY_DIR``:

* ``starts.jsonl``: one line appended per start: pid, argv, the peers' endpoints, the
  names in its environment
* ``readyz``: what /readyz does: ``200`` (default), ``503``, ``hang`` (never answers), ``exit`` (the process exits 3)
* ``listen`` (optional; when present): like wireproxy, bind ``[http]`` and every
  ``[TCPClientTunnel]`` BindAddress (exit 1 when one is taken); each accepted connection
  gets one line ``fake-wireproxy <section> <bind address>`` and is closed
"""

import base64
import json
import os
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


def parse(text):
    sections = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("[") and line.endswith("]"):
            sections.append((line[1:-1].lower(), {}))
        elif "=" in line and sections:
            key, value = line.split("=", 1)
            sections[-1][1][key.strip().lower()] = value.strip()
        else:
            raise SystemExit(f"fake-wireproxy: bad line {raw!r}")
    return sections


def serve_banner(section, address):
    """Listen on ``address``; answer each connection with one line naming ``section``. False when taken."""
    host, _, port = address.rpartition(":")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host.strip("[]"), int(port)))
    except OSError as err:
        print(f"fake-wireproxy: cannot listen on {address}: {err.strerror}", file=sys.stderr)
        return False
    sock.listen(16)

    def loop():
        while True:
            conn, _ = sock.accept()
            with conn:
                conn.sendall(f"fake-wireproxy {section} {address}\n".encode())

    threading.Thread(target=loop, daemon=True).start()
    return True


def main(argv):
    flags = [a for a in argv if a != "-s"]  # -s (silent) takes no value
    args = dict(zip(flags[::2], flags[1::2]))
    config, info = Path(args["-c"]), args["-i"]
    control = Path(os.environ["FAKE_WIREPROXY_DIR"])
    if config.stat().st_mode & 0o077:
        print("fake-wireproxy: config readable by group/others", file=sys.stderr)
        return 1
    sections = parse(config.read_text())
    interface = [s for n, s in sections if n == "interface"]
    peers = [s for n, s in sections if n == "peer"]
    if len(interface) != 1 or "privatekey" not in interface[0] or not peers:
        print("fake-wireproxy: need one [Interface] with PrivateKey and a [Peer]", file=sys.stderr)
        return 1
    listeners = [(n, s["bindaddress"]) for n, s in sections if n in ("http", "tcpclienttunnel") and "bindaddress" in s]
    if (control / "listen").exists():
        for name, address in listeners:
            if not serve_banner(name, address):
                return 1
    with open(control / "starts.jsonl", "a") as log:
        log.write(json.dumps({"pid": os.getpid(), "argv": argv, "endpoints": [p.get("endpoint") for p in peers],
                              "listeners": [a for _, a in listeners], "env": sorted(os.environ)}) + "\n")
    started = int(time.time())

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            mode = (control / "readyz").read_text().strip() if (control / "readyz").exists() else "200"
            if self.path == "/readyz":
                if mode == "hang":
                    time.sleep(3600)
                if mode == "exit":
                    os._exit(3)
                body = json.dumps({a.strip(): started for a in interface[0].get("checkalive", "").split(",") if a.strip()})
                self.send_response(int(mode))
                self.end_headers()
                self.wfile.write(body.encode() + b"\n")
            elif self.path == "/metrics":
                lines = ["private_key=REDACTED", f"listen_port={interface[0].get('listenport', '40000')}"]
                for i, peer in enumerate(peers):
                    lines.append("public_key=" + base64.b64decode(peer["publickey"]).hex())
                    if "presharedkey" in peer:
                        lines.append("preshared_key=REDACTED")
                    lines += ["protocol_version=1"]
                    if peer.get("endpoint"):
                        lines.append(f"endpoint={peer['endpoint']}")
                    lines += [f"last_handshake_time_sec={started if i == 0 else 0}", "last_handshake_time_nsec=5",
                              f"tx_bytes={1000 + i}", f"rx_bytes={2000 + i}",
                              f"persistent_keepalive_interval={peer.get('persistentkeepalive', '0')}"]
                    lines += [f"allowed_ip={a.strip()}" for a in peer.get("allowedips", "").split(",") if a.strip()]
                self.send_response(200)
                self.end_headers()
                self.wfile.write(("\n".join(lines) + "\n").encode())
            else:
                self.send_response(404)
                self.end_headers()

    host, _, port = info.rpartition(":")
    ThreadingHTTPServer.allow_reuse_address = True
    ThreadingHTTPServer.daemon_threads = True
    ThreadingHTTPServer((host, int(port)), Handler).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
