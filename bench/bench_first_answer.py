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

Per version, ``phases`` splits the starts' time by the agent's own log lines (their timestamps
against the wall clock at the start, so to about a millisecond): ``first_log`` (interpreter,
imports, settings: the first line the agent logs), ``engine`` (detect chose the engine),
``joined`` (the coordinator's answer), ``path`` (the UDP path probed), ``proxy`` (the HTTP proxy
listening), ``tunnel_ready``, ``first_handshake`` (with the gateway), then ``answer``; each as p50,
p99 and max seconds from the start, and ``import_s``: ``python -X importtime`` of the daemon's
modules alone, before the starts.

Bytecode: by default the agents run with their bytecode cached (``PYTHONPYCACHEPREFIX`` in a
temporary folder, filled by the ``-X importtime`` run before the starts), as an installed
wheel ships it; ``--cold-bytecode`` keeps this environment's setting instead (with
``PYTHONDONTWRITEBYTECODE`` set, as on the build machines, every start compiles the agent's
source from a checkout: about a quarter of a start there). ``bytecode`` in the JSON says which.

``--profile DIR``: a ``py-spy record`` (raw collapsed stacks, 200 Hz) of each start into DIR,
attached as soon as the agent's interpreter runs (its first tens of milliseconds, the
interpreter's own start, are not sampled) and stopped at the first answer; the frames that
took the largest share of all starts' samples (inclusive, waiting included: shares of wall time) are added to the JSON.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
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
sys.path.insert(0, str(ROOT / "bench"))

from anex_agent.testing.mesh import HTTP_PORT, SERVICE_NAME, Mesh, anex_argv  # noqa: E402
from bench_agent_footprint import timeline  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402
from profiling import start_pyspy, top_frames  # noqa: E402

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


# phase -> what the agent's log line says when it is over (the first line that matches)
PHASES = {
    "engine": " anex_agent.agent.dataplane: engine: ",
    "joined": " anex_agent.agent: joined ",
    "path": " anex_agent.agent.path: path: ",
    "proxy": " anex_agent.frontends.proxy: HTTP proxy on ",
    "tunnel_ready": " anex_agent.agent: tunnel ready",
    "first_handshake": " anex_agent.agent.first_contact: first handshake ",
}


def phases(log: str, started_wall: float) -> dict[str, float]:
    """Seconds from ``started_wall`` to the first log line (``first_log``) and to each of :data:`PHASES`."""
    return timeline(log, started_wall, {"first_log": "", **PHASES})


def import_seconds(argv: list[str], env: dict[str, str], cwd: Path) -> dict:
    """``-X importtime`` of the modules ``anex-agent daemon`` imports before it logs: the total, and
    the own import time summed per package (``anex_agent.X`` per subpackage, others per top-level
    name), the slowest first."""
    python = argv[0] if argv[0].endswith(("python", "python3")) else sys.executable
    code = ("import anex_agent.cli, anex_agent.agent.cli_daemon, anex_agent.agent.cli_detect, "
            "anex_agent.agent.supervisor, anex_agent.agent.stopping")
    out = subprocess.run([python, "-X", "importtime", "-c", code], capture_output=True, text=True,
                         env={**os.environ, **env}, cwd=cwd, timeout=120)
    per_package: dict[str, int] = {}
    total = 0
    for line in out.stderr.splitlines():
        parts = line.split("|")
        if len(parts) != 3 or not parts[0].rpartition(":")[2].strip().isdigit():
            continue
        own, name = int(parts[0].rpartition(":")[2]), parts[2].strip()
        dotted = name.split(".")
        package = ".".join(dotted[:2]) if dotted[0] == "anex_agent" else dotted[0]
        per_package[package] = per_package.get(package, 0) + own
        total += own
    slowest = sorted(per_package.items(), key=lambda kv: -kv[1])[:15]
    return {"total_s": round(total / 1e6, 3), "own_s_by_package": {k: round(v / 1e6, 3) for k, v in slowest}}


