"""Who is calling: the admin, a node, or a gateway (``Authorization: Bearer <secret>``).

Contract:
* The admin token is compared in constant time. Node and gateway credentials are
  looked up by SHA-256 hash, first in an in-memory cache (the heartbeat hot path
  touches no database), then in the database.
* Every failure is the same 401 problem (:func:`problems.unauthenticated`), whatever
  went wrong. Authorisation (a node asking for another node: 403) is the handler's job.
* The cache forgets a node's or gateway's credentials when the change feed reports
  it ``deleted`` or ``rejoined`` (its credential rotated), in every process.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from anex_agent.coordinator import changes, credentials, problems
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
    kind: str  # "admin" | "node" | "gateway" | "anonymous"
    id: str = ""

    @property
    def is_admin(self) -> bool:
        return self.kind == "admin"


ANONYMOUS = Principal("anonymous")
ADMIN = Principal("admin", "admin")

_ALLOWED: dict[Auth, frozenset[str]] = {
    Auth.admin: frozenset({"admin"}),
    Auth.node: frozenset({"node"}),
    Auth.gateway: frozenset({"gateway"}),
    Auth.node_or_admin: frozenset({"node", "admin"}),
    Auth.node_or_gateway: frozenset({"node", "gateway"}),
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
    def __init__(self, db: Database, admin_token: str) -> None:
        self._db = db
        self._admin_token = admin_token
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

    async def identify(self, secret: str) -> Principal | None:
        if credentials.same_secret(secret, self._admin_token):
            return ADMIN
        digest = credentials.hash_secret(secret)
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
