"""Join tokens: created by an admin, shown once, stored hashed, limited in uses, time and providers.

Contract:
* :func:`create` returns the secret once; only its SHA-256 is stored.
* Limits: ``max_uses`` (how many distinct nodes or gateways the token admits; default 1,
  ``NULL`` = no limit, which is what ``reusable: true`` without ``max_uses`` means), the
  expiry, and for node tokens ``providers`` (the providers a joining node may name).
* A node or gateway the token already admitted may present it again (a restarted agent whose
  token is baked into its environment re-joins) without using it up again; any other join
  uses one use.
* :func:`lookup` and :func:`check_unused_or_owner` run before any work and refuse a token that
  is unknown, of another kind, expired, or used up for a caller it never admitted.
  :func:`redeem` runs at the end of the join transaction and is authoritative: it counts the
  use with one conditional update (``uses = uses + 1 ... WHERE uses < max_uses``), so
  concurrent joins, also on several coordinators sharing PostgreSQL, never exceed
  ``max_uses``; and it checks the provider the joined node was written with.
* A failure of the token itself is a 401 that says why (:func:`problems.join_token_refused`,
  ``errors[0].field == "token"``): ``unknown`` (never issued, or revoked: no more is said),
  ``kind`` (a node token at the gateway registration or the reverse), ``expired``, or
  ``used_up``. Only the holder of a real token learns which, and only about that token (see
  that function for why this gives a stranger nothing). A node token naming a provider it
  does not allow is a 403 naming ``provider`` (the caller holds the token, so it learns
  nothing it did not know).
"""

from __future__ import annotations

import json
from datetime import datetime, timezone

from anex_agent.wire.join import JoinTokenCreate, JoinTokenCreated, JoinTokenList, JoinTokenView, TokenKind
from anex_agent.coordinator import credentials, problems
from anex_agent.coordinator.db import Conn


def to_datetime(ts: float | None) -> datetime | None:
    return None if ts is None else datetime.fromtimestamp(ts, tz=timezone.utc)


def _invalid(field: str, message: str) -> problems.Problem:
    return problems.Problem(
        422, "Unprocessable Content", f"invalid body: check {field}", slug="validation",
        errors=[{"field": field, "message": message}],
    )


def effective_max_uses(request: JoinTokenCreate) -> int | None:
    """``max_uses`` when given; else 1, or None (no limit) with ``reusable: true``; 422 on a contradiction."""
    if request.max_uses is not None:
        if request.reusable and request.max_uses == 1:
            raise _invalid("max_uses", "reusable: true needs max_uses above 1 (or no max_uses: no limit)")
        return request.max_uses
    return None if request.reusable else 1


async def create(tx: Conn, request: JoinTokenCreate, *, now: float) -> JoinTokenCreated:
    if request.providers is not None and request.kind is not TokenKind.node:
        raise _invalid("providers", "only node join tokens can be limited to providers")
    max_uses = effective_max_uses(request)
    providers = sorted({p.value for p in request.providers}) if request.providers is not None else None
    secret = credentials.new_secret(credentials.JOIN_TOKEN)
    token_id = credentials.new_id("jt")
    expires_at = now + request.expires_in
    await tx.execute(
        "INSERT INTO join_tokens (id, token_hash, kind, reusable, labels, created_at, expires_at, max_uses, providers)"
        " VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
        token_id,
        credentials.hash_secret(secret),
        request.kind.value,
        int(max_uses != 1),  # what coordinators without use limits read
        json.dumps(request.labels),
        now,
        expires_at,
        max_uses,
        json.dumps(providers) if providers is not None else None,
    )
    return JoinTokenCreated(
        id=token_id,
        token=secret,
        kind=request.kind,
        reusable=max_uses != 1,
        expires_at=to_datetime(expires_at),
        labels=request.labels,
        max_uses=max_uses,
        providers=providers,
    )


async def create_for_provision(
    tx: Conn, provision_id: str, *, expires_at: float, now: float, labels: dict[str, str],
    providers: list[str] | None = None,
) -> tuple[str, str]:
    """A single-use node join token bound to one provision (``join_tokens.provision_id``,
    a column the provisioning bootstrap adds); returns ``(secret, token id)``. Only its hash is
    stored; the token admits one node (a re-join by that node's key stays possible) until
    ``expires_at``."""
    secret = credentials.new_secret(credentials.JOIN_TOKEN)
    token_id = credentials.new_id("jt")
    await tx.execute(
        "INSERT INTO join_tokens (id, token_hash, kind, reusable, labels, created_at, expires_at, max_uses, providers,"
        " provision_id) VALUES ($1, $2, $3, 0, $4, $5, $6, 1, $7, $8)",
        token_id,
        credentials.hash_secret(secret),
        TokenKind.node.value,
        json.dumps(labels),
        now,
        expires_at,
        json.dumps(sorted(providers)) if providers is not None else None,
        provision_id,
    )
    return secret, token_id


