"""``anex-agent demo [--check]``: a whole mesh on this machine, every path checked, a table printed.

Builds (root; network namespaces, see :mod:`anex_agent.testing.mesh`): a cluster namespace
with an HTTP service and a DNS server that knows ``echo.default.svc.cluster.local``, the
coordinator and the gateway (``anex-agent coordinator|gateway``, with its WebSocket relay), and
one node per entry of :data:`NODE_KINDS` (``anex-agent daemon`` with a ``GW_TUNNEL_18080``): a
native node on wireguard-go; a native node whose namespace drops every outgoing UDP datagram
(as RunPod and many corporate networks do), which must find the WebSocket path by itself
(``ANEX_PATH=auto``); and an unprivileged one (nobody, no capabilities: the built-in userspace
engine with its own TCP/IP stack). Then, per node:

* ``path``    the agent is on the path its kind expects (``udp``, or ``websocket`` for the UDP-blocked node)

* ``proxy``   GET http://echo.default.svc.cluster.local:8080/ through 127.0.0.1:3128 (name resolved over the mesh)
* ``post``    POST 1 MiB through the proxy, echoed back intact
* ``connect`` CONNECT echo.default.svc.cluster.local:8080 through the proxy
* ``tunnel``  GET http://127.0.0.1:18080/ (GW_TUNNEL_18080 -> the service)
* ``inbound`` the cluster GETs a workload port at the node's mesh address

and then, from the coordinator (:mod:`anex_agent.demo.observe`, as the admin):

* ``heartbeat`` the node is ``ready`` there, with its address and the engine/path of its last heartbeat
* ``telemetry`` ``GET /v1/nodes/{id}/telemetry`` has the node's telemetry block with a health verdict
* ``metrics``   the coordinator's ``/metrics`` carries the node's ``anex_*`` series (``node="<name>"``)

waiting up to ``TELEMETRY_WAIT`` seconds for them (the demo's coordinator tells nodes to
heartbeat every ``HEARTBEAT_INTERVAL`` seconds). Then it provisions a machine from the fake
Vast.AI (:mod:`anex_agent.demo.provision`: ``provision``, ``proxy``, ``delete``) and, where the
control-plane programs are built, runs the user guide's example pod through a real control
plane (started on a thread while the mesh is checked) and ``anex-agent virtual-node``
(:mod:`anex_agent.demo.kubernetes`: ``scheduled``, ``running``, ``logs``, ``exec``,
``succeeded``); where they are not, it says so in one line and leaves those rows out. Prints ``node | engine | path | handshake |
check | result``, then the coordinator's view of each node (state, address, engine, path,
NVML state, GPUs, CPU, memory, telemetry age, health verdict and first reason), and tears
everything down. With ``--check`` the exit status is 1 when any check failed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path

TUNNEL_PORT = 18080
INBOUND_PORT = 8090
HEARTBEAT_INTERVAL = 1.0  # seconds; the coordinator's --heartbeat-interval, so telemetry arrives soon
TELEMETRY_WAIT = 20.0  # seconds for every node's telemetry and fleet series (refreshed every 5 s there)


@dataclass(frozen=True)
class NodeKind:
    """One kind of node the demo runs: its agent's environment, whether its namespace drops
    outgoing UDP, the path its agent must end up on, and whether it is ``unprivileged``: the
    agent runs as nobody with no capabilities (no TUN device, no NET_ADMIN), as in a rented
    container; ``auto`` then picks the built-in userspace engine, whose own TCP/IP stack serves
    the proxy, the forwards and the inbound port."""

    label: str
    env: dict[str, str]
    block_udp: bool = False
    path: str = "udp"
    unprivileged: bool = False


NODE_KINDS: tuple[NodeKind, ...] = (
    NodeKind("native", {"ANEX_ENGINE": "wireguard-go"}),
    NodeKind("udp-blocked", {"ANEX_ENGINE": "wireguard-go", "ANEX_PATH": "auto"}, block_udp=True, path="websocket"),
    NodeKind("unprivileged", {"ANEX_ENGINE": "auto", "ANEX_INBOUND_PORTS": str(INBOUND_PORT)}, unprivileged=True),
)


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
    out = ns.run([sys.executable, "-m", "anex_agent.testing.probe_client", *args], check=False, timeout=timeout)
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


def path_check(node, expected: str) -> tuple[bool, str]:
    """Whether the agent is on the ``expected`` path, with the reason it gives."""
    try:
        status = node.status()
    except Exception as err:  # report, do not crash the table
        return False, str(err)
    path = status.get("path")
    reason = (status.get("path_choice") or {}).get("reason", "")
    return path == expected, f"{path}: {reason}"[:160]


def run_checks(mesh, node, expected_path: str = "udp") -> list[tuple[str, bool, str]]:
    from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME

    url = f"http://{SERVICE_NAME}:{HTTP_PORT}"
    proxy = "127.0.0.1:3128"
    checks = [
        ("path", path_check(node, expected_path)),
        ("proxy", _verdict(_client(node.ns, "get", f"{url}/demo", "--proxy", proxy))),
        ("post", _verdict(_client(node.ns, "get", f"{url}/upload", "--proxy", proxy, "--body-size", str(1 << 20)))),
        ("connect", _verdict(_client(node.ns, "connect", f"{SERVICE_NAME}:{HTTP_PORT}", "--proxy", proxy, "--path", "/connect"))),
        ("tunnel", _verdict(_client(node.ns, "get", f"http://127.0.0.1:{TUNNEL_PORT}/tunnel"))),
    ]
    server = node.ns.popen(
        [sys.executable, "-m", "anex_agent.testing.services", "http", "--listen", f"0.0.0.0:{INBOUND_PORT}", "--name", "workload"],
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


def coordinator_checks(summary: dict | None, error: str | None, wait: float) -> list[tuple[str, bool, str]]:
    """``heartbeat``, ``telemetry`` and ``metrics`` checks from a node's summary of
    :func:`anex_agent.demo.observe.summarize` (``summary`` None: ``error`` says why there is none)."""
    if summary is None:
        why = error or "the coordinator was not asked"
        return [("heartbeat", False, why), ("telemetry", False, why), ("metrics", False, why)]
    errors = "; ".join(summary.get("errors") or [])
    state = summary.get("state")
    if state == "ready":
        heartbeat = (True, f"ready at the coordinator, {summary.get('address')}, {summary.get('engine') or '?'}/{summary.get('path') or '?'}")
    else:
        heartbeat = (False, f"state {state or 'unknown'} at the coordinator" + (f": {errors}" if errors else ""))
    if summary.get("has_telemetry") and summary.get("verdict") in ("healthy", "degraded", "unhealthy"):
        gpus = summary.get("gpu_count")
        telemetry = (True, f"{summary['verdict']}, nvml {summary.get('nvml') or '?'}, {gpus if gpus is not None else '?'} GPUs, "
                           f"sampled {_seconds(summary.get('telemetry_age'))} ago")
    else:
        telemetry = (False, f"no telemetry with a health verdict within {wait:.0f} s" + (f": {errors}" if errors else ""))
    series = summary.get("series") or []
    missing = summary.get("missing_series") or []
    name = summary.get("name") or "?"
    if missing:
        metrics = (False, f"/metrics lacks {', '.join(missing)} with node=\"{name}\"" + (f": {errors}" if errors else ""))
    else:
        metrics = (True, f"{len(series)} series with node=\"{name}\" on /metrics")
    return [("heartbeat", *heartbeat), ("telemetry", *telemetry), ("metrics", *metrics)]


def view_cells(label: str, summary: dict | None) -> tuple[str, ...]:
    """One row of the coordinator's-view table."""
    s = summary or {}
    verdict = s.get("verdict") if s.get("has_telemetry") else None
    health = "-" if not verdict else verdict + (f": {s['first_reason']}" if s.get("first_reason") else "")
    cpu = f"{s['cpu_pct']:.1f} %" if isinstance(s.get("cpu_pct"), (int, float)) else "-"
    mem = f"{_gib(s.get('mem_used_bytes'))} / {_gib(s.get('mem_total_bytes'))}" if s.get("mem_total_bytes") else "-"
    gpus = s.get("gpu_count")
    return (
        label, s.get("state") or "-", s.get("address") or "-", s.get("engine") or "-", s.get("path") or "-",
        s.get("nvml") or "-", "-" if gpus is None else str(gpus), cpu, mem,
        f"{_seconds(s.get('telemetry_age'))} ago" if s.get("telemetry_age") is not None else "none", health,
    )


