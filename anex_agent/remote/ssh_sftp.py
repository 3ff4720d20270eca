"""How the agent's SSH server serves an SFTP session: a child process in the workload's
context, speaking SFTP on its standard input and output (docs/remote-access.md).

Contract (:func:`sftp_child`):

* The child runs as the workload's account (``--user``; else the agent's own), in the
  workload's working directory, with the workload's environment (no ``ANEX_*`` secrets): every
  file it reads or writes is checked by the kernel against that account and created as it.
  The agent itself (often root) never touches the files of a session.
* OpenSSH's ``sftp-server`` when the image has one (the first executable of
  :data:`SFTP_SERVER_PATHS`): started with the account's groups, group and user (as the
  workload itself). Else the agent's own Python runs :mod:`.ssh_sftp_child` (asyncssh's SFTP
  server over the pipes), which imports what it needs and then takes the account itself
  before reading a byte from the client.
* Pure: the caller (:mod:`.ssh_server`) starts the process and copies the bytes.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # ssh_access imports the server (and so this module) on the first connection
    from anex_agent.remote.ssh_access import SessionContext

#: where images keep OpenSSH's SFTP server (Debian/Ubuntu, Fedora/RHEL, Alpine, Arch, SUSE)
SFTP_SERVER_PATHS = (
    "/usr/lib/openssh/sftp-server",
    "/usr/libexec/openssh/sftp-server",
    "/usr/lib/ssh/sftp-server",
    "/usr/libexec/sftp-server",
    "/usr/lib/sftp-server",
)

_BOOT = ("import sys; sys.path.insert(0, sys.argv[1]); "
         "from anex_agent.remote.ssh_sftp_child import main; sys.exit(main(sys.argv[2:]))")


@dataclass(frozen=True)
class SftpChild:
    """A process to start for one SFTP session: ``ids`` are the ``user``/``group``/``extra_groups``
    arguments of :func:`asyncio.create_subprocess_exec` (empty: the child takes them itself)."""

    argv: tuple[str, ...]
    env: dict[str, str] = field(repr=False)
    cwd: str
    ids: dict[str, object]
    server: str  # "openssh" or "asyncssh", for the logs


def find_sftp_server(paths: tuple[str, ...] | None = None) -> str | None:
    """The first executable OpenSSH ``sftp-server`` of ``paths`` (:data:`SFTP_SERVER_PATHS`), or None."""
    for path in SFTP_SERVER_PATHS if paths is None else paths:
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def sftp_child(context: SessionContext, client_version: str = "", *,
               paths: tuple[str, ...] | None = None) -> SftpChild:
    """The SFTP server process for a session in ``context`` (see the module's contract)."""
    env = dict(context.env)
    account = context.account
    if account is not None:
        env.update(HOME=account.home, USER=account.name, LOGNAME=account.name)
        uid, gid, groups = account.uid, account.gid, tuple(account.groups)
    else:
        uid, gid, groups = os.geteuid(), os.getegid(), tuple(os.getgroups())
    server = find_sftp_server(paths)
    if server is not None:
        ids: dict[str, object] = {}
        if account is not None and account.uid != os.geteuid():
            ids = dict(user=account.uid, group=account.gid, extra_groups=list(account.groups))
        return SftpChild((server,), env, context.cwd, ids, "openssh")
    root = str(Path(__file__).resolve().parents[2])  # the directory holding the anex_agent package
    argv = (sys.executable, "-I", "-c", _BOOT, root, str(uid), str(gid), ",".join(map(str, groups)), context.cwd,
            client_version)
    return SftpChild(argv, env, "/", {}, "asyncssh")