async def lookup(tx: Conn, secret: str, kind: TokenKind, *, now: float) -> dict:
    """The token row for ``secret`` if it exists, is of ``kind`` and not expired; else the 401 saying which."""
    row = await tx.fetchrow("SELECT * FROM join_tokens WHERE token_hash = $1", credentials.hash_secret(secret))
    if row is None:
        raise unknown()
    if row["kind"] != kind.value:
        raise problems.join_token_refused("kind", f"it is a {row['kind']} join token; this needs a {kind.value} "
                                                  "join token")
    if row["expires_at"] <= now:
        expired = to_datetime(row["expires_at"]).strftime("%Y-%m-%d %H:%M:%S UTC")
        raise problems.join_token_refused("expired", f"it expired at {expired}")
    return row


def unknown() -> problems.Problem:
    """The 401 of a secret that is no join token (never issued, revoked, or not even of the form)."""
    return problems.join_token_refused("unknown", "not valid (no such token: never issued, or revoked)")


def _used_up(token: dict) -> bool:
    return token["max_uses"] is not None and token["uses"] >= token["max_uses"]


def used_up() -> problems.Problem:
    return problems.join_token_refused("used_up", "it is used up (it admitted as many nodes or gateways as it "
                                                  "allows; only those may present it again)")


def check_unused_or_owner(token: dict, owner_id: str | None) -> None:
    """Before doing work: a used-up token is only good for a re-join (``owner_id`` = the row
    already holding the key); :func:`redeem` decides whether the token admitted that owner."""
    if owner_id is None and _used_up(token):
        raise used_up()


async def _check_provider(tx: Conn, token: dict, owner_id: str) -> None:
    if token["providers"] is None or token["kind"] != TokenKind.node.value:
        return
    allowed = json.loads(token["providers"])
    provider = await tx.fetchval("SELECT provider FROM nodes WHERE id = $1", owner_id)
    if provider not in allowed:
        raise problems.Problem(
            403, "Forbidden", f"this join token does not allow provider {provider!r}", slug="forbidden",
            errors=[{"field": "provider", "message": f"the join token allows only {', '.join(allowed)}"}],
        )


async def redeem(tx: Conn, token: dict, owner_id: str, *, now: float) -> None:
    """Count the join of ``owner_id`` (inside the join transaction, after its row is written).

    A first join by ``owner_id`` uses one use, atomically: 401 ``used_up`` when none is left (the
    transaction then writes nothing). A re-join by an owner the token already admitted only
    bumps ``use_count``. 403 naming ``provider`` when the node's provider is not allowed."""
    await _check_provider(tx, token, owner_id)
    known = await tx.fetchval(
        "SELECT owner_id FROM join_token_uses WHERE token_id = $1 AND owner_id = $2", token["id"], owner_id
    )
    if known is not None:
        await tx.execute("UPDATE join_tokens SET use_count = use_count + 1 WHERE id = $1", token["id"])
        return
    changed = await tx.execute(
        "UPDATE join_tokens SET uses = uses + 1, use_count = use_count + 1, used_at = COALESCE(used_at, $2),"
        " used_by = COALESCE(used_by, $3) WHERE id = $1 AND (max_uses IS NULL OR uses < max_uses)",
        token["id"],
        now,
        owner_id,
    )
    if changed != 1:
        raise used_up()
    await tx.execute(
        "INSERT INTO join_token_uses (token_id, owner_id, used_at) VALUES ($1, $2, $3)", token["id"], owner_id, now
    )


def view_of(row: dict) -> JoinTokenView:
    return JoinTokenView(
        id=row["id"],
        kind=row["kind"],
        reusable=row["max_uses"] != 1,
        labels=json.loads(row["labels"]),
        created_at=to_datetime(row["created_at"]),
        expires_at=to_datetime(row["expires_at"]),
        used_at=to_datetime(row["used_at"]),
        used_by=row["used_by"],
        use_count=int(row["use_count"]),
        uses=int(row["uses"]),
        max_uses=None if row["max_uses"] is None else int(row["max_uses"]),
        providers=None if row["providers"] is None else json.loads(row["providers"]),
    )


async def list_views(tx: Conn) -> JoinTokenList:
    rows = await tx.fetch("SELECT * FROM join_tokens ORDER BY created_at, id")
    return JoinTokenList(tokens=[view_of(row) for row in rows])


async def revoke(tx: Conn, token_id: str) -> None:
    """Delete a token: it can no longer be used (nodes that joined with it stay)."""
    if await tx.execute("DELETE FROM join_tokens WHERE id = $1", token_id) != 1:
        raise problems.not_found(f"join token {token_id}")
    await tx.execute("DELETE FROM join_token_uses WHERE token_id = $1", token_id)

