"""The coordinator's SSH certificate authority: signs node host keys and short-lived user keys.

Where it is kept: ``<state-dir>/ssh-ca-key`` by default (``--ssh-ca-key-file``), base64 of
the 32-byte Ed25519 private key, mode 0600 (a file readable by others is refused), created
on first start. Like the coordinator's other keys (:mod:`.key_file`) its *public* key
is registered in the ``settings`` table by the first coordinator (``ssh_ca_public_key``);
a coordinator started with a different CA refuses to start, naming the file.

Rotation (docs/remote-access.md): start every coordinator with the new key file and
``--ssh-ca-previous 'ssh-ed25519 AAAA...'`` (the old public key). The first one to start
replaces the registered key; the old one stays trusted by nodes for user certificates, and is
listed in the ``known_hosts`` lines, until the flag is dropped (after the host certificates
signed by it expired: :data:`HOST_VALIDITY`).

Signing imports asyncssh on first use; loading and registering the key do not.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path

from anex_agent.coordinator import key_file as registered_key
from anex_agent.coordinator.db import Database
from anex_agent.errors import AnexError, ConfigError

log = logging.getLogger(__name__)

SETTING = "ssh_ca_public_key"
FILE_NAME = "ssh-ca-key"
HOST_VALIDITY = 7 * 86400  # seconds a host certificate is good for; nodes renew after half
CLOCK_SKEW = 60  # seconds a certificate is valid before it was issued (clocks differ a little)


def _string(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def openssh_public(private: bytes) -> str:
    """``ssh-ed25519 <base64>`` of the Ed25519 key whose 32-byte seed is ``private``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

    raw = Ed25519PrivateKey.from_private_bytes(private).public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    return "ssh-ed25519 " + base64.b64encode(_string(b"ssh-ed25519") + _string(raw)).decode()


def key_fields(text: str) -> str:
    """An OpenSSH public key without its comment: ``TYPE BASE64``."""
    return " ".join(text.split()[:2])


KIND = registered_key.RegisteredKey(
    label="SSH CA key",
    algorithm="Ed25519",
    setting=SETTING,
    file_name=FILE_NAME,
    generate=lambda: os.urandom(32),
    public_of=openssh_public,
)


def load_or_create(path: Path) -> bytes:
    """Return the CA's private key at ``path``, creating it (0600) on first use."""
    return registered_key.load_or_create(KIND, path)


async def register(db: Database, private: bytes, *, key_path: Path, previous: tuple[str, ...] = ()) -> str:
    """Record the CA's public key in the database (first one wins); return it.

    A different registered key is a ConfigError naming ``key_path``, unless it is one of
    ``previous`` (a rotation): then ours replaces it."""
    mine = openssh_public(private)
    old = {key_fields(k) for k in previous}
    async with db.transaction() as tx:
        await tx.execute("INSERT INTO settings (name, value) VALUES ($1, $2) ON CONFLICT (name) DO NOTHING",
                         SETTING, mine)
        # for update: of two coordinators rotating away from one key at once, the second reads the
        # first one's key (and refuses to start) instead of replacing it
        registered = await tx.fetchval("SELECT value FROM settings WHERE name = $1 FOR UPDATE", SETTING)
        if registered != mine and key_fields(registered) in old:
            await tx.execute("UPDATE settings SET value = $2 WHERE name = $1", SETTING, mine)
            log.warning("SSH CA rotated: %s replaces %s (still trusted while --ssh-ca-previous names it)",
                        mine, registered)
            registered = mine
    if registered != mine:
        raise ConfigError(
            str(key_path),
            f"this SSH CA key differs from the one the other coordinators on this database use (public key "
            f"{registered}); copy their {FILE_NAME} file here, or name that key with --ssh-ca-previous to rotate",
        )
    return mine


