"""Gateway failover as the workload sees it: two gateways on one route, the carrying one taken away.

Runs the scenarios of ``integration/test_gateway_failover.py`` on the demo mesh
(:mod:`anex_agent.testing.mesh`): a standby gateway in its own namespace offers the same route;
a node on wireguard-go (root) and one on the built-in user-space engine (no privileges) fetch
a cluster service through the agent's proxy every 0.2 s. The carrying gateway is SIGKILLed
or stopped, with the coordinator up and down; the gap is the time from the kill (from the
end of the stop) to the first answer to a request sent afterwards. And an idle node: its
carrying gateway killed, how long its next request takes. Goal: 3 s for each, median and
maximum reported per engine and event. First, before the standby exists, the scenario of
``integration/test_self_healing.py``: the one gateway SIGKILLed and restarted, with the
coordinator up and down; the figure is the time from the restarted gateway's interface being
up to the workload's first answer (goal 3 s as well). Needs root, wireguard-go and nftables.
Prints one JSON document.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from anex_agent.testing.mesh import Mesh, wait_until  # noqa: E402

GOAL_S = 3.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds per engine and event (default 3)")
    parser.add_argument("--engines", default="wireguard-go,userspace",
                        help="comma-separated: wireguard-go, userspace (default both)")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: {args.rounds} is not accepted; give a whole number of at least 1")
    from integration.conftest import mesh_skip_reason
    from integration.test_gateway_failover import _primary_key, _rounds, figures, idle_rounds
    from integration.test_self_healing import _restart_and_measure

    reason = mesh_skip_reason()
    if reason:
        print(json.dumps({"benchmark": "failover", "skipped": reason}))
        return 0
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = [e for e in engines if e not in ("wireguard-go", "userspace")]
    if unknown:
        parser.error(f"--engines: unknown engine {unknown[0]!r}; accepted: wireguard-go, userspace")
    if "userspace" in engines and shutil.which("setpriv") is None:
        engines.remove("userspace")  # the unprivileged agent needs setpriv (util-linux)
    results = []
    started = time.monotonic()
    # the scenarios print their own lines; stdout carries only the JSON document
    with contextlib.redirect_stdout(sys.stderr), Mesh(Path(tempfile.mkdtemp(prefix="anex-bench-failover-"))) as mesh:
        mesh.build_network()
        mesh.start_coordinator()
        mesh.start_gateway()
        nodes = {}
        for engine in engines:
            node = nodes[engine] = mesh.add_node_namespace()
            env = mesh.agent_env(node, ANEX_PATH="udp", ANEX_ENGINE="auto" if engine == "userspace" else engine)
            mesh.start_agent(node, env, unprivileged=engine == "userspace")
        for engine, node in nodes.items():  # one gateway: restarted, the node heals by itself
            for coordinator_up in (True, False):
                gaps = []
                for _ in range(args.rounds):
                    if not coordinator_up:
                        mesh.stop_coordinator()
                    try:
                        gaps.append(_restart_and_measure(mesh, node, coordinator_up=coordinator_up)[
                            "recovered_after_gateway_back_s"])
                    finally:
                        if not coordinator_up:
                            mesh.start_coordinator()
                            mesh.stop_gateway()  # registered again with the coordinator that is back
                            mesh.start_gateway()
                results.append(figures(engine, "restart, one gateway", coordinator_up, gaps))
        mesh.add_standby_gateway()
        mesh.start_standby()
        for engine, node in nodes.items():
            try:
                wait_until(lambda: len(node.status().get("gateways") or []) == 2, 60,
                           "the node's config listing both gateways", interval=0.3)
                primary = _primary_key(mesh)
                for how in ("kill", "stop"):
                    gaps = _rounds(mesh, node, primary, how=how, coordinator_up=True, rounds=args.rounds)
                    results.append(figures(engine, how, True, gaps))
                mesh.stop_coordinator()
                try:
                    gaps = _rounds(mesh, node, primary, how="kill", coordinator_up=False, rounds=args.rounds)
                    results.append(figures(engine, "kill", False, gaps))
                finally:
                    mesh.start_coordinator()
                mesh.stop_gateway()  # registered again with the coordinator that is back
                mesh.start_gateway()
                took = idle_rounds(mesh, node, primary, rounds=args.rounds)
                results.append(figures(engine, "kill, idle node", True, took))
            finally:
                mesh.stop_agent(node)
        mesh.stop_standby()
    for row in results:
        row["goal_met"] = row["max_s"] <= GOAL_S
    print(json.dumps({"benchmark": "failover", "goal_s": GOAL_S, "rounds": args.rounds, "results": results,
                      "all_goals_met": all(r["goal_met"] for r in results),
                      "elapsed_s": round(time.monotonic() - started, 1)}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
