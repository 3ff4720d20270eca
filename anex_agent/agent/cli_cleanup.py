"""``anex-agent cleanup``: remove what a crashed agent or gateway left behind.

Delegates to :func:`anex_agent.tunnels.cleanup.cleanup` (orphaned wireguard-go
processes, stale UAPI sockets, ``anx*`` WireGuard links and ``anex_*`` nftables tables
of this network namespace). Safe to run when nothing is left, so systemd runs it as
``ExecStopPost``. Run it only when no agent or gateway runs in this namespace.
"""

from __future__ import annotations

import argparse


def configure(parser: argparse.ArgumentParser) -> None:
    pass


def main(args: argparse.Namespace) -> int:
    from anex_agent.tunnels.cleanup import cleanup

    removed = cleanup()
    for item in removed:
        print(item)
    if not removed:
        print("nothing to clean up")
    return 0
