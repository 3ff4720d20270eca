"""``anex-agent detect [--json]``: which WireGuard engines and paths work here, and why not.

The report comes from :func:`anex_agent.tunnels.detect.detect` (the engines' own probes).
The same report is part of ``/status``, of the heartbeat facts and of the join request.
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def detect_report() -> dict[str, Any]:
    """``{"engines": {name: {"supported", "reason"}}, "auto", "udp", "capabilities"}``."""
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
    print(f"{'engine':<{width}}  supported  reason")
    for name, item in rows:
        print(f"{name:<{width}}  {'yes' if item.get('supported') else 'no':<9}  {item.get('reason', '')}")
    print(f"auto picks: {report.get('auto') or 'nothing (no engine works here)'}")
    return 0
