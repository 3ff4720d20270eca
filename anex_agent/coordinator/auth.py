"""Who is calling: the admin, a node, or a gateway (``Authorization: Bearer <secret>``).

Contract:
* The admin token is compared in constant time. Node and gateway credentials are
  looked up by SHA-256 hash, first in an in-memory cache (the heartbeat hot path
  touches no database), then in the database.
* :meth:`Authenticator.preload` fills the cache with every node's and gateway's
  credentials at start (one paged read), so the first heartbeat of each node after a
  restart costs no query either: a restart is not a cold start. The cache holds one
  compact entry per credential (:class:`Known`: raw 32-byte digest as key, slots); a
  credential it does not know (a node joined through another coordinator) is read
  from the database once.
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

import hmac
import time
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from aiohttp import web

from anex_agent.wire.join import TokenKind
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
    gateway_or_admin = "gateway_or_admin"
    ssh_issuer = "ssh_issuer"  # the admin, or the SSH issuer token (SSH user certificates only)


@dataclass(frozen=True, slots=True)
class Principal:
    kind: str  # "admin" | "node" | "gateway" | "metrics" | "anonymous"
    id: str = ""
    issued_at: float = 0.0  # when the node's or gateway's current credential was issued
    current: bool = True  # False: the caller used its previous credential, within the grace
    credential_hash: str = ""
    grace_open: bool = False  # the current credential was used while the previous one still works


class Known:
    """One credential of a node or gateway this process knows (one per node: kept small).

    ``current``: it is the current credential; ``until`` is then the end of the previous
    one's grace (None: no previous one), else the end of its own grace."""

    __slots__ = ("kind", "id", "issued_at", "current", "until")

    def __init__(self, kind: str, ident: str, issued_at: float, current: bool, until: float | None) -> None:
        self.kind, self.id, self.issued_at, self.current, self.until = kind, ident, issued_at, current, until


