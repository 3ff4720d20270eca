"""The agent's SSH server on asyncssh: authentication by coordinator certificates, sessions in the
workload's context, SFTP/scp and local port forwarding (docs/remote-access.md).

Imported by :class:`~anex_agent.remote.ssh_access.LazySshProtocol` on the first connection only.

Authentication: a user certificate signed by one of the CA keys the coordinator named, for the
user name equal to this node's id (its only principal), within its validity, whose serial is
not revoked. Plain keys, passwords, keyboard-interactive and host-based logins are refused.
The certificate's key id (signed with it) names the serial and the features
(:func:`anex_agent.wire.ssh.user_key_id`): ``pty`` and ``port-forwarding`` are also OpenSSH
certificate extensions, which asyncssh enforces as well; ``sftp`` gates the SFTP subsystem
(and so ``scp``, which uses SFTP).

What a session may do: exec a command or a login shell, with or without a PTY (the client's
terminal modes, window size changes, signals and the exit status or signal go through), as the
workload's account, with its environment (no ``ANEX_*`` secrets) and working directory; SFTP in
the same context (a child process: OpenSSH's ``sftp-server`` or asyncssh's, :mod:`.ssh_sftp`),
so files are read and written as the workload's account, relative paths from its directory;
direct TCP forwarding to this node's own ports (loopback or its mesh address). No agent
forwarding, X11 forwarding, remote forwarding or UNIX sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import pwd
import signal
import struct
import termios
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

import asyncssh

from anex_agent.wire import ssh as ssh_wire
from anex_agent.net.peer_log import peer_text
if TYPE_CHECKING:  # ssh_access imports this module on the first connection; no cycle at run time
    from anex_agent.remote.ssh_access import SessionContext, SshAccess

log = logging.getLogger(__name__)
if not logging.getLogger("asyncssh").isEnabledFor(logging.DEBUG):  # its INFO lines: one per packet kind
    logging.getLogger("asyncssh").setLevel(logging.WARNING)

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
DRAIN_AFTER_EXIT = 0.5  # seconds the PTY is still read after the command exited (its last output)
LOGIN_TIMEOUT = 30.0
KEEPALIVE = 30.0

_options: dict[int, tuple[int, asyncssh.SSHServerConnectionOptions]] = {}


def connection(access: SshAccess) -> asyncssh.SSHServerConnection:
    """A server connection protocol for one accepted connection."""
    loop = asyncio.get_running_loop()
    cached = _options.get(id(access))
    if cached is None or cached[0] != access.options_version:
        cached = (access.options_version, _make_options(access, loop))
        _options[id(access)] = cached
    return _Connection(access, loop, cached[1])


def host_key(seed: bytes) -> asyncssh.SSHKey:
    """The asyncssh key of the host key's Ed25519 seed."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    pem = Ed25519PrivateKey.from_private_bytes(seed).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    return asyncssh.import_private_key(pem)


def _make_options(access: SshAccess, loop) -> asyncssh.SSHServerConnectionOptions:
    assert access.host_certificate is not None
    key = host_key(access.host_key_seed)
    cert = asyncssh.import_certificate(access.host_certificate)
    return asyncssh.SSHServerConnectionOptions(
        loop=loop,
        server_factory=lambda: _Server(access),
        server_host_keys=[(key, cert)],
        # no process/session/SFTP factory: _Server.session_requested makes each session a _Process
        allow_scp=False,  # scp uses SFTP (OpenSSH 9); the legacy protocol is not offered
        agent_forwarding=False,
        x11_forwarding=False,
        allow_pty=True,
        line_editor=False,
        encoding=None,
        login_timeout=LOGIN_TIMEOUT,
        keepalive_interval=KEEPALIVE,
    )


def _key_text(key: asyncssh.SSHKey) -> str:
    return " ".join(key.export_public_key().decode().split()[:2])


class _Connection(asyncssh.SSHServerConnection):
    """Adds the serial check (revocations) and keeps the certificate's serial, key id and features."""

    def __init__(self, access: SshAccess, loop, options) -> None:
        super().__init__(loop, options)
        self.access = access
        self.serial = 0
        self.key_id = ""
        self.features: frozenset[str] = frozenset()

    async def _validate_openssh_certificate(self, username: str, cert) -> Any:
        serial, key_id = getattr(cert, "_serial", None), getattr(cert, "_key_id", None)
        if not isinstance(serial, int) or not isinstance(key_id, str):  # an asyncssh we do not know: fail closed
            log.error("SSH: cannot read certificate serials with this asyncssh version; refusing")
            return None
        if self.access.is_revoked(serial):
            log.info("SSH: refused revoked certificate %d (%s) from %s", serial, peer_text(key_id), self._peer_addr)
            return None
        key = await super()._validate_openssh_certificate(username, cert)
        if key is None:
            log.info("SSH: refused certificate %d (%s) for user %s from %s", serial, peer_text(key_id), peer_text(username),
                     self._peer_addr)
            return None
        self.serial, self.key_id, self.features = serial, key_id, ssh_wire.features_of(key_id)
        return key


