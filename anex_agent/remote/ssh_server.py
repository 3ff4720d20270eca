"""The agent's SSH server on asyncssh: the connection, authentication by coordinator certificates,
and the channels a client may open (docs/remote-access.md). What a session runs is
:mod:`.ssh_session`; the plumbing to its process, :mod:`.ssh_process`.

Imported by :class:`~anex_agent.remote.ssh_access.LazySshProtocol` on the first connection only.

Authentication: a user certificate signed by one of the CA keys the coordinator named, for the
user name equal to this node's id (its only principal), within its validity, whose serial is
not revoked. Plain keys, passwords, keyboard-interactive and host-based logins are refused.
The certificate's key id (signed with it) names the serial and the features
(:func:`anex_agent.wire.ssh.user_key_id`): ``pty`` and ``port-forwarding`` are also OpenSSH
certificate extensions, which asyncssh enforces as well; ``sftp`` gates the SFTP subsystem
(and so ``scp``, which uses SFTP).

Channels: a session (exec, shell, or the ``sftp`` subsystem; other subsystems are refused) runs
:func:`.ssh_session.run_session`; direct TCP forwarding (with ``port-forwarding``) reaches this
node's own ports only (loopback or its mesh address), each forward recorded and reported as a
session. No agent forwarding, X11 forwarding, remote forwarding, UNIX sockets or legacy scp.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

import asyncssh

from anex_agent.wire import ssh as ssh_wire
from anex_agent.net.peer_log import peer_text
from anex_agent.remote import ssh_session
if TYPE_CHECKING:  # ssh_access imports this module on the first connection; no cycle at run time
    from anex_agent.remote.ssh_access import SshAccess

log = logging.getLogger(__name__)
if not logging.getLogger("asyncssh").isEnabledFor(logging.DEBUG):  # its INFO lines: one per packet kind
    logging.getLogger("asyncssh").setLevel(logging.WARNING)

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "ip6-localhost"})
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
    to :func:`.ssh_session.run_session` like a command, to be served by a child process in the workload's
    context, instead of asyncssh's SFTP server inside the agent. Other subsystems are refused."""

    def __init__(self, access: SshAccess) -> None:
        super().__init__(lambda process: ssh_session.run_session(access, process), None, 0, False)

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
        log.info("SSH: certificate %d logged in from %s (%s)", conn.serial, ssh_session.peer_of(conn),
                 conn.key_id)

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
        session = ssh_session.record(self.access, conn, "forward", f"{dest_host}:{dest_port}")
        log.info("SSH: certificate %d forwards to port %d", conn.serial, dest_port)
        self.access.report(session)
        return conn.forward_connection(target, dest_port)

    def server_requested(self, listen_host: str, listen_port: int) -> bool:
        return False  # no remote forwarding

    def unix_connection_requested(self, dest_path: str) -> bool:
        return False

    def unix_server_requested(self, listen_path: str) -> bool:
        return False