VIEW_HEADERS = ("node", "state", "address", "engine", "path", "nvml", "gpus", "cpu", "mem used", "telemetry", "health")


def _seconds(value: float | None) -> str:
    return "?" if value is None else f"{value:.1f} s"


def _gib(value: int | None) -> str:
    return "?" if value is None else f"{value / (1 << 30):.1f} GiB"


def print_table(headers: tuple[str, ...], cells: list[tuple[str, ...]]) -> None:
    widths = [max(len(h), *(len(c[i]) for c in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip())
    print("  ".join("-" * w for w in widths))
    for c in cells:
        print("  ".join(v.ljust(w) for v, w in zip(c, widths)).rstrip())


def _check_cells(rows: list[Row]) -> list[tuple[str, ...]]:
    return [(r.node, r.engine, r.path, r.handshake, r.check, ("ok" if r.ok else "FAIL") + f"  {r.detail}") for r in rows]


def _status_row(label: str, node, check: str, ok: bool, detail: str) -> Row:
    """A row whose engine, path and handshake columns come from the agent's ``/status`` now."""
    try:
        status = node.status()
    except Exception:  # the agent is gone: the row still says what was checked
        status = {}
    age = status.get("last_handshake_age")
    return Row(label, status.get("engine", "?"), status.get("path", "?"), f"{age:.0f} s ago" if age is not None else "never", check, ok, detail)


def observe_nodes(mesh, started: list[tuple[str, object, dict]]) -> tuple[dict[str, dict | None], str | None]:
    """The coordinator's summaries per node label (None where there is none), and an error if asking failed."""
    ids: dict[str, str] = {}
    for label, node, status in started:
        if status.get("node_id"):
            ids[label] = status["node_id"]
    summaries: dict[str, dict | None] = {label: None for label, _node, _status in started}
    if not ids:
        return summaries, "the agents' /status gave no node id"
    names = {ids[label]: node.env.get("ANEX_NODE_NAME", label) for label, node, _status in started if label in ids}
    try:
        observed = mesh.observe(names, TELEMETRY_WAIT)
    except Exception as err:
        return summaries, str(err)
    for label, node_id in ids.items():
        summaries[label] = observed.get("nodes", {}).get(node_id)
    return summaries, None


def _provision_rows(mesh, provider) -> list[Row]:
    """Provision through POST /v1/provisions, check the proxy of the machine, delete it (docs/demo.md)."""
    from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME
    from anex_agent.demo.provision import provision_checks

    def proxy(node) -> tuple[bool, str]:
        return _verdict(_client(node.ns, "get", f"http://{SERVICE_NAME}:{HTTP_PORT}/provisioned", "--proxy", "127.0.0.1:3128"))

    checks, status = provision_checks(mesh, provider, proxy)
    age = status.get("last_handshake_age")
    return [Row("provisioned", status.get("engine", "?"), status.get("path", "?"),
                f"{age:.0f} s ago" if age is not None else "-", name, ok, detail) for name, ok, detail in checks]


def _kubernetes_rows(mesh, provider, cp, started, workdir: Path) -> list[Row]:
    """The example pod through the control plane and the virtual node (docs/demo.md, *Kubernetes*)."""
    from anex_agent.demo.kubernetes import CHECKS, kubernetes_checks

    try:
        started.result()
    except Exception as err:  # every row fails, saying why
        why = f"the control plane did not start: {str(err).splitlines()[0][:200]}"
        return [Row("kubernetes", "-", "-", "-", name, False, why) for name in CHECKS]
    checks, status = kubernetes_checks(mesh, provider, cp, workdir)
    age = status.get("last_handshake_age")
    return [Row("kubernetes", status.get("engine", "-"), status.get("path", "-"),
                f"{age:.0f} s ago" if age is not None else "-", name, ok, detail) for name, ok, detail in checks]


def main(args: argparse.Namespace) -> int:
    from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, Mesh
    from anex_agent.demo.provision import SimulatedProvider
    from anex_agent.demo import kubernetes
    from anex_agent.testing.netlab import missing_prerequisites
    from anex_agent.errors import NotSupported

    reason = missing_prerequisites("wireguard-go", "nft", "socat", "wg")
    if reason:  # the CLI prints it after "anex-agent demo: "
        raise NotSupported(f"{reason}; run it as root on Linux with wireguard-go, nftables, socat and wg "
                           "(bash scripts/demo installs them)")
    workdir = Path(args.keep_logs) if args.keep_logs else Path(tempfile.mkdtemp(prefix="anex-demo-"))
    rows: list[Row] = []
    started = time.monotonic()
    failed_setup: str | None = None
    views: list[tuple[str, ...]] = []
    print(f"anex-agent demo: building the mesh in network namespaces (logs in {workdir})", flush=True)
    mesh = Mesh(workdir)
    provider = SimulatedProvider(mesh)
    kube_reason = kubernetes.skip_reason()
    executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="demo-control-plane")
    cp = cp_started = None
    if kube_reason:
        print(f"anex-agent demo: no Kubernetes rows: {kube_reason}", flush=True)
    else:  # started now, ready by the time the mesh is checked
        cp, cp_started = kubernetes.start_control_plane(workdir / "kube", executor)
    try:
        mesh.build_network()
        mesh.start_coordinator(heartbeat_interval=HEARTBEAT_INTERVAL, extra_env=provider.start())
        mesh.start_gateway()
        print("anex-agent demo: coordinator and gateway up; starting nodes", flush=True)
        started_nodes: list[tuple[str, object, dict]] = []
        for kind in NODE_KINDS:
            node = mesh.add_node_namespace()
            label = f"{kind.label}-{node.index}"
            env = mesh.agent_env(node, **kind.env, **{f"GW_TUNNEL_{TUNNEL_PORT}": f"{SERVICE_NAME}:{HTTP_PORT}"})
            try:
                if kind.block_udp:
                    mesh.block_udp(node)
                mesh.start_agent(node, env, unprivileged=kind.unprivileged)
                status = node.status()
            except Exception as err:
                rows.append(Row(label, kind.env.get("ANEX_ENGINE", "?"), kind.env.get("ANEX_PATH", "udp"), "-", "start", False, str(err).splitlines()[0][:200]))
                continue
            started_nodes.append((label, node, status))
            for name, ok, detail in run_checks(mesh, node, kind.path):
                rows.append(_status_row(label, node, name, ok, detail))
        if started_nodes:
            print("anex-agent demo: paths checked; asking the coordinator for heartbeats and telemetry", flush=True)
            summaries, error = observe_nodes(mesh, started_nodes)
            for label, node, _status in started_nodes:
                for name, ok, detail in coordinator_checks(summaries[label], error, TELEMETRY_WAIT):
                    rows.append(_status_row(label, node, name, ok, detail))
                views.append(view_cells(label, summaries[label]))
        print("anex-agent demo: provisioning a machine from the simulated provider (a fake Vast.AI)", flush=True)
        rows.extend(_provision_rows(mesh, provider))
        if cp is not None:
            print("anex-agent demo: the example pod through a local control plane and the virtual node", flush=True)
            rows.extend(_kubernetes_rows(mesh, provider, cp, cp_started, workdir / "kube"))
    except Exception as err:
        failed_setup = f"{type(err).__name__}: {err}"
    finally:
        if cp is not None:
            cp_started.cancel()
            wait([cp_started])  # a start still under way ends (ready or failed) before its programs are stopped
            cp.close()
        executor.shutdown()
        mesh.close()
        provider.stop()
    print()
    print_table(("node", "engine", "path", "handshake", "check", "result"), _check_cells(rows))
    print()
    if views:
        print("the coordinator's view of each node:")
        print_table(VIEW_HEADERS, views)
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
