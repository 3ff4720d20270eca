"""Remove what a crashed agent or gateway left behind (``anex-agent cleanup``).

What counts as ours (by name, see :data:`anex_agent.tunnels.base.IFNAME_PREFIX`):

* wireguard-go processes serving an ``anx*`` interface that are orphaned (their parent
  is gone: PPID 1). Live agents' children are left alone. (A normal crash needs no
  help: children get SIGTERM through PR_SET_PDEATHSIG.)
* UAPI sockets ``/var/run/wireguard/anx*.sock`` that nobody listens on.
* ``wireguard`` links named ``anx*`` in this network namespace (kernel engine; a kernel
  link outlives its process). TUN links vanish with their wireguard-go process.
* nftables tables named ``anex_*`` (family inet) in this network namespace.

Run it only when no agent/gateway is running in this namespace: links and tables are
matched by name, not by owner. Returns a list of what was removed (for printing).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable

from anex_agent.tunnels.base import IFNAME_PREFIX
from anex_agent.tunnels.uapi import SOCKET_DIR

NFT_TABLE_PREFIX = "anex_"


def _read_cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return [a.decode("utf-8", "replace") for a in handle.read().split(b"\0") if a]
    except OSError:
        return []


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            return int(handle.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def wireguard_go_ifname(argv: list[str]) -> str | None:
    """The interface a wireguard-go argv serves, or None when it is not wireguard-go. Pure."""
    if not argv or not os.path.basename(argv[0]).startswith("wireguard-go"):
        return None
    names = [a for a in argv[1:] if not a.startswith("-")]
    return names[-1] if names else None


def orphan_wireguard_go(prefix: str = IFNAME_PREFIX) -> list[tuple[int, str]]:
    """(pid, ifname) of orphaned wireguard-go processes serving ``prefix*`` interfaces."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        ifname = wireguard_go_ifname(_read_cmdline(pid))
        if ifname and ifname.startswith(prefix) and _ppid(pid) == 1:
            found.append((pid, ifname))
    return found


def stale_sockets(prefix: str = IFNAME_PREFIX, directory: str = SOCKET_DIR) -> list[str]:
    """UAPI sockets of ours that refuse connections (their process is gone)."""
    stale = []
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    for name in names:
        if not (name.startswith(prefix) and name.endswith(".sock")):
            continue
        path = os.path.join(directory, name)
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            try:
                sock.connect(path)
            except OSError:
                stale.append(path)
    return stale


def nft_tables(prefix: str = NFT_TABLE_PREFIX) -> list[tuple[str, str]]:
    """(family, name) of nftables tables whose name starts with ``prefix``."""
    try:
        out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        return []
    tables = []
    for item in json.loads(out.stdout or "{}").get("nftables", []):
        table = item.get("table")
        if table and table.get("name", "").startswith(prefix):
            tables.append((table["family"], table["name"]))
    return tables


def cleanup(*, prefix: str = IFNAME_PREFIX, nft_prefix: str = NFT_TABLE_PREFIX,
            log: Callable[[str], None] | None = None) -> list[str]:
    """Remove our leftovers (see the module docstring). Never raises for one failed item."""
    from anex_agent.tunnels import netconf

    done: list[str] = []

    def note(text: str) -> None:
        done.append(text)
        if log:
            log(text)

    for pid, ifname in orphan_wireguard_go(prefix):
        try:
            os.kill(pid, signal.SIGTERM)
            note(f"stopped orphaned wireguard-go pid {pid} ({ifname})")
        except ProcessLookupError:
            pass
    if done:
        time.sleep(0.5)  # let them remove their TUN interface and socket
    for path in stale_sockets(prefix):
        try:
            os.unlink(path)
            note(f"removed stale UAPI socket {path}")
        except FileNotFoundError:
            pass
    try:
        links = netconf.list_links(prefix, kind="wireguard")
    except Exception as err:  # netlink unusable (no permission): report, continue
        note(f"could not list interfaces: {err}")
        links = []
    for ifname in links:
        try:
            if netconf.delete_link(ifname):
                note(f"deleted interface {ifname}")
        except Exception as err:
            note(f"could not delete interface {ifname}: {err}")
    for family, name in nft_tables(nft_prefix):
        result = subprocess.run(["nft", "delete", "table", family, name], capture_output=True, text=True)
        note(f"deleted nftables table {family} {name}" if result.returncode == 0
             else f"could not delete nftables table {family} {name}: {result.stderr.strip()}")
    return done
