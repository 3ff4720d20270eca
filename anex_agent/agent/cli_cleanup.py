"""``anex-agent cleanup``: remove what a crashed agent or gateway left behind.

Delegates to :func:`anex_agent.tunnels.engines.cleanup.cleanup` (orphaned wireguard-go
processes, stale UAPI sockets, ``anx*`` WireGuard links and ``anex_*`` nftables tables
of this network namespace). Safe to run when nothing is left, so systemd runs it as
``ExecStopPost``. Run it only when no agent or gateway runs in this namespace.

Without the privileges to check or remove something (an unprivileged user: sockets,
processes, interfaces and nftables tables that only root may touch) it leaves that thing
alone, names it, ends with one line saying to run it as root, and exits 1.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    import sys

    from anex_agent.tunnels.engines.cleanup import cleanup

    result = cleanup()
    for item in result.done:
        print(item)
    if result.denied:
        for item in result.denied[1:]:
            print(f"left alone (permission denied): {item}", file=sys.stderr)
        more = f" and {len(result.denied) - 1} more above" if len(result.denied) > 1 else ""
        print(f"anex-agent cleanup: permission denied: {result.denied[0]}{more}: left alone; "
              "run 'anex-agent cleanup' as root", file=sys.stderr)
        return 1
    if not result.done:
        print("nothing to clean up")
    return 0
