"""Remove what a crashed agent or gateway left behind (``anex-agent cleanup``).

What counts as ours (by name, see :data:`anex_agent.tunnels.engines.ifnames.IFNAME_PREFIX`):

* wireguard-go processes serving an ``anx*`` interface that are orphaned (their parent
  is gone: PPID 1). Live agents' children are left alone. (A normal crash needs no
  help: children get SIGTERM through PR_SET_PDEATHSIG.)
* UAPI sockets ``/var/run/wireguard/anx*.sock`` that nobody listens on.
* ``wireguard`` links named ``anx*`` in this network namespace (kernel engine; a kernel
  link outlives its process). TUN links vanish with their wireguard-go process.
* nftables tables named ``anex_*`` (family inet) in this network namespace.

Run it only when no agent/gateway is running in this namespace: links and tables are
matched by name, not by owner. Returns a :class:`Cleanup`: what was removed, and what this
process was not permitted to check or remove (an unprivileged user: only root may). A
socket it may not connect to is not judged stale: it is reported as not permitted, never
unlinked.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from anex_agent.tunnels.engines.ifnames import IFNAME_PREFIX
from anex_agent.tunnels.os.uapi import SOCKET_DIR

NFT_TABLE_PREFIX = "anex_"
#: errno values that mean "not permitted", not "not there" or "gone".
DENIED = (errno.EACCES, errno.EPERM)


@dataclass
class Cleanup:
    """What :func:`cleanup` did: ``done`` (one line per item removed or failed) and ``denied``
    (each item it was not permitted to check or remove, named, and left alone)."""

    done: list[str] = field(default_factory=list)
    denied: list[str] = field(default_factory=list)

    def __iter__(self):  # the lines of what was done, as the list this used to be
        return iter(self.done)


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


def stale_sockets(prefix: str = IFNAME_PREFIX, directory: str = SOCKET_DIR,
                  denied: list[str] | None = None) -> list[str]:
    """UAPI sockets of ours that refuse connections (their process is gone).

    A socket this process may not connect to (EACCES/EPERM: another user's, a live one
    included) is not stale: its path goes to ``denied`` instead, when given."""
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
            except FileNotFoundError:
                continue  # gone meanwhile
            except OSError as err:
                if err.errno in DENIED:
                    if denied is not None:
                        denied.append(path)
                    continue
                stale.append(path)
    return stale


def nft_tables(prefix: str = NFT_TABLE_PREFIX) -> list[tuple[str, str]]:
    """(family, name) of nftables tables whose name starts with ``prefix``.

    Raises PermissionError when nft says this process may not list them."""
    try:
        out = subprocess.run(["nft", "-j", "list", "tables"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return []
    if out.returncode != 0:
        if "Operation not permitted" in out.stderr:
            raise PermissionError(errno.EPERM, "Operation not permitted", "nftables")
        return []
    tables = []
    for item in json.loads(out.stdout or "{}").get("nftables", []):
        table = item.get("table")
        if table and table.get("name", "").startswith(prefix):
            tables.append((table["family"], table["name"]))
    return tables


def _is_denied(err: BaseException) -> bool:
    """A permission failure: PermissionError, a netlink error carrying EPERM/EACCES, or an
    EngineError made of one (it keeps the kernel's text)."""
    return (isinstance(err, PermissionError) or getattr(err, "code", None) in DENIED
            or "Operation not permitted" in str(err))


def cleanup(*, prefix: str = IFNAME_PREFIX, nft_prefix: str = NFT_TABLE_PREFIX,
            log: Callable[[str], None] | None = None) -> Cleanup:
    """Remove our leftovers (see the module docstring). Never raises for one failed item."""
    from anex_agent.tunnels.os import netconf

    result = Cleanup()

    def note(text: str) -> None:
        result.done.append(text)
        if log:
            log(text)

    def deny(what: str) -> None:
        result.denied.append(what)
        if log:
            log(f"left alone (permission denied): {what}")

    stopped = False
    for pid, ifname in orphan_wireguard_go(prefix):
        try:
            os.kill(pid, signal.SIGTERM)
            note(f"stopped orphaned wireguard-go pid {pid} ({ifname})")
            stopped = True
        except ProcessLookupError:
            pass
        except PermissionError:
            deny(f"orphaned wireguard-go pid {pid} ({ifname})")
    if stopped:
        time.sleep(0.5)  # let them remove their TUN interface and socket
    unchecked: list[str] = []
    for path in stale_sockets(prefix, denied=unchecked):
        try:
            os.unlink(path)
            note(f"removed stale UAPI socket {path}")
        except FileNotFoundError:
            pass
        except PermissionError:
            deny(f"stale UAPI socket {path}")
    for path in unchecked:
        deny(f"UAPI socket {path} (not checked)")
    try:
        links = netconf.list_links(prefix, kind="wireguard")
    except Exception as err:  # netlink unusable (no permission): report, continue
        if _is_denied(err):
            deny("listing WireGuard interfaces")
        else:
            note(f"could not list interfaces: {err}")
        links = []
    for ifname in links:
        try:
            if netconf.delete_link(ifname):
                note(f"deleted interface {ifname}")
        except Exception as err:
            if _is_denied(err):
                deny(f"interface {ifname}")
            else:
                note(f"could not delete interface {ifname}: {err}")
    try:
        tables = nft_tables(nft_prefix)
    except PermissionError:
        deny("listing nftables tables")
        tables = []
    for family, name in tables:
        done = subprocess.run(["nft", "delete", "table", family, name], capture_output=True, text=True)
        if done.returncode == 0:
            note(f"deleted nftables table {family} {name}")
        elif "Operation not permitted" in done.stderr:
            deny(f"nftables table {family} {name}")
        else:
            note(f"could not delete nftables table {family} {name}: {done.stderr.strip()}")
    return result
