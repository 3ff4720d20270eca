"""Remote access to the node: the SSH server's state, its listener on the mesh address, and its
upkeep with the coordinator (docs/remote-access.md).

Contract:
* The host key is made on the node (Ed25519, ``<state-dir>/ssh-host-key``: its seed in base64,
  mode 0600) and certified by the coordinator (:meth:`SshAccess.refresh`:
  ``POST /v1/nodes/{id}/ssh-host-certificate``), which answers with the CA keys whose user
  certificates are accepted and the revoked serials. :meth:`SshAccess.run` renews the host
  certificate after half its life and sends session reports.
* The listener serves only the mesh address, on ``port``: a socket on that address where the
  engine puts it on an interface, else the engine's own inbound path
  (:meth:`~anex_agent.tunnels.engines.base.Engine.serve_on_mesh`). No connection is served before the
  host certificate is there (it is closed at once).
* asyncssh is imported on the first connection (:mod:`.ssh_server`), never before: an agent
  nobody logs into does not pay for it.
* :meth:`SshAccess.revoke` (a watch event) makes the serial refused from the next
  authentication on and closes that certificate's open connections; :meth:`load_revocations`
  replaces the list (start, and after a watch snapshot).
* Sessions (:class:`~anex_agent.wire.ssh.SshSession`) are logged at start and end and sent
  to the coordinator in batches (``POST /v1/nodes/{id}/ssh-sessions``); a failed report is
  kept (up to :data:`REPORT_MAX`) and sent again.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from anex_agent.wire import keys, ssh as ssh_wire
from anex_agent.host.childenv import AccountInfo
from anex_agent.errors import ConfigError, CoordinatorError

log = logging.getLogger(__name__)

HOST_KEY_FILE = "ssh-host-key"
REPORT_EVERY = 5.0  # seconds between session reports
REPORT_MAX = 1000  # sessions kept while the coordinator cannot be reached
RENEW_BEFORE = 3.5 * 86400  # seconds before expiry a host certificate (a week's life) is renewed
RETRY = 30.0  # seconds before asking again for a host certificate that could not be had


@dataclass(frozen=True)
class SessionContext:
    """Where a session runs: the workload's environment (no ``ANEX_*`` secrets), account and directory."""

    env: dict[str, str] = field(repr=False)
    account: AccountInfo | None = None
    cwd: str = "/"


def openssh_public_ed25519(public: bytes) -> str:
    """``ssh-ed25519 AAAA...``: the OpenSSH form of a raw Ed25519 public key (RFC 8709 section 4:
    the string "ssh-ed25519", then the 32-byte key, each as an SSH ``string`` of RFC 4251)."""
    name = b"ssh-ed25519"
    blob = struct.pack(">I", len(name)) + name + struct.pack(">I", len(public)) + public
    return "ssh-ed25519 " + base64.b64encode(blob).decode("ascii")