def load_issuer_token(path: Path | None) -> str | None:
    """The SSH issuer token: the first line of ``path`` (mode 0600, 16 characters at least), or None."""
    if path is None:
        return None
    try:
        mode = path.stat().st_mode & 0o777
        token = path.read_text().strip()
    except OSError as err:
        raise ConfigError("--ssh-issuer-token-file", f"cannot read {path}: {err.strerror}") from None
    if mode & 0o077:
        raise ConfigError("--ssh-issuer-token-file", f"{path} has mode {mode:o}; it must be 0600 (chmod 600 {path})")
    if len(token) < 16:
        raise ConfigError("--ssh-issuer-token-file", "the token is too short; use at least 16 random characters")
    return token


def fingerprint(key) -> str:
    """``SHA256:...`` of an asyncssh public key, as ``ssh-keygen -l`` prints it."""
    digest = hashlib.sha256(key.public_data).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class PublicKeyRefused(AnexError, ValueError):
    """The public key given cannot be certified (unreadable, a certificate, or a weak kind)."""


def parse_public_key(text: str):
    """An asyncssh public key from OpenSSH text; :class:`PublicKeyRefused` for anything else."""
    import asyncssh

    try:
        key = asyncssh.import_public_key(text.strip())
    except (asyncssh.KeyImportError, ValueError, TypeError) as err:  # its text stays here: the caller reads ours
        log.debug("a public key that does not import: %s", err)
        raise PublicKeyRefused("not an OpenSSH public key (one line: TYPE BASE64 [COMMENT])") from None
    algorithm = key.get_algorithm()
    if algorithm == "ssh-dss":
        raise PublicKeyRefused("DSA keys are refused; use ed25519, ecdsa or rsa (2048 bits or more)")
    if algorithm == "ssh-rsa" and getattr(key.pyca_key, "key_size", 4096) < 2048:
        raise PublicKeyRefused("RSA keys need 2048 bits or more")
    return key


@dataclass(frozen=True)
class CertificateAuthority:
    """The CA's key (``private``: secret, never shown) and the older public keys still trusted."""

    private: bytes = field(repr=False)
    public: str
    previous: tuple[str, ...] = ()

    @property
    def trusted(self) -> list[str]:
        """CA public keys nodes accept user certificates of, and clients trust host certificates of."""
        return [self.public, *[key_fields(k) for k in self.previous if key_fields(k) != self.public]]

    def known_hosts(self) -> list[str]:
        return [f"@cert-authority * {key}" for key in self.trusted]

    def _signer(self):
        import asyncssh
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
        from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

        pem = Ed25519PrivateKey.from_private_bytes(self.private).private_bytes(
            Encoding.PEM, PrivateFormat.OpenSSH, NoEncryption())
        return asyncssh.import_private_key(pem)

    def sign_user(self, key, *, serial: int, node_id: str, key_id: str, valid_after: float, valid_before: float,
                  features: list[str]) -> str:
        """An OpenSSH user certificate for ``key`` whose only principal is ``node_id``.

        No agent or X11 forwarding, no user rc; ``pty`` and ``port-forwarding`` as asked.
        SFTP (not an OpenSSH extension) is named in the key id the node reads."""
        cert = self._signer().generate_user_certificate(
            key, key_id, serial=serial, principals=[node_id], valid_after=int(valid_after),
            valid_before=int(valid_before), permit_x11_forwarding=False, permit_agent_forwarding=False,
            permit_port_forwarding="port-forwarding" in features, permit_pty="pty" in features,
            permit_user_rc=False, comment=key_id,
        )
        return cert.export_certificate().decode().strip()

    def sign_host(self, key, *, serial: int, principals: list[str], key_id: str, valid_after: float,
                  valid_before: float) -> str:
        cert = self._signer().generate_host_certificate(
            key, key_id, serial=serial, principals=principals, valid_after=int(valid_after),
            valid_before=int(valid_before), comment=key_id,
        )
        return cert.export_certificate().decode().strip()
