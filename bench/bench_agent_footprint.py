"""The agent's footprint: resident memory, steady, and the time from start to the first
answer through its proxy.

Needs root, wireguard-go and nftables. Builds the demo mesh (:mod:`anex_agent.testing.mesh`),
then starts ``anex-agent daemon`` (native engine: wireguard-go; GPU telemetry on, as by
default) in a fresh node namespace while a probe in that namespace asks the cluster's HTTP
service through the agent's proxy every 10 ms. Reported:

* ``start_to_first_proxied_answer_s``: from the agent's process start to the first 200
  through ``127.0.0.1:3128`` (joining the coordinator, engine, handshake, proxy) (goal <= 1 s);
* ``rss_mb``: the agent's ``VmRSS`` after ``--settle`` seconds of steady running (heartbeats,
  watch, telemetry), and wireguard-go's, reported apart (goal: the agent <= 60 MB);
* ``agent_private_mb``: of that, the pages of the agent's own (anonymous or written), i.e.
  without the shared libraries' code that other processes map too (``smaps_rollup``);
* ``timeline_s``: when each step of the start-up was logged, in seconds from the process
  start (imports and settings come before ``first_log``), to see where the time goes;
* the same for each of ``--runs`` fresh node namespaces; medians.

Prints one JSON document.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import CLUSTER_IP, HTTP_PORT, Mesh  # noqa: E402
from anex_agent.testing.netlab import missing_prerequisites  # noqa: E402

PROBE = r"""
import sys, time, urllib.request
url = sys.argv[1]
opener = urllib.request.build_opener(urllib.request.ProxyHandler({"http": "http://127.0.0.1:3128"}))
print("probe-ready", flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    try:
        with opener.open(url, timeout=2) as resp:
            if resp.status == 200:
                resp.read()
                print(repr(time.time()), flush=True)
                sys.exit(0)
    except Exception:
        pass
    time.sleep(0.01)
sys.exit(1)
"""


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def private_kb(pid: int) -> int:
    total = 0
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith(("Private_Clean:", "Private_Dirty:")):
            total += int(line.split()[1])
    return total


#: start-up milestones, as the agent logs them (its log format: ``%(asctime)s LEVEL logger: message``)
MILESTONES = {
    "first_log": "",
    "engine_chosen": "anex_agent.agent.dataplane: engine: ",
    "joined": "anex_agent.agent: joined ",
    "engine_running": "anex_agent.tunnels.engines.wireguard_go: wireguard-go running",
    "path_chosen": "anex_agent.agent.path: path: ",
    "proxy_listening": "anex_agent.frontends.proxy: HTTP proxy on ",
    "api_listening": "anex_agent.agent.api: agent API listening",
    "tunnel_ready": "anex_agent.agent: tunnel ready",
}
_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) ")


def timeline(log: str, started: float, milestones: dict[str, str] = MILESTONES) -> dict[str, float]:
    """Seconds from ``started`` to the first log line of each milestone (name -> what the line
    says, ``""``: any line; local-time stamps)."""
    out: dict[str, float] = {}
    for line in log.splitlines():
        stamp = _STAMP.match(line)
        if not stamp:
            continue
        at = datetime.datetime.strptime(stamp.group(1), "%Y-%m-%d %H:%M:%S,%f").timestamp()
        for name, marker in milestones.items():
            if name not in out and marker in line:
                out[name] = round(at - started, 3)
    return out


def children_named(parent: int, name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1:stat.rindex(")")]
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if ppid == parent and comm == name:
                found.append(int(entry))
    return found


def one_run(mesh: Mesh, settle: float) -> dict:
    node = mesh.add_node_namespace()
    env = mesh.agent_env(node)
    url = f"http://{CLUSTER_IP}:{HTTP_PORT}/latency"
    probe = node.ns.popen([sys.executable, "-c", PROBE, url], stdout=subprocess.PIPE, text=True)
    assert probe.stdout.readline().strip() == "probe-ready"
    started = time.time()
    mesh.start_agent(node, env, wait_ready=False)
    out, _ = probe.communicate(timeout=90)
    if probe.returncode != 0:
        raise RuntimeError(f"no proxied answer within 60 s; agent log:\n{node.log()[-3000:]}")
    first = float(out.strip().splitlines()[-1]) - started
    time.sleep(settle)
    pid = node.proc.pid
    wg = children_named(pid, "wireguard-go")
    result = {
        "start_to_first_proxied_answer_s": round(first, 3),
        "agent_rss_mb": round(rss_kb(pid) / 1024, 1),
        "agent_private_mb": round(private_kb(pid) / 1024, 1),
        "wireguard_go_rss_mb": round(sum(rss_kb(p) for p in wg) / 1024, 1) if wg else None,
        "engine": node.status()["engine"],
        "timeline_s": timeline(node.log(), started),
    }
    mesh.stop_agent(node)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3, help="fresh node namespaces, one agent each (default 3)")
    parser.add_argument("--settle", type=float, default=15.0, help="seconds of steady running before RSS (default 15)")
    args = parser.parse_args()
    reason = missing_prerequisites("wireguard-go", "nft")
    if reason:
        print(json.dumps({"benchmark": "agent-footprint", "skipped": reason}))
        return 0
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="anex-bench-footprint-"))
    with Mesh(workdir) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        runs = [one_run(mesh, args.settle) for _ in range(args.runs)]
    doc = {
        "benchmark": "agent-footprint",
        "setup": {"command": "anex-agent daemon", "engine": runs[0]["engine"], "telemetry": "on (default)",
                  "runs": args.runs, "settle_s": args.settle, "cpus": os.cpu_count()},
        "median": {
            "start_to_first_proxied_answer_s": statistics.median(r["start_to_first_proxied_answer_s"] for r in runs),
            "agent_rss_mb": statistics.median(r["agent_rss_mb"] for r in runs),
            "agent_private_mb": statistics.median(r["agent_private_mb"] for r in runs),
            "wireguard_go_rss_mb": statistics.median(r["wireguard_go_rss_mb"] or 0 for r in runs),
        },
        "runs": runs,
        "goal": "agent_rss_mb <= 60, start_to_first_proxied_answer_s <= 1",
        "seconds": round(time.monotonic() - started, 1),
    }
    print(json.dumps(doc, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
