"""``anex-agent demo [--check]``: a whole mesh on this machine, every path checked, a table printed.

Builds (root; network namespaces, see :mod:`anex_agent.demo.mesh`): a cluster namespace
with an HTTP service and a DNS server that knows ``echo.default.svc.cluster.local``, the
coordinator and the gateway (``anex-agent coordinator|gateway``), and one node per entry of
:data:`NODE_KINDS` (``anex-agent daemon`` with a ``GW_TUNNEL_18080``). Then, per node:

* ``proxy``   GET http://echo.default.svc.cluster.local:8080/ through 127.0.0.1:3128 (name resolved over the mesh)
* ``post``    POST 1 MiB through the proxy, echoed back intact
* ``connect`` CONNECT echo.default.svc.cluster.local:8080 through the proxy
* ``tunnel``  GET http://127.0.0.1:18080/ (GW_TUNNEL_18080 -> the service)
* ``inbound`` the cluster GETs a workload port at the node's mesh address

prints ``node | engine | path | handshake | check | result`` and tears everything down.
With ``--check`` the exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TUNNEL_PORT = 18080
INBOUND_PORT = 8090


@dataclass(frozen=True)
class NodeKind:
    """One kind of node the demo runs. Later issues add the userspace and WebSocket kinds here:
    ``NodeKind("userspace", {"ANEX_ENGINE": "userspace"})`` and
    ``NodeKind("websocket", {"ANEX_ENGINE": "userspace", "ANEX_PATH": "websocket"})``."""

    label: str
    env: dict[str, str]


NODE_KINDS: tuple[NodeKind, ...] = (NodeKind("native", {"ANEX_ENGINE": "wireguard-go"}),)


@dataclass
class Row:
    node: str
    engine: str
    path: str
    handshake: str
    check: str
    ok: bool
    detail: str


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--check", action="store_true", help="exit 1 when any check fails")
    parser.add_argument("--keep-logs", metavar="DIR", help="write the processes' logs here (default: a temporary directory, removed)")


def _client(ns, *args: str, timeout: float = 30) -> dict:
    out = ns.run([sys.executable, "-m", "anex_agent.demo.client", *args], check=False, timeout=timeout)
    try:
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": (out.stderr.strip().splitlines() or ["client failed"])[-1]}


def _verdict(result: dict, expect_service: str = "echo") -> tuple[bool, str]:
    if "error" in result:
        return False, result["error"]
    if result.get("status") != 200:
        return False, f"HTTP {result.get('status')}: {result.get('body', '')[:120]}"
    if "sent_sha256" in result:
        ok = result["sha256"] == result["sent_sha256"]
        return ok, f"{result['length']} bytes echoed" if ok else "body came back different"
    try:
        body = json.loads(result["body"])
    except ValueError:
        return False, "not the echo service's answer"
    return body.get("service") == expect_service, f"{body.get('service')} answered {body.get('path')}"


def run_checks(mesh, node) -> list[tuple[str, bool, str]]:
    from anex_agent.demo.mesh import HTTP_PORT, SERVICE_NAME

    url = f"http://{SERVICE_NAME}:{HTTP_PORT}"
    proxy = "127.0.0.1:3128"
    checks = [
        ("proxy", _verdict(_client(node.ns, "get", f"{url}/demo", "--proxy", proxy))),
        ("post", _verdict(_client(node.ns, "get", f"{url}/upload", "--proxy", proxy, "--body-size", str(1 << 20)))),
        ("connect", _verdict(_client(node.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", proxy, "--path", "/connect"))),
        ("tunnel", _verdict(_client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_PORT}/tunnel"))),
    ]
    server = node.ns.popen(
        [sys.executable, "-m", "anex_agent.demo.services", "http", "--listen", f"0.0.0.0:{INBOUND_PORT}", "--name", "workload"],
        stdout=subprocess.PIPE, text=True,
    )
    try:
        server.stdout.readline()
        address = node.status()["address"]
        checks.append(("inbound", _verdict(_client(mesh.cluster, "get", f"http://{address}:{INBOUND_PORT}/inbound"), "workload")))
    except Exception as err:  # report, do not crash the table
        checks.append(("inbound", (False, str(err))))
    finally:
        server.terminate()
        server.wait(timeout=10)
    return [(name, ok, detail) for name, (ok, detail) in checks]


def print_table(rows: list[Row]) -> None:
    headers = ("node", "engine", "path", "handshake", "check", "result")
    cells = [(r.node, r.engine, r.path, r.handshake, r.check, ("ok" if r.ok else "FAIL") + f"  {r.detail}") for r in rows]
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    print(line)
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)))


def main(args: argparse.Namespace) -> int:
    from anex_agent.demo.mesh import HTTP_PORT, SERVICE_NAME, Mesh
    from anex_agent.demo.netlab import missing_prerequisites
    from anex_agent.errors import ConfigError

    reason = missing_prerequisites("wireguard-go", "nft")
    if reason:
        raise ConfigError("anex-agent demo", f"{reason}; run it as root on Linux with wireguard-go and nftables (bash scripts/demo installs them)")
    workdir = Path(args.keep_logs) if args.keep_logs else Path(tempfile.mkdtemp(prefix="anex-demo-"))
    rows: list[Row] = []
    started = time.monotonic()
    failed_setup: str | None = None
    print(f"anex-agent demo: building the mesh in network namespaces (logs in {workdir})", flush=True)
    mesh = Mesh(workdir)
    try:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        print("anex-agent demo: coordinator and gateway up; starting nodes", flush=True)
        for kind in NODE_KINDS:
            node = mesh.add_node_namespace()
            env = mesh.agent_env(node, **kind.env, **{f"GW_TUNNEL_{TUNNEL_PORT}": f"{SERVICE_NAME}:{HTTP_PORT}"})
            try:
                mesh.start_agent(node, env)
                status = node.status()
            except Exception as err:
                rows.append(Row(f"{kind.label}-{node.index}", kind.env.get("ANEX_ENGINE", "?"), kind.env.get("ANEX_PATH", "udp"), "-", "start", False, str(err).splitlines()[0][:200]))
                continue
            for name, ok, detail in run_checks(mesh, node):
                status = node.status()
                age = status.get("last_handshake_age")
                rows.append(Row(f"{kind.label}-{node.index}", status.get("engine", "?"), status.get("path", "?"), f"{age:.0f} s ago" if age is not None else "never", name, ok, detail))
    except Exception as err:
        failed_setup = f"{type(err).__name__}: {err}"
    finally:
        mesh.close()
    print()
    print_table(rows)
    print()
    failures = [r for r in rows if not r.ok]
    if failed_setup:
        print(f"anex-agent demo: setting up the mesh failed: {failed_setup}")
        print(f"anex-agent demo: logs are in {workdir}")
    elapsed = time.monotonic() - started
    print(f"anex-agent demo: {len(rows) - len(failures)}/{len(rows)} checks passed in {elapsed:.1f} s; everything torn down")
    if not args.keep_logs and not failures and not failed_setup:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    bad = bool(failures or failed_setup or not rows)
    return 1 if (bad and args.check) else 0
