"""Who is calling: the admin, a node, or a gateway (``Authorization: Bearer <secret>``).

Contract:
* The admin token is compared in constant time. Node and gateway credentials are
  looked up by SHA-256 hash, first in an in-memory cache (the heartbeat hot path
  touches no database), then in the database.
* Every failure is the same 401 problem (:func:`problems.unauthenticated`), whatever
  went wrong. Authorisation (a node asking for another node: 403) is the handler's job.
* The metrics token (optional) is stored only hashed and identifies the ``metrics``
  principal, which no route but ``/metrics`` accepts. The SSH issuer token (optional, the
  same way) identifies ``ssh-issuer``, which only :attr:`Auth.ssh_issuer` routes accept.
* :func:`precheck_join` refuses a join token that does not exist, is of another kind or is
  expired on a plain read (no lock, no transaction), before a join or registration takes
  the write lock; the join transaction checks the token again.
* The cache forgets a node's or gateway's credentials when the change feed reports
  it ``deleted`` (also on expiry) or ``rejoined``, or a ``credentials`` change (rotation),
  in every process.
* Rotation: a credential rotated away stays good until ``previous_valid_until`` (the
  grace); the cache remembers that deadline. :class:`Principal` says which credential was
  used (``current``) and when the current one was issued, so the heartbeat can rotate
  without a query.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from anex_agent import wire
from anex_agent.coordinator import changes, credentials, problems, tokens
from anex_agent.coordinator.db import Database


class Auth(str, Enum):
    """Who may call a route."""

    public = "public"  # anyone who can reach the listen address
    join = "join"  # anyone; the join token in the body authenticates
    admin = "admin"
    node = "node"
    gateway = "gateway"
    node_or_admin = "node_or_admin"
    node_or_gateway = "node_or_gateway"
    ssh_issuer = "ssh_issuer"  # the admin, or the SSH issuer token (SSH user certificates only)


@dataclass(frozen=True)
class Principal:
    kind: str  # "admin" | "node" | "gateway" | "metrics" | "anonymous"
    id: str = ""
    issued_at: float = 0.0  # when the node's or gateway's current credential was issued
    current: bool = True  # False: the caller used its previous credential, within the grace
    credential_hash: str = ""
    grace_open: bool = False  # the current credential was used while the previous one still works


ANONYMOUS = Principal("anonymous")
ADMIN = Principal("admin", "admin")
METRICS = Principal("metrics", "metrics")
SSH_ISSUER = Principal("ssh-issuer", "ssh-issuer")

_ALLOWED: dict[Auth, frozenset[str]] = {
    Auth.admin: frozenset({"admin"}),
    Auth.node: frozenset({"node"}),
    Auth.gateway: frozenset({"gateway"}),
    Auth.node_or_admin: frozenset({"node", "admin"}),
    Auth.node_or_gateway: frozenset({"node", "gateway"}),
    Auth.ssh_issuer: frozenset({"admin", "ssh-issuer"}),
}


def bearer(request: web.Request) -> str | None:
    """The bearer secret, or None when there is none or it cannot be one: every token and
    credential is printable ASCII, so other bytes (which aiohttp keeps as surrogates of
    the raw bytes) are an unknown credential, not an error."""
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    value = value.strip()
    if scheme.lower() != "bearer" or not value or not value.isascii() or not value.isprintable():
        return None
    return value


class Authenticator:
    def __init__(
        self, db: Database, admin_token: str, *, metrics_token: str | None = None, clock: Callable[[], float] = time.time,
        ssh_issuer_token: str | None = None,
    ) -> None:
        self._db = db
        self._admin_token = admin_token
        self._metrics_hash = credentials.hash_secret(metrics_token) if metrics_token else None
        self._ssh_issuer_hash = credentials.hash_secret(ssh_issuer_token) if ssh_issuer_token else None
        self._clock = clock
        self._by_hash: dict[str, tuple[Principal, float | None]] = {}  # digest -> (principal, valid until)
        self._by_id: dict[str, set[str]] = {}
        self.on_node_loaded: Callable[[str, int], None] | None = None

    async def authenticate(self, request: web.Request, auth: Auth) -> Principal:
        """Return the caller for a route protected by ``auth``; raise the 401 problem."""
        if auth in (Auth.public, Auth.join):
            return ANONYMOUS
        secret = bearer(request)
        if secret is None:
            raise problems.unauthenticated()
        principal = await self.identify(secret)
        if principal is None or principal.kind not in _ALLOWED[auth]:
            raise problems.unauthenticated()
        return principal

    def known(self, secret: str | None) -> bool:
        """Whether ``secret`` is the admin token or a credential this process has already
        verified (no database access)."""
        if not secret:
            return False
        return credentials.same_secret(secret, self._admin_token) or credentials.hash_secret(secret) in self._by_hash

    async def identify(self, secret: str) -> Principal | None:
        if credentials.same_secret(secret, self._admin_token):
            return ADMIN
        digest = credentials.hash_secret(secret)
        if self._metrics_hash is not None and credentials.same_secret(digest, self._metrics_hash):
            return METRICS
        if self._ssh_issuer_hash is not None and credentials.same_secret(digest, self._ssh_issuer_hash):
            return SSH_ISSUER
        now = self._clock()
        cached = self._by_hash.get(digest)
        if cached is not None:
            principal, until = cached
            if until is None or now < until:
                return principal
            self._by_hash.pop(digest, None)
            return None
        if credentials.has_prefix(secret, credentials.NODE_CREDENTIAL):
            kind, table = "node", "nodes"
        elif credentials.has_prefix(secret, credentials.GATEWAY_CREDENTIAL):
            kind, table = "gateway", "gateways"
        else:
            return None
        row = await self._db.fetchrow(
            f"SELECT * FROM {table} WHERE credential_hash = $1"
            " OR (previous_credential_hash = $1 AND previous_valid_until > $2)",
            digest,
            now,
        )
        if row is None:
            return None
        current = row["credential_hash"] == digest
        previous_until = row["previous_valid_until"]
        principal = Principal(
            kind, row["id"], issued_at=float(row["credential_issued_at"] or row["created_at"]), current=current,
            credential_hash=digest, grace_open=current and previous_until is not None and previous_until > now,
        )
        if kind == "node" and self.on_node_loaded is not None:  # one query serves the config-version cache too
            self.on_node_loaded(row["id"], int(row["config_version"]))
        self._by_hash[digest] = (principal, None if current else float(row["previous_valid_until"]))
        self._by_id.setdefault(principal.id, set()).add(digest)
        return principal

    def forget(self, ident: str) -> None:
        for digest in self._by_id.pop(ident, set()):
            self._by_hash.pop(digest, None)

    def on_change(self, change: changes.Change) -> None:
        """Change-feed listener: drop revoked credentials (all of them when changes were missed)."""
        if change.scope == changes.Scope.RESYNC:
            self._by_hash.clear()
            self._by_id.clear()
        elif change.target and (change.type in changes.REVOKING or change.scope == changes.Scope.CREDENTIAL_CACHES):
            self.forget(change.target)


async def precheck_join(db: Database, secret: str, kind: str, *, now: float) -> None:
    """Raise the one 401 unless ``secret`` is an unexpired join token of ``kind``.

    A secret without the join-token prefix is refused without any database access; else a
    plain read: SQLite's read-only connection, a pooled PostgreSQL connection; no lock and
    no transaction is held, so a flood of bad tokens never delays a writer."""
    if not credentials.has_prefix(secret, credentials.JOIN_TOKEN):
        raise problems.unauthenticated()
    await tokens.lookup(db, secret, wire.TokenKind(kind), now=now)