def load_or_create_host_key(path: Path) -> tuple[bytes, str]:
    """The host key's 32-byte Ed25519 seed and its public key (``ssh-ed25519 ...``); made on first use.

    The file holds the seed in base64 (as the node's WireGuard key file does), mode 0600: reading
    it needs no key-format library, so an agent nobody connects to loads none; the server makes
    the OpenSSH form of the key on the first connection (:mod:`.ssh_server`)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    if path.exists():
        mode = path.stat().st_mode & 0o777
        if mode & 0o077:
            raise ConfigError(str(path), f"SSH host key file has mode {mode:o}; it must be 0600 (chmod 600 {path})")
        seed = keys.decode_key(path.read_text(), what=str(path))
        key = Ed25519PrivateKey.from_private_bytes(seed)
    else:
        key = Ed25519PrivateKey.generate()
        seed = key.private_bytes_raw()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(keys.encode_key(seed) + "\n")
    return seed, openssh_public_ed25519(key.public_key().public_bytes_raw())


class SshAccess:
    """The node's SSH server: keys, trust, revocations, listener and session reports."""

    def __init__(self, state_dir: Path, port: int, context: Callable[[], SessionContext]) -> None:
        self.port = port
        self.context = context
        self.host_key_seed, self.host_public = load_or_create_host_key(state_dir / HOST_KEY_FILE)
        self.host_certificate: str | None = None
        self.host_valid_before = 0.0
        self.node_id = ""
        self.address = ""
        self.user_ca_keys: tuple[str, ...] = ()
        self.revoked: dict[int, float] = {}  # serial -> when it expires anyway
        self.connections: dict[int, set[Any]] = {}  # serial -> open asyncssh connections
        self.options_version = 0  # bumps when keys or trust change: the server rebuilds its options
        self._reports: list[ssh_wire.SshSession] = []
        self._session_counter = 0
        self._server: asyncio.AbstractServer | None = None
        self._where: tuple[str, int] | None = None
        self._engine_served = False

    def status(self) -> dict[str, Any]:
        """For the agent's ``/status``: port, whether the host key is certified and until when,
        how many serials are refused and how many connections are open."""
        return {
            "port": self.port,
            "host_certificate": self.host_certificate is not None,
            "host_certificate_valid_until": int(self.host_valid_before) or None,
            "revoked_serials": len(self.revoked),
            "connections": sum(len(c) for c in self.connections.values()),
        }

    # ---------------------------------------------------------------- coordinator

    async def refresh(self, client, node_id: str, address: str) -> None:
        """Have the host key certified for ``node_id``; adopt the CA keys and revocations."""
        answer = await client.ssh_host_certificate(node_id, self.host_public)
        self.node_id, self.address = node_id, address
        self.host_certificate = answer.certificate
        self.host_valid_before = answer.valid_before.timestamp()
        self.user_ca_keys = tuple(answer.user_ca_keys)
        self.load_revocations(answer.revoked_serials)
        self.options_version += 1
        log.info("SSH: host certificate %d for %s until %s", answer.serial, ", ".join(answer.principals),
                 answer.valid_before.isoformat(timespec="seconds"))

    async def refresh_revocations(self, client) -> None:
        answer = await client.ssh_revocations(self.node_id)
        if tuple(answer.user_ca_keys) != self.user_ca_keys:
            self.user_ca_keys = tuple(answer.user_ca_keys)
            self.options_version += 1
        self.load_revocations(answer.revoked_serials)

    def load_revocations(self, serials: list[int]) -> None:
        far = time.time() + 86400 * 366
        self.revoked = {serial: self.revoked.get(serial, far) for serial in serials}
        for serial in serials:
            self._close_serial(serial)

    def revoke(self, serial: int, valid_before: float) -> None:
        """Refuse ``serial`` from now on; close its open connections."""
        now = time.time()
        self.revoked = {s: until for s, until in self.revoked.items() if until > now}
        self.revoked[serial] = valid_before
        log.info("SSH: certificate %d revoked", serial)
        self._close_serial(serial)

    def is_revoked(self, serial: int) -> bool:
        return serial in self.revoked

    def _close_serial(self, serial: int) -> None:
        for conn in list(self.connections.get(serial, ())):
            log.info("SSH: closing a connection of revoked certificate %d", serial)
            with contextlib.suppress(Exception):
                conn.disconnect(11, "certificate revoked")  # SSH_DISCONNECT_BY_APPLICATION (RFC 4253 §11.1)

    async def run(self, client, identity: Callable[[], tuple[str, str] | None]) -> None:
        """Forever: have the host key certified (again after half its life, or for a new node
        id); send session reports. ``identity()`` is the node's (id, mesh address) or None."""
        next_try = 0.0
        while True:
            now = time.time()
            current = identity()
            due = (not self.node_id or self.host_valid_before - now < RENEW_BEFORE
                   or (current is not None and current != (self.node_id, self.address)))
            if current is not None and due and now >= next_try:
                try:
                    await self.refresh(client, *current)
                except CoordinatorError as err:
                    log.warning("SSH: certifying the host key failed (%s); retrying in %.0f s", err, RETRY)
                    next_try = now + RETRY
            await self.flush_reports(client)
            await asyncio.sleep(1.0 if self.host_certificate is None else REPORT_EVERY)

    async def flush_reports(self, client) -> None:
        if not self._reports or not self.node_id:
            return
        batch, self._reports = self._reports[:256], self._reports[256:]
        try:
            await client.report_ssh_sessions(self.node_id, batch)
        except CoordinatorError as err:
            log.info("SSH: session report not sent (%s); will retry", err)
            self._reports = (batch + self._reports)[-REPORT_MAX:]

    # ---------------------------------------------------------------- sessions

    def next_session_id(self) -> str:
        self._session_counter += 1
        return f"{int(time.time())}-{os.getpid()}-{self._session_counter}"

    def report(self, session: ssh_wire.SshSession) -> None:
        self._reports = (self._reports + [session])[-REPORT_MAX:]

    # ---------------------------------------------------------------- listener

    def protocol_factory(self) -> Callable[[], asyncio.Protocol]:
        return lambda: LazySshProtocol(self)

    async def serve(self, dataplane, address: str) -> None:
        """Listen on ``address`` (the mesh address) at :attr:`port`; follow a changed address."""
        if not dataplane.host_address:
            if not self._engine_served:
                self._engine_served = True
                if await dataplane.serve_on_mesh(self.port, self.protocol_factory()):
                    log.info("SSH server on the mesh address, port %d, through the %s engine", self.port,
                             dataplane.engine_cls.name)
                else:
                    log.info("SSH server: not served (engine %s cannot serve the mesh address)",
                                dataplane.engine_cls.name)
            return
        where = (address, self.port)
        if where == self._where:
            return
        await self.close()
        try:
            self._server = await asyncio.get_running_loop().create_server(
                self.protocol_factory(), host=address, port=self.port, reuse_address=True)
        except OSError as err:
            log.warning("SSH server cannot listen on %s:%d: %s", address, self.port, err.strerror)
            return
        self._where = where
        log.info("SSH server listening on %s:%d (mesh address only; certificates from the coordinator)", *where)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            self._where = None


class LazySshProtocol(asyncio.Protocol):
    """Accepts a connection with plain asyncio and hands it to asyncssh (imported here, once)."""

    def __init__(self, access: SshAccess) -> None:
        self._access = access
        self._inner: asyncio.Protocol | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        if self._access.host_certificate is None:  # not certified yet: nobody could verify us
            log.info("SSH: connection refused, no host certificate yet")
            transport.close()
            return
        from anex_agent.remote import ssh_server

        self._inner = ssh_server.connection(self._access)
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        return self._inner.eof_received() if self._inner is not None else None

    def connection_lost(self, exc: Exception | None) -> None:
        if self._inner is not None:
            self._inner.connection_lost(exc)

    def pause_writing(self) -> None:
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        if self._inner is not None:
            self._inner.resume_writing()
