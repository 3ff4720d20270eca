"""Wire models of remote access over SSH, shared by the coordinator, the agent and ``anex-agent ssh``.

Routes (docs/remote-access.md):
    GET    /v1/ssh/ca                           public     -> SshCa (the ``@cert-authority`` lines)
    POST   /v1/nodes/{id}/ssh-certificates      admin/ssh-issuer SshCertificateRequest -> SshCertificate
    GET    /v1/ssh/certificates                 admin      -> SshCertificateList (the audit)
    POST   /v1/ssh/certificates/{serial}/revoke admin      -> SshCertificateRecord
    POST   /v1/nodes/{id}/ssh-host-certificate  node       SshHostCertificateRequest -> SshHostCertificate
    GET    /v1/nodes/{id}/ssh-revocations       node/admin -> SshRevocations
    POST   /v1/nodes/{id}/ssh-sessions          node       SshSessionReport -> 204
    GET    /v1/ssh/sessions                     admin      -> SshSessionList

Keys and certificates are OpenSSH one-line texts (``ssh-ed25519 AAAA...``,
``ssh-ed25519-cert-v01@openssh.com AAAA...``); only public keys ever travel.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import Field

from anex_agent import parse
from anex_agent.wire.base import Model, ShortText

DEFAULT_PORT = 2222  # the agent's SSH server, on the mesh address only
OPENSSH_KEY_MAX = 16384  # an RSA-16384 public key in OpenSSH text is about 2.8 kB; a certificate a little more
COMMAND_MAX = 1024

#: what a user certificate may allow; the node enforces each (``pty`` and ``port-forwarding`` are
#: also standard OpenSSH certificate extensions)
Feature = Literal["pty", "port-forwarding", "sftp"]
FEATURES: tuple[str, ...] = ("pty", "port-forwarding", "sftp")
OpenSshText = Annotated[str, Field(min_length=1, max_length=OPENSSH_KEY_MAX)]


def user_key_id(serial: int, node_id: str, features: list[str], requested_for: str) -> str:
    """The key id of a user certificate: what the node logs and which features it grants.

    ``anex serial=<n> node=<id> features=pty,port-forwarding,sftp for=<who>``; the node reads
    ``features`` from it (the key id is signed with the rest of the certificate)."""
    who = "".join(c if c.isalnum() or c in "._@-" else "_" for c in requested_for)[:64]
    return f"anex serial={serial} node={node_id} features={','.join(features) or '-'} for={who or '-'}"


def features_of(key_id: str) -> frozenset[str]:
    """The features a key id made by :func:`user_key_id` grants (none for any other key id)."""
    for part in key_id.split():
        if part.startswith("features="):
            return frozenset(f for f in part.removeprefix("features=").split(",") if f and f != "-")
    return frozenset()


def serial_of(key_id: str) -> int:
    """The serial a key id made by :func:`user_key_id` names; 0 for any other key id."""
    for part in key_id.split():
        if part.startswith("serial=") and parse.is_integer(part.removeprefix("serial=")):
            return int(part.removeprefix("serial="))
    return 0


class SshCa(Model):
    public_keys: list[str] = Field(description="the CA public keys nodes and clients trust, the current one first")
    known_hosts: list[str] = Field(description="lines for ~/.ssh/known_hosts: '@cert-authority * <key>'")


class SshCertificateRequest(Model):
    public_key: OpenSshText = Field(description="the user's public key, OpenSSH format (not a certificate)")
    validity: int | None = Field(None, ge=1, description="seconds; default and maximum are the coordinator's settings")
    features: list[Feature] = Field(default_factory=lambda: list(FEATURES), max_length=len(FEATURES))
    requested_for: ShortText = Field("", description="who the certificate is for (a person or tool), for the audit")


class SshCertificate(Model):
    serial: int
    certificate: str = Field(description="OpenSSH user certificate; log in with the node id as the user name")
    node_id: str
    principals: list[str]
    address: str = Field(description="the node's mesh address")
    port: int = Field(description="the node's SSH port")
    valid_after: datetime
    valid_before: datetime
    features: list[Feature]
    known_hosts: list[str] = Field(description="'@cert-authority' lines that verify the node's host certificate")


class SshCertificateRecord(Model):
    """One issued certificate, as the audit keeps it."""

    serial: int
    kind: Literal["user", "host"]
    node_id: str
    key_id: str
    principals: list[str]
    fingerprint: str = Field(description="SHA256 fingerprint of the certified public key")
    issued_by: str
    requested_for: str = ""
    issued_at: datetime
    valid_after: datetime
    valid_before: datetime
    features: list[Feature]
    revoked_at: datetime | None = None
    revoked_by: str | None = None


class SshCertificateList(Model):
    certificates: list[SshCertificateRecord]


class SshHostCertificateRequest(Model):
    public_key: OpenSshText = Field(description="the node's SSH host public key, OpenSSH format")


class SshHostCertificate(Model):
    serial: int
    certificate: str
    principals: list[str] = Field(description="the node id and its mesh address")
    valid_before: datetime
    user_ca_keys: list[str] = Field(description="CA keys whose user certificates the node accepts")
    revoked_serials: list[int] = Field(description="revoked user certificates for this node not yet expired")


class SshRevocations(Model):
    user_ca_keys: list[str]
    revoked_serials: list[int]


class SshSession(Model):
    """One SSH session on a node, as the node reports it."""

    id: ShortText = Field(min_length=1, description="the node's id of the session, unique on that node")
    serial: int = Field(ge=0, description="the user certificate's serial")
    key_id: ShortText = ""
    kind: Literal["exec", "shell", "sftp", "subsystem", "forward"]
    command: str = Field("", max_length=COMMAND_MAX)
    peer: ShortText = ""
    started_at: datetime
    ended_at: datetime | None = None
    exit_status: int | None = None
    exit_signal: ShortText | None = None


class SshSessionReport(Model):
    sessions: list[SshSession] = Field(max_length=256)


class SshSessionRecord(Model):
    node_id: str
    session: SshSession


class SshSessionList(Model):
    sessions: list[SshSessionRecord]
