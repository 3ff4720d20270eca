"""What one SSH session runs in the workload's context, and what is recorded of it
(docs/remote-access.md).

Contract: :func:`run_session` serves one session channel :mod:`.ssh_server` accepted, until it ends:

* exec a command (``$SHELL -c COMMAND``) or a login shell (``$SHELL -l``; the account's shell,
  else ``/bin/sh``), with or without a PTY (:func:`.ssh_process.run_pty`,
  :func:`.ssh_process.run_pipes`: the client's terminal modes, window size changes, signals and
  the exit status or signal go through), as the workload's account, with its environment (no
  ``ANEX_*`` secrets; ``HOME``, ``USER``, ``LOGNAME``, ``SHELL``, ``SSH_CONNECTION``, and ``TERM``
  with a PTY, set) and working directory (:meth:`~anex_agent.remote.ssh_access.SshAccess.context`);
* the ``sftp`` subsystem, when the certificate allows ``sftp``: a child process in the same
  context (OpenSSH's ``sftp-server`` or asyncssh's, :mod:`.ssh_sftp`), so files are read and
  written as the workload's account, relative paths from its directory.

Every session (and every port forward: :func:`record`) is a :class:`~anex_agent.wire.ssh.SshSession`
reported (:meth:`~anex_agent.remote.ssh_access.SshAccess.report`) and logged when it starts and
again when it ends, with its exit status or the signal that ended it, which the client gets too
(a shell that cannot start: status 127; SFTP refused or unable to start: 1).
"""

from __future__ import annotations

import contextlib
import logging
import os
import pwd
import signal
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import asyncssh

from anex_agent.wire import ssh as ssh_wire
from anex_agent.remote import ssh_process
if TYPE_CHECKING:  # ssh_access imports the server on the first connection; no cycle at run time
    from anex_agent.remote.ssh_access import SessionContext, SshAccess

log = logging.getLogger(__name__)


async def run_session(access: SshAccess, process: asyncssh.SSHServerProcess) -> None:
    conn = process.channel.get_connection()
    command = process.command
    if process.subsystem == "sftp":
        await _run_sftp(access, process)
        return
    context = access.context()
    shell = _shell(context)
    argv = [shell, "-c", command] if command is not None else [shell, "-l"]
    env = dict(context.env)
    if context.account is not None:
        env.update(HOME=context.account.home, USER=context.account.name, LOGNAME=context.account.name)
    env["SHELL"] = shell
    peer = conn.get_extra_info("peername") or ("", 0)
    env["SSH_CONNECTION"] = f"{peer[0]} {peer[1]} {access.address} {access.port}"
    ids: dict[str, Any] = {}
    if context.account is not None and context.account.uid != os.geteuid():
        ids = dict(user=context.account.uid, group=context.account.gid, extra_groups=list(context.account.groups))
    session = record(access, conn, "exec" if command is not None else "shell", command or "")
    access.report(session)
    log.info("SSH: certificate %d: %s session %s started%s: %s", conn.serial, session.kind, session.id,
             " with a terminal" if process.term_type else "", command or shell)
    try:
        if process.term_type:
            env["TERM"] = process.term_type
            returncode = await ssh_process.run_pty(process, argv, env, context.cwd, ids)
        else:
            returncode = await ssh_process.run_pipes(process, argv, env, context.cwd, ids)
    except OSError as err:
        log.info("SSH: session %s could not start: %s", session.id, err)
        with contextlib.suppress(Exception):
            process.stderr.write(f"cannot run {shell}: {err.strerror or err}\n".encode())
        returncode = 127
    ended = dict(ended_at=_now())
    if returncode < 0:
        name = signal.Signals(-returncode).name.removeprefix("SIG")
        ended["exit_signal"] = name
        log.info("SSH: session %s ended by signal %s", session.id, name)
        access.report(session.model_copy(update=ended))
        with contextlib.suppress(Exception):
            process.exit_with_signal(name, False, "", "")
        return
    ended["exit_status"] = returncode
    log.info("SSH: session %s ended with status %d", session.id, returncode)
    access.report(session.model_copy(update=ended))
    with contextlib.suppress(Exception):
        process.exit(returncode)


async def _run_sftp(access: SshAccess, process: asyncssh.SSHServerProcess) -> None:
    """The SFTP subsystem: a child process in the workload's context (:mod:`.ssh_sftp`)."""
    from anex_agent.remote import ssh_sftp

    conn = process.channel.get_connection()
    session = record(access, conn, "sftp", "sftp")
    if "sftp" not in conn.features:
        log.info("SSH: certificate %d: SFTP refused: the certificate does not allow SFTP", conn.serial)
        access.report(session.model_copy(update={"ended_at": _now(), "exit_status": 1}))
        with contextlib.suppress(Exception):
            process.stderr.write(b"SFTP is not allowed by this certificate\n")
            process.exit(1)
        return
    child = ssh_sftp.sftp_child(access.context(), str(conn.get_extra_info("client_version") or ""))
    access.report(session)
    log.info("SSH: certificate %d: SFTP session %s started (%s sftp-server)", conn.serial, session.id, child.server)
    try:
        returncode = await ssh_process.run_pipes(process, list(child.argv), child.env, child.cwd, child.ids)
    except OSError as err:
        log.info("SSH: SFTP session %s could not start: %s", session.id, err)
        with contextlib.suppress(Exception):
            process.stderr.write(f"cannot start the SFTP server: {err.strerror or err}\n".encode())
        returncode = 1
    if returncode < 0:
        returncode = 128 - returncode
    log.info("SSH: certificate %d: SFTP session %s ended with status %d", conn.serial, session.id, returncode)
    access.report(session.model_copy(update={"ended_at": _now(), "exit_status": returncode}))
    with contextlib.suppress(Exception):
        process.exit(returncode)


def _shell(context: SessionContext) -> str:
    try:
        shell = pwd.getpwuid(context.account.uid if context.account else os.geteuid()).pw_shell
    except KeyError:
        shell = ""
    if not shell or not os.access(shell, os.X_OK) or shell.endswith(("nologin", "false")):
        shell = "/bin/sh"
    return shell


def record(access: SshAccess, conn, kind: str, command: str) -> ssh_wire.SshSession:
    """A new session of ``kind`` on ``conn`` (its certificate, its peer), started now, not yet ended."""
    return ssh_wire.SshSession(id=access.next_session_id(), serial=conn.serial, key_id=conn.key_id[:128], kind=kind,
                               command=command[:ssh_wire.COMMAND_MAX], peer=peer_of(conn)[:128], started_at=_now())


def peer_of(conn) -> str:
    """``host:port`` of the connection's client, ``?`` when unknown."""
    peer = conn.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def _now() -> datetime:
    return datetime.now(timezone.utc)
