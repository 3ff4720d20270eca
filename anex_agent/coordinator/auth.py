"""Who is calling: the admin, a node, or a gateway (``Authorization: Bearer <secret>``).

Contract:
* The admin token is compared in constant time. Node and gateway credentials are
  looked up by SHA-256 hash, first in an in-memory cache (the heartbeat hot path
  touches no database), then in the database.
* Every failure is the same 401 problem (:func:`problems.unauthenticated`), whatever
  went wrong. Authorisation (a node asking for another node: 403) is the handler's job.
* The metrics token (optional) is stored only hashed and identifies the ``metrics``
  principal, which no route but ``/metrics`` accepts.
* :func:`precheck_join` refuses a join token that does not exist, is of another kind or is
  expired on a plain read (no lock, no transaction), before a join or registration takes
  the write lock; the join transaction checks the token again.
* The cache forgets a node's or gateway's credentials when the change feed reports
  it ``deleted`` or ``rejoined`` (its credential rotated), in every process.
"""

from __future__ import annotations

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


@dataclass(frozen=True)
class Principal:
    kind: str  # "admin" | "node" | "gateway" | "metrics" | "anonymous"
    id: str = ""

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


ANONYMOUS = Principal("anonymous")
ADMIN = Principal("admin", "admin")
METRICS = Principal("metrics", "metrics")

_ALLOWED: dict[Auth, frozenset[str]] = {
    Auth.admin: frozenset({"admin"}),
    Auth.node: frozenset({"node"}),
    Auth.gateway: frozenset({"gateway"}),
    Auth.node_or_admin: frozenset({"node", "admin"}),
    Auth.node_or_gateway: frozenset({"node", "gateway"}),
}


def bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


class Authenticator:
    def __init__(self, db: Database, admin_token: str, *, metrics_token: str | None = None) -> None:
        self._db = db
        self._admin_token = admin_token
        self._metrics_hash = credentials.hash_secret(metrics_token) if metrics_token else None
        self._by_hash: dict[str, Principal] = {}
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
        cached = self._by_hash.get(digest)
        if cached is not None:
            return cached
        principal = None
        if credentials.has_prefix(secret, credentials.NODE_CREDENTIAL):
            row = await self._db.fetchrow("SELECT id, config_version FROM nodes WHERE credential_hash = $1", digest)
            principal = Principal("node", row["id"]) if row else None
            if row and self.on_node_loaded is not None:  # one query serves the config-version cache too
                self.on_node_loaded(row["id"], int(row["config_version"]))
        elif credentials.has_prefix(secret, credentials.GATEWAY_CREDENTIAL):
            ident = await self._db.fetchval("SELECT id FROM gateways WHERE credential_hash = $1", digest)
            principal = Principal("gateway", ident) if ident else None
        if principal is not None:
            self._by_hash[digest] = principal
            self._by_id.setdefault(principal.id, set()).add(digest)
        return principal

    def forget(self, ident: str) -> None:
        for digest in self._by_id.pop(ident, set()):
            self._by_hash.pop(digest, None)

    def on_change(self, change: changes.Change) -> None:
        """Change-feed listener: drop revoked credentials (all of them when changes were missed)."""
        if change.scope == changes.RESYNC:
            self._by_hash.clear()
            self._by_id.clear()
        elif change.type in ("deleted", "rejoined") and change.target:
            self.forget(change.target)


async def precheck_join(db: Database, secret: str, kind: str, *, now: float) -> None:
    """Raise the one 401 unless ``secret`` is an unexpired join token of ``kind``.

    A secret without the join-token prefix is refused without any database access; else a
    plain read: SQLite's read-only connection, a pooled PostgreSQL connection; no lock and
    no transaction is held, so a flood of bad tokens never delays a writer."""
    if not credentials.has_prefix(secret, credentials.JOIN_TOKEN):
        raise problems.unauthenticated()
    await tokens.lookup(db, secret, wire.TokenKind(kind), now=now)
