"""A real node's connect time through the relay while strangers flood it, against its goal.

Runs the scenario of ``integration/test_relay_flood.py`` (three namespaces: the relay, a
stranger flooding it with clients that upgrade, read the challenge and never answer, and a
node connecting with the agent's own relay client) and reports the node's connect times
quiet and under the flood side by side, in one run. Goal: every connect under the flood
within :data:`integration.test_relay_flood.GOAL_SECONDS` (2 s). Needs root. Prints one JSON
document.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _summary(results: list[dict]) -> dict:
    seconds = sorted(r["seconds"] for r in results)
    if not seconds:
        return {"connects": 0}
    return {"connects": len(seconds), "failed": sum(1 for r in results if not r["ok"]),
            "median_s": round(statistics.median(seconds), 4),
            "p99_s": round(seconds[min(len(seconds) - 1, int(len(seconds) * 0.99))], 4),
            "max_s": round(seconds[-1], 4)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=5000, help="flooding clients (default 5000)")
    parser.add_argument("--seconds", type=float, default=20.0, help="how long the flood lasts (default 20)")
    args = parser.parse_args()
    if args.clients < 1:
        parser.error(f"--clients: {args.clients} is not accepted; give a whole number of at least 1")
    if not args.seconds > 0:  # also refuses nan
        parser.error(f"--seconds: {args.seconds} is not accepted; give a number of seconds above 0")
    if os.geteuid() != 0:
        print(json.dumps({"benchmark": "relay_flood", "skipped": "needs root (network namespaces)"}))
        return 0
    from integration.test_relay_flood import GOAL_SECONDS, run_flood

    run = run_flood(args.clients, args.seconds)
    loaded = _summary(run["loaded"])
    print(json.dumps({
        "benchmark": "relay_flood", "clients": args.clients, "seconds": args.seconds,
        "quiet": _summary(run["quiet"]), "flood": loaded, "flood_counts": run["flood"], "relay": run["relay"],
        "goal_s": GOAL_SECONDS,
        "goal_met": loaded.get("failed", 1) == 0 and loaded.get("max_s", GOAL_SECONDS + 1) <= GOAL_SECONDS,
    }, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