_KIND = {"nodes": "node", "gateways": "gateway"}
_COLUMNS = "id, credential_hash, credential_issued_at, created_at, previous_credential_hash, previous_valid_until"
PRELOAD_PAGE = 10_000  # rows per query while preloading


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
    Auth.gateway_or_admin: frozenset({"gateway", "admin"}),
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
        self._metrics_digest = credentials.digest(metrics_token) if metrics_token else None
        self._ssh_issuer_digest = credentials.digest(ssh_issuer_token) if ssh_issuer_token else None
        self._clock = clock
        self._by_hash: dict[bytes, Known] = {}  # raw SHA-256 digest -> what it stands for
        self._by_id: dict[str, bytes | tuple[bytes, bytes]] = {}  # id -> its digest(s) in _by_hash
        self.on_node_loaded: Callable[[str, int], None] | None = None

    def __len__(self) -> int:
        """How many credentials are cached."""
        return len(self._by_hash)

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
        return credentials.same_secret(secret, self._admin_token) or credentials.digest(secret) in self._by_hash

    async def identify(self, secret: str) -> Principal | None:
        if credentials.same_secret(secret, self._admin_token):
            return ADMIN
        digest = credentials.digest(secret)
        if self._metrics_digest is not None and hmac.compare_digest(digest, self._metrics_digest):
            return METRICS
        if self._ssh_issuer_digest is not None and hmac.compare_digest(digest, self._ssh_issuer_digest):
            return SSH_ISSUER
        now = self._clock()
        entry = self._by_hash.get(digest)
        if entry is None:
            if credentials.has_prefix(secret, credentials.NODE_CREDENTIAL):
                table = "nodes"
            elif credentials.has_prefix(secret, credentials.GATEWAY_CREDENTIAL):
                table = "gateways"
            else:
                return None
            entry = await self._load(table, digest, now)
            if entry is None:
                return None
        elif not entry.current and not now < entry.until:  # a replaced credential past its grace
            self._drop(entry.id, digest)
            return None
        until = entry.until
        return Principal(entry.kind, entry.id, issued_at=entry.issued_at, current=entry.current,
                         credential_hash=digest.hex(),
                         grace_open=entry.current and until is not None and until > now)

    async def _load(self, table: str, digest: bytes, now: float) -> Known | None:
        """Read the node or gateway holding ``digest`` (current, or previous within its grace)."""
        columns = f"{_COLUMNS}, config_version" if table == "nodes" else _COLUMNS
        hexdigest = digest.hex()
        row = await self._db.fetchrow(
            f"SELECT {columns} FROM {table} WHERE credential_hash = $1"
            " OR (previous_credential_hash = $1 AND previous_valid_until > $2)",
            hexdigest,
            now,
        )
        if row is None:
            return None
        self._remember(table, row, now)
        return self._by_hash.get(digest)

    def _remember(self, table: str, row: dict, now: float) -> None:
        """Cache the credentials of one ``nodes`` or ``gateways`` row (its previous one only
        while within its grace)."""
        kind, ident = _KIND[table], row["id"]
        issued_at = float(row["credential_issued_at"] or row["created_at"])
        previous, until = row["previous_credential_hash"], row["previous_valid_until"]
        live_previous = previous is not None and until is not None and until > now
        self.forget(ident)
        current = bytes.fromhex(row["credential_hash"])
        self._by_hash[current] = Known(kind, ident, issued_at, True, float(until) if live_previous else None)
        if live_previous:
            old = bytes.fromhex(previous)
            self._by_hash[old] = Known(kind, ident, issued_at, False, float(until))
            self._by_id[ident] = (current, old)
        else:
            self._by_id[ident] = current
        if kind == "node" and self.on_node_loaded is not None:  # one query serves the config-version cache too
            self.on_node_loaded(ident, int(row["config_version"]))

    async def preload(self) -> int:
        """Cache every node's and gateway's credentials (paged reads, in id order); return
        how many rows were read. Call after the change feed has taken its starting
        version, so a change committed meanwhile still reaches :meth:`on_change`."""
        loaded = 0
        for table in ("gateways", "nodes"):
            columns = f"{_COLUMNS}, config_version" if table == "nodes" else _COLUMNS
            after = ""
            while True:
                now = self._clock()
                rows = await self._db.fetch(
                    f"SELECT {columns} FROM {table} WHERE id > $1 ORDER BY id LIMIT {PRELOAD_PAGE}", after)
                for row in rows:
                    self._remember(table, row, now)
                loaded += len(rows)
                if len(rows) < PRELOAD_PAGE:
                    break
                after = rows[-1]["id"]
        return loaded

    def _drop(self, ident: str, digest: bytes) -> None:
        self._by_hash.pop(digest, None)
        held = self._by_id.get(ident)
        if held == digest:
            del self._by_id[ident]
        elif isinstance(held, tuple):
            rest = tuple(d for d in held if d != digest)
            self._by_id[ident] = rest[0] if len(rest) == 1 else rest

    def forget(self, ident: str) -> None:
        held = self._by_id.pop(ident, None)
        if held is None:
            return
        for digest in (held,) if isinstance(held, bytes) else held:
            self._by_hash.pop(digest, None)

    def on_change(self, change: changes.Change) -> None:
        """Change-feed listener: drop revoked credentials (all of them when changes were missed)."""
        if change.scope == changes.Scope.RESYNC:
            self._by_hash.clear()
            self._by_id.clear()
        elif change.target and (change.type in changes.REVOKING or change.scope == changes.Scope.CREDENTIAL_CACHES):
            self.forget(change.target)


async def precheck_join(db: Database, secret: str, kind: str, *, now: float) -> None:
    """Raise the token's 401 (:func:`tokens.lookup`: saying why) unless ``secret`` is an unexpired
    join token of ``kind``.

    A secret without the join-token prefix is refused without any database access; else a
    plain read: SQLite's read-only connection, a pooled PostgreSQL connection; no lock and
    no transaction is held, so a flood of bad tokens never delays a writer."""
    if not credentials.has_prefix(secret, credentials.JOIN_TOKEN):
        raise tokens.unknown()
    await tokens.lookup(db, secret, TokenKind(kind), now=now)