def attach_when_python(pid: int, path: Path):
    """``py-spy record`` of ``pid`` once it runs Python (``ip netns exec`` and the script's
    ``#!`` exec in the same process first); None if it never does within 5 s."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            if os.path.basename(os.readlink(f"/proc/{pid}/exe")).startswith("python"):
                return start_pyspy(pid, path, rate=200, idle=True)
        except OSError:
            return None
        time.sleep(0.002)
    return None


def one_start(mesh: Mesh, argv: list[str], extra_env: dict[str, str], cwd: Path, engine: str, path: str,
              late: bool, profile: Path | None = None) -> tuple[float, float | None, dict[str, float]]:
    """One fresh node: (seconds from the agent's start to the first proxied answer, seconds from
    the gateway's resumption to it when ``late``, the start's :func:`phases`)."""
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

    started, started_wall = time.monotonic(), time.time()
    if late:
        os.kill(gateway.pid, signal.SIGSTOP)
    node.env = env
    node.proc = node.ns.popen([*argv, "daemon"], stdout=open(node.log_path, "ab", buffering=0),
                              stderr=subprocess.STDOUT, env=env, cwd=cwd)
    waker = threading.Thread(target=resume_after_first_initiation, daemon=True) if late else None
    spy = attach_when_python(node.proc.pid, profile) if profile is not None else None
    try:
        if waker is not None:
            waker.start()
        out = node.ns.run([sys.executable, "-c", CLIENT, str(started), SERVICE_NAME, str(HTTP_PORT)],
                          check=False, timeout=90).stdout.strip()
        answer = float(out or "nan")
        if spy is not None:
            spy.stop()
        if waker is not None:
            waker.join(60)
        return answer, (round(started + answer - resumed[0], 3) if resumed else None), phases(node.log(), started_wall)
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


def _median(values: list[float]) -> float:
    ok = [v for v in values if v == v]
    return statistics.median(ok) if ok else float("inf")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=30)
    parser.add_argument("--before", type=Path, help="source tree of the version to compare with")
    parser.add_argument("--engine", default="wireguard-go", help="ANEX_ENGINE of the nodes")
    parser.add_argument("--path", default="udp", help="ANEX_PATH of the nodes (udp: no probe before the tunnel)")
    parser.add_argument("--late-gateway", action="store_true")
    parser.add_argument("--profile", type=Path, metavar="DIR", help="py-spy each start into DIR (raw stacks)")
    parser.add_argument("--cold-bytecode", action="store_true",
                        help="keep this environment's bytecode setting (default: the agents' bytecode cached, "
                             "as an installed wheel has it)")
    args = parser.parse_args()
    doc: dict = {"benchmark": "bench_first_answer", "engine": args.engine, "path": args.path, "late_gateway": args.late_gateway}
    reason = missing_prerequisites("wireguard-go", "wg", "nft")
    if reason:
        doc["skipped"] = reason
        print(json.dumps(doc, indent=2))
        return 0
    pycache = None
    if args.cold_bytecode:
        doc["bytecode"] = ("compiled at every start (PYTHONDONTWRITEBYTECODE is set)"
                           if os.environ.get("PYTHONDONTWRITEBYTECODE") else "this environment's")
    else:
        pycache = tempfile.mkdtemp(prefix="anex-first-pyc-")
        os.chmod(pycache, 0o755)
        os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the agents, the coordinator and the gateway
        os.environ["PYTHONPYCACHEPREFIX"] = pycache
        doc["bytecode"] = "cached (PYTHONPYCACHEPREFIX, filled before the starts)"
    try:
        return run(args, doc)
    finally:
        if pycache is not None:
            shutil.rmtree(pycache, ignore_errors=True)


def run(args: argparse.Namespace, doc: dict) -> int:
    versions = {"after": (anex_argv(), {}, ROOT)}
    if args.before is not None:
        before = args.before.resolve()
        versions["before"] = ([sys.executable, "-m", "anex_agent"], {"PYTHONPATH": str(before)}, before)
    samples: dict[str, list[float]] = {name: [] for name in versions}
    after_resume: dict[str, list[float]] = {name: [] for name in versions}
    phase_samples: dict[str, dict[str, list[float]]] = {name: {} for name in versions}
    for _ in range(1 if args.cold_bytecode else 2):  # with the cache on, the first run fills it
        doc["import_s"] = {name: import_seconds(argv, env, cwd) for name, (argv, env, cwd) in versions.items()}
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="anex-first-") as workdir, Mesh(Path(workdir)) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        if args.profile is not None:
            args.profile.mkdir(parents=True, exist_ok=True)
        for index in range(args.starts):
            for name, (argv, env, cwd) in versions.items():  # interleaved: both see the same machine
                spy_to = args.profile / f"start-{name}-{index}.txt" if args.profile is not None else None
                answer, since_resume, found = one_start(mesh, argv, env, cwd, args.engine, args.path,
                                                        args.late_gateway, spy_to)
                samples[name].append(answer)
                for phase, at in {**found, "answer": answer}.items():
                    phase_samples[name].setdefault(phase, []).append(at)
                if since_resume is not None:
                    after_resume[name].append(since_resume)
    doc.update({name: summary(values) for name, values in samples.items()})
    if args.late_gateway:
        doc["resumed_to_answer"] = {name: summary(values) for name, values in after_resume.items()}
    doc["phases"] = {name: {phase: summary(values) for phase, values in sorted(per.items(), key=lambda kv: _median(kv[1]))}
                     for name, per in phase_samples.items()}
    if args.profile is not None:
        doc["profile_top_inclusive"] = {
            name: top_frames(sorted(args.profile.glob(f"start-{name}-*.txt")), limit=40, inclusive=True)
            for name in versions}
    doc["samples"] = samples
    doc["seconds"] = round(time.perf_counter() - started, 1)
    doc["loadavg"] = os.getloadavg()
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
