"""``anex-agent detect [--json]``: which WireGuard engines and paths work here, and why not.

The report comes from :func:`anex_agent.tunnels.detect.detect` (the engines' own probes).
The same report is part of ``/status``, of the heartbeat facts and of the join request.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def detect_report() -> dict[str, Any]:
    """``{"engines": {name: {"supported", "reason", "serves_workload", "workload_reason"}}, "auto",
    "auto_skipped", "udp", "capabilities"}``."""
    from anex_agent.tunnels.detect import detect

    return detect().to_dict()


def configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def main(args: argparse.Namespace) -> int:
    report = detect_report()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
        return 0
    rows = [(name, item) for name, item in report.get("engines", {}).items()]
    rows.append(("path: udp", report.get("udp", {})))
    width = max(len(name) for name, _ in rows)
    print(f"{'engine':<{width}}  supported  workload  reason")
    for name, item in rows:
        serves = item.get("serves_workload")
        workload = "-" if serves is None else ("yes" if serves else "no")
        reason = item.get("reason", "")
        if serves is False:
            reason += f"; workload: {item.get('workload_reason', '')}"
        print(f"{name:<{width}}  {'yes' if item.get('supported') else 'no':<9}  {workload:<8}  {reason}")
    for name, why in (report.get("auto_skipped") or {}).items():
        print(f"auto skips {name}: {why}")
    print(f"auto picks: {report.get('auto') or 'nothing (no engine here can serve the workload)'}")
    return 0
