"""Start to first proxied answer: how long after ``anex-agent daemon`` starts the workload's first
request through the proxy gets its answer from the cluster, over many starts.

Needs root, wireguard-go and nftables. Builds the demo mesh (:mod:`anex_agent.testing.mesh`:
coordinator, gateway, a cluster service) once; then each start is a fresh node (its own
namespace, state dir and join token; ``ANEX_PATH=udp`` by default: with ``auto`` and a gateway
that offers a relay the agent first probes UDP with a handshake, which succeeds only once the
gateway knows the node, so the tunnel's first initiation never races the gateway) whose agent
is started while a client in the node's
namespace asks ``GET http://echo.default.svc.cluster.local:8080/`` through the agent's proxy
(127.0.0.1:3128) every 20 ms until it gets a 200; the time from the agent's start to that
answer is the sample. The agent is stopped before the next start.

``--before PATH``: a source tree of another version (``git archive <commit> | tar -x -C PATH``)
whose agent runs in turn with this one, start by start, on the same mesh; both are reported side
by side (p50, p99, max, and how many starts took 5 s or more: a first handshake that waited for
WireGuard's REKEY_TIMEOUT). ``--late-gateway`` pauses the gateway (SIGSTOP; its hub keeps
running) from each agent's start until the agent's status API answers (its tunnel is up and its
first initiation sent), so that the gateway always learns of the node after that initiation
(``resumed_to_answer`` is then reported too); without it the race is left to chance.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, Mesh, anex_argv  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402

CLIENT = r"""
import socket, sys, time
started, host, port = float(sys.argv[1]), sys.argv[2], int(sys.argv[3])
request = f"GET http://{host}:{port}/first HTTP/1.1\r\nHost: {host}:{port}\r\nConnection: close\r\n\r\n".encode()
end = started + 60
while time.monotonic() < end:
    try:
        with socket.create_connection(("127.0.0.1", 3128), timeout=10) as s:
            s.settimeout(10)
            s.sendall(request)
            if s.recv(64).startswith(b"HTTP/1.1 200"):
                print(round(time.monotonic() - started, 3))
                sys.exit(0)
    except OSError:
        pass
    time.sleep(0.02)
print("nan")
"""


def one_start(mesh: Mesh, argv: list[str], extra_env: dict[str, str], cwd: Path, engine: str, path: str,
              late: bool) -> tuple[float, float | None]:
    """One fresh node: (seconds from the agent's start to the first proxied answer, seconds from
    the gateway's resumption to it when ``late``)."""
    node = mesh.add_node_namespace()
    env = {**mesh.agent_env(node, ANEX_ENGINE=engine, ANEX_PATH=path), **extra_env}
    resumed: list[float] = []
    gateway = mesh.gateway_proc

    def resume_after_first_initiation() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # the status API comes after the data plane: initiation sent
            try:
                node.status()
                break
            except Exception:
                time.sleep(0.05)
        resumed.append(time.monotonic())
        os.kill(gateway.pid, signal.SIGCONT)

    started = time.monotonic()
    if late:
        os.kill(gateway.pid, signal.SIGSTOP)
    node.env = env
    node.proc = node.ns.popen([*argv, "daemon"], stdout=open(node.log_path, "ab", buffering=0),
                              stderr=subprocess.STDOUT, env=env, cwd=cwd)
    waker = threading.Thread(target=resume_after_first_initiation, daemon=True) if late else None
    try:
        if waker is not None:
            waker.start()
        out = node.ns.run([sys.executable, "-c", CLIENT, str(started), SERVICE_NAME, str(HTTP_PORT)],
                          check=False, timeout=90).stdout.strip()
        answer = float(out or "nan")
        if waker is not None:
            waker.join(60)
        return answer, (round(started + answer - resumed[0], 3) if resumed else None)
    finally:
        os.kill(gateway.pid, signal.SIGCONT)
        mesh.stop_agent(node)
        node.ns.close()


def summary(samples: list[float]) -> dict:
    ok = sorted(s for s in samples if s == s)
    if not ok:
        return {"starts": len(samples), "answered": 0}
    return {"starts": len(samples), "answered": len(ok), "p50_s": round(statistics.median(ok), 3),
            "p99_s": round(ok[min(len(ok) - 1, int(len(ok) * 0.99))], 3), "max_s": ok[-1], "min_s": ok[0],
            "took_5s_or_more": sum(1 for s in ok if s >= 5.0)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--before", type=Path, help="source tree of the version to compare with")
    parser.add_argument("--engine", default="wireguard-go", help="ANEX_ENGINE of the nodes")
    parser.add_argument("--path", default="udp", help="ANEX_PATH of the nodes (udp: no probe before the tunnel)")
    parser.add_argument("--late-gateway", action="store_true")
    args = parser.parse_args()
    doc: dict = {"benchmark": "bench_first_answer", "engine": args.engine, "path": args.path, "late_gateway": args.late_gateway}
    reason = missing_prerequisites("wireguard-go", "wg", "nft")
    if reason:
        doc["skipped"] = reason
        print(json.dumps(doc, indent=2))
        return 0
    versions = {"after": (anex_argv(), {}, ROOT)}
    if args.before is not None:
        before = args.before.resolve()
        versions["before"] = ([sys.executable, "-m", "anex_agent"], {"PYTHONPATH": str(before)}, before)
    samples: dict[str, list[float]] = {name: [] for name in versions}
    after_resume: dict[str, list[float]] = {name: [] for name in versions}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anex-first-") as workdir, Mesh(Path(workdir)) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        for _ in range(args.starts):
            for name, (argv, env, cwd) in versions.items():  # interleaved: both see the same machine
                answer, since_resume = one_start(mesh, argv, env, cwd, args.engine, args.path, args.late_gateway)
                samples[name].append(answer)
                if since_resume is not None:
                    after_resume[name].append(since_resume)
    doc.update({name: summary(values) for name, values in samples.items()})
    if args.late_gateway:
        doc["resumed_to_answer"] = {name: summary(values) for name, values in after_resume.items()}
    doc["samples"] = samples
    doc["seconds"] = round(time.perf_counter() - started, 1)
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