class _Process(asyncssh.SSHServerProcess):
    """asyncssh's server process (exec, shell), which also takes the ``sftp`` subsystem: it goes
    to :func:`_run_session` like a command, to be served by a child process in the workload's
    context, instead of asyncssh's SFTP server inside the agent. Other subsystems are refused."""

    def __init__(self, access: SshAccess) -> None:
        super().__init__(lambda process: _run_session(access, process), None, 0, False)

    def subsystem_requested(self, subsystem: str) -> bool:
        return subsystem == "sftp"

    def session_started(self) -> None:
        chan = self._chan
        if chan.get_subsystem() != "sftp":
            super().session_started()
            return
        from asyncssh.constants import EXTENDED_DATA_STDERR

        chan.set_encoding(None)
        stdin = asyncssh.SSHReader(self, chan)
        stdout, stderr = asyncssh.SSHWriter(self, chan), asyncssh.SSHWriter(self, chan, EXTENDED_DATA_STDERR)
        chan.get_connection().create_task(self._start_process(stdin, stdout, stderr), stdin.logger)


class _Server(asyncssh.SSHServer):
    def __init__(self, access: SshAccess) -> None:
        self.access = access
        self.conn: _Connection | None = None

    def connection_made(self, conn) -> None:
        self.conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        if self.conn is not None and self.conn.serial:
            self.access.connections.get(self.conn.serial, set()).discard(self.conn)

    def begin_auth(self, username: str) -> bool:
        return True

    def session_requested(self) -> _Process:
        return _Process(self.access)

    def password_auth_supported(self) -> bool:
        return False

    def kbdint_auth_supported(self) -> bool:
        return False

    def host_based_auth_supported(self) -> bool:
        return False

    def public_key_auth_supported(self) -> bool:
        return True

    def validate_public_key(self, username: str, key) -> bool:
        return False  # a key without a certificate from the coordinator proves nothing

    def validate_ca_key(self, username: str, key) -> bool:
        trusted = {" ".join(k.split()[:2]) for k in self.access.user_ca_keys}
        return username == self.access.node_id and _key_text(key) in trusted

    def auth_completed(self) -> None:
        conn = self.conn
        assert conn is not None
        if self.access.is_revoked(conn.serial):  # revoked while the login was under way
            conn.disconnect(11, "certificate revoked")
            return
        self.access.connections.setdefault(conn.serial, set()).add(conn)
        log.info("SSH: certificate %d logged in from %s (%s)", conn.serial, _peer(conn), conn.key_id)

    def connection_requested(self, dest_host: str, dest_port: int, orig_host: str, orig_port: int):
        conn = self.conn
        assert conn is not None
        if "port-forwarding" not in conn.features:
            return False
        if dest_host not in LOCAL_HOSTS and dest_host != self.access.address:
            log.info("SSH: certificate %d: forwarding to %s:%d refused (only this node's ports)", conn.serial,
                     dest_host, dest_port)
            return False
        target = "::1" if dest_host == "::1" else "127.0.0.1"
        session = _record(self.access, conn, "forward", f"{dest_host}:{dest_port}")
        log.info("SSH: certificate %d forwards to port %d", conn.serial, dest_port)
        self.access.report(session)
        return conn.forward_connection(target, dest_port)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwarding

    def unix_connection_requested(self, dest_path: str) -> bool:
        return False

    def unix_server_requested(self, listen_path: str) -> bool:
        return False


def _peer(conn) -> str:
    peer = conn.get_extra_info("peername")
    return f"{peer[0]}:{peer[1]}" if peer else "?"


def _now() -> datetime:
    return datetime.now(timezone.utc)


def _record(access: SshAccess, conn, kind: str, command: str) -> ssh_wire.SshSession:
    return ssh_wire.SshSession(id=access.next_session_id(), serial=conn.serial, key_id=conn.key_id[:128], kind=kind,
                               command=command[:ssh_wire.COMMAND_MAX], peer=_peer(conn)[:128], started_at=_now())


# ---------------------------------------------------------------- SFTP


async def _run_sftp(access: SshAccess, process: asyncssh.SSHServerProcess) -> None:
    """The SFTP subsystem: a child process in the workload's context (:mod:`.ssh_sftp`)."""
    from anex_agent.remote import ssh_sftp

    conn = process.channel.get_connection()
    session = _record(access, conn, "sftp", "sftp")
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
        returncode = await _run_pipes(process, list(child.argv), child.env, child.cwd, child.ids)
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


# ---------------------------------------------------------------- exec and shell


def _shell(context: SessionContext) -> str:
    try:
        shell = pwd.getpwuid(context.account.uid if context.account else os.geteuid()).pw_shell
    except KeyError:
        shell = ""
    if not shell or not os.access(shell, os.X_OK) or shell.endswith(("nologin", "false")):
        shell = "/bin/sh"
    return shell


def _set_size(fd: int, size) -> None:
    width, height, pixwidth, pixheight = (tuple(size) + (0, 0, 0, 0))[:4]
    if width and height:
        fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", height, width, pixwidth, pixheight))


def _signal_of(name: str) -> int | None:
    try:
        return int(signal.Signals["SIG" + name.upper().removeprefix("SIG")])
    except KeyError:
        return None


def _make_controlling_tty() -> None:  # runs in the child, after setsid
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


async def _run_session(access: SshAccess, process: asyncssh.SSHServerProcess) -> None:
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
    session = _record(access, conn, "exec" if command is not None else "shell", command or "")
    access.report(session)
    log.info("SSH: certificate %d: %s session %s started%s: %s", conn.serial, session.kind, session.id,
             " with a terminal" if process.term_type else "", command or shell)
    try:
        if process.term_type:
            env["TERM"] = process.term_type
            returncode = await _run_pty(process, argv, env, context.cwd, ids)
        else:
            returncode = await _run_pipes(process, argv, env, context.cwd, ids)
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


async def _hang_up_on_close(process, proc: asyncio.subprocess.Process) -> None:
    """The client went away: the command's process group gets SIGHUP (as with sshd)."""
    await process.channel.wait_closed()
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGHUP)


async def _feed(process, proc: asyncio.subprocess.Process, write, close, resize) -> None:
    """Client to command: data, EOF, window size changes, signals."""
    while True:
        try:
            data = await process.stdin.read(65536)
        except asyncssh.TerminalSizeChanged as change:
            resize((change.width, change.height, change.pixwidth, change.pixheight))
            continue
        except asyncssh.SignalReceived as received:
            signum = _signal_of(received.signal)
            if signum is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signum)
            continue
        except asyncssh.BreakReceived:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            continue
        except (asyncssh.Error, ConnectionError, OSError):
            break
        if not data:
            break
        await write(data)
    close()


async def _run_pipes(process, argv, env, cwd, ids) -> int:
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env=env, cwd=cwd, start_new_session=True, **ids)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None

    async def write(data: bytes) -> None:
        try:
            proc.stdin.write(data)
            await proc.stdin.drain()
        except (BrokenPipeError, ConnectionResetError):
            pass

    def close() -> None:
        with contextlib.suppress(Exception):
            proc.stdin.close()

    async def copy(source: asyncio.StreamReader, sink) -> None:
        while data := await source.read(65536):
            try:
                sink.write(data)
                await sink.drain()
            except (asyncssh.Error, ConnectionError, BrokenPipeError):
                return

    feeder = asyncio.create_task(_feed(process, proc, write, close, lambda size: None), name="ssh-session-stdin")
    hangup = asyncio.create_task(_hang_up_on_close(process, proc), name="ssh-session-hangup")
    try:
        await asyncio.gather(copy(proc.stdout, process.stdout), copy(proc.stderr, process.stderr))
        return await proc.wait()
    finally:
        for task in (feeder, hangup):
            task.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
            await proc.wait()


async def _run_pty(process, argv, env, cwd, ids) -> int:
    from anex_agent.remote import ssh_pty

    master, slave = os.openpty()
    try:
        _set_size(master, process.term_size)
        if not ssh_pty.apply_modes(slave, process.term_modes):
            log.info("SSH: the terminal refused the client's terminal modes; keeping its defaults")
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=slave, stdout=slave, stderr=slave, env=env, cwd=cwd, start_new_session=True,
            preexec_fn=_make_controlling_tty, **ids)
    except BaseException:
        os.close(master)
        raise
    finally:
        os.close(slave)
    os.set_blocking(master, False)
    loop = asyncio.get_running_loop()

    async def wait_fd(add, remove) -> None:
        ready = loop.create_future()
        add(master, lambda: ready.done() or ready.set_result(None))
        try:
            await ready
        finally:
            remove(master)

    async def write(data: bytes) -> None:
        view = memoryview(data)
        while view:
            try:
                view = view[os.write(master, view):]
            except BlockingIOError:
                await wait_fd(loop.add_writer, loop.remove_writer)
            except OSError:
                return

    async def pump_out() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except BlockingIOError:
                await wait_fd(loop.add_reader, loop.remove_reader)
                continue
            except OSError:  # EIO: every holder of the terminal closed it
                return
            if not data:
                return
            try:
                process.stdout.write(data)
                await process.stdout.drain()
            except (asyncssh.Error, ConnectionError, BrokenPipeError):
                return

    feeder = asyncio.create_task(_feed(process, proc, write, lambda: None, lambda size: _set_size(master, size)),
                                 name="ssh-session-stdin")
    hangup = asyncio.create_task(_hang_up_on_close(process, proc), name="ssh-session-hangup")
    output = asyncio.create_task(pump_out(), name="ssh-session-pty")
    try:
        returncode = await proc.wait()
        with contextlib.suppress(TimeoutError):  # its last output; a background child may keep the terminal
            await asyncio.wait_for(asyncio.shield(output), DRAIN_AFTER_EXIT)
        return returncode
    finally:
        for task in (feeder, hangup, output):
            task.cancel()
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGHUP)
            await proc.wait()
        os.close(master)
